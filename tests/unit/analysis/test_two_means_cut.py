"""The exact 1-D two-means split that replaced scikit-learn's KMeans in early_traffic."""

import numpy as np
import pytest

from rankscope.analysis.fabric.link_evidence import two_means_cut


def _sse(x, cut):
    a, b = x[x < cut], x[x >= cut]
    return ((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()


@pytest.mark.parametrize("seed", range(30))
def test_split_is_never_worse_than_kmeans(seed):
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 60))
    x = np.concatenate([rng.normal(0, 1, n), rng.normal(rng.uniform(0, 8), rng.uniform(0.2, 2), n)]) * 1e9
    cut = two_means_cut(x)
    lab = KMeans(n_clusters=2, n_init=4, random_state=0).fit(x.reshape(-1, 1)).labels_
    km_sse = sum(((x[lab == k] - x[lab == k].mean()) ** 2).sum() for k in (0, 1))
    assert _sse(x, cut) <= km_sse * (1 + 1e-9)


def test_clear_gap_in_nanoseconds_is_found():
    early = 1_700_000_000_000_000_000 + np.array([0, 5, 9, 12]) * 1_000
    late = early[0] + 2_000_000_000 + np.array([0, 3, 7]) * 1_000
    x = np.concatenate([early, late]).astype(float)
    cut = two_means_cut(x)
    assert early.max() < cut < late.min()


def test_equal_values_have_no_cut():
    assert two_means_cut(np.full(5, 3.0)) == float("inf")
    # never splits a run of equal values
    x = np.array([1.0, 1.0, 1.0, 5.0, 5.0])
    assert 1.0 < two_means_cut(x) < 5.0
