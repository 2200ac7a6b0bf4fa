"""strategy.pipelines.components (a union-find, no scipy import) equals scipy's connected components."""
import random
from collections import defaultdict

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from rankscope.analysis.strategy.pipelines import components


def _scipy_components(nodes, edges):
    idx = {n: i for i, n in enumerate(nodes)}
    if not edges:
        return [[n] for n in nodes]
    a = np.array([idx[u] for u, _ in edges])
    b = np.array([idx[v] for _, v in edges])
    _, labels = connected_components(coo_matrix((np.ones(len(a)), (a, b)), shape=(len(nodes),) * 2), directed=False)
    comps = defaultdict(list)
    for n, lab in zip(nodes, labels, strict=True):
        comps[lab].append(n)
    return sorted((sorted(c) for c in comps.values()), key=lambda c: c[0])


def test_components_equal_scipy_on_random_graphs():
    rnd = random.Random(0)
    for _ in range(500):
        nodes = rnd.sample(range(1000), rnd.randint(1, 60))
        edges = [(rnd.choice(nodes), rnd.choice(nodes)) for _ in range(rnd.randint(0, 80))]
        assert components(nodes, edges) == _scipy_components(nodes, edges)


def test_a_long_chain_is_one_component():
    nodes = list(range(5000))
    assert components(nodes, [(i + 1, i) for i in range(4999)]) == [nodes]
