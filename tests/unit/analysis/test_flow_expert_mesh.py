"""Expert parallelism from flows: all-to-all meshes inside DP groups set apart before the grid is fit."""

import numpy as np

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.grid import fit_grid
from tests.unit.analysis.flow_records import directed_edges, endpoints


def _addr(stage, d):
    return f"10.{stage}.0.{d + 1}"


def moe_edges(dp=12, ep=3, pp=2, ring=True, expert_rings=True, seed=0):
    """Heavy links of a DP x PP job whose DP groups hold EP meshes of ``ep`` consecutive DP ranks: a dense
    ring over each DP group (one way, 17 GB), the mesh (7 GB x U(0.9, 1.1) each way, as summed over a
    step's varying dispatches), expert rings over the same index of every mesh (one way, 22 GB) and
    pipeline links (4.9 GB each way, gradients 170 ms after activations)."""
    rng = np.random.default_rng(seed)
    d: dict[tuple[str, str], list[float]] = {}

    def add(x, y, b):
        k = (x, y) if x < y else (y, x)
        v = d.setdefault(k, [0.0, 0.0])
        v[0 if k == (x, y) else 1] += b

    for s in range(pp):
        for i in range(dp):
            if ring:
                add(_addr(s, i), _addr(s, (i + 1) % dp), 17e9)
            if expert_rings and dp // ep > 2:
                add(_addr(s, i), _addr(s, (i + ep) % dp), 22e9)
            elif expert_rings and dp // ep == 2:  # a ring of two: payload both ways
                add(_addr(s, i), _addr(s, (i + ep) % dp), 11e9)
            blk = i // ep * ep
            for j in range(blk, blk + ep):
                if j != i:
                    add(_addr(s, i), _addr(s, j), 7e9 * rng.uniform(0.9, 1.1))
            if s + 1 < pp:
                add(_addr(s, i), _addr(s + 1, i), 4.9e9)
                add(_addr(s + 1, i), _addr(s, i), 4.9e9)
    rows = []
    for (a, b), (ab, ba) in d.items():
        pipe = a.split(".")[1] != b.split(".")[1]
        first_ab, first_ba = (0, 170_000_000) if pipe else (0, 0)
        if pipe and a.split(".")[1] > b.split(".")[1]:
            first_ab, first_ba = first_ba, first_ab
        rows.append((a, b, ab, ba, first_ab, first_ba))
    return directed_edges(rows)


def _nodes(e):
    return sorted(endpoints(e), key=lambda x: tuple(int(o) for o in x.split(".")))


def test_meshes_inside_dp_groups_are_expert_parallel_and_dp_stays_whole():
    e = moe_edges(dp=12, ep=3, pp=2)
    fit = fit_grid(_nodes(e), e, FlowConfig())
    assert fit.valid, fit.notes
    want_dp = sorted(sorted(_addr(s, i) for i in range(12)) for s in range(2))
    assert sorted(map(sorted, fit.dp_groups)) == want_dp
    assert sorted(map(sorted, fit.pipelines)) == sorted(sorted([_addr(0, i), _addr(1, i)]) for i in range(12))
    want_ep = sorted(sorted(_addr(s, b * 3 + x) for x in range(3)) for s in range(2) for b in range(4))
    assert sorted(map(sorted, fit.ep_groups)) == want_ep
    want_edp = sorted(sorted(_addr(s, b * 3 + x) for b in range(4)) for s in range(2) for x in range(3))
    assert sorted(map(sorted, fit.expert_dp_groups)) == want_edp
    # the mesh's own links are neither DP nor PP; the links it shares with the dense ring stay DP
    assert fit.mesh_only is not None and len(fit.mesh_only) == e.height and fit.mesh_only.sum() == 2 * 4 * 1
    assert not (fit.mesh_only & fit.is_pp).any()


def test_without_a_mesh_nothing_changes():
    e = moe_edges(dp=8, ep=1, pp=2, expert_rings=False)
    fit = fit_grid(_nodes(e), e, FlowConfig())
    assert fit.valid and fit.ep_groups == [] and fit.mesh_only is None and fit.ep_undecided == ""
    assert sorted(map(len, fit.dp_groups)) == [8, 8]


def test_a_mesh_as_large_as_its_dp_group_is_undecided():
    # every DP group is one full mesh and nothing else: an all-to-all collective of DP, or EP = DP
    e = moe_edges(dp=4, ep=4, pp=2, ring=False, expert_rings=False)
    fit = fit_grid(_nodes(e), e, FlowConfig())
    assert fit.valid and fit.ep_groups == []
    assert sorted(map(len, fit.dp_groups)) == [4, 4]
    assert "cannot tell" in fit.ep_undecided


def test_expert_pairs_are_told_from_pipeline_links_only_when_nothing_else_fits():
    # dp 6 = ep 3 x expert-DP 2: the expert-DP groups are pairs, sending both ways like pipeline links
    e = moe_edges(dp=6, ep=3, pp=1)
    fit = fit_grid(_nodes(e), e, FlowConfig())
    assert fit.valid and sorted(map(len, fit.dp_groups)) == [6]
    assert sorted(map(len, fit.ep_groups)) == [3, 3] and sorted(map(len, fit.expert_dp_groups)) == [2, 2, 2]
    # with a pipeline too, the pairs and the pipeline links (no lag seen) are both two-way links between
    # meshes: no reading may claim a wrong grid
    e = moe_edges(dp=6, ep=3, pp=2).with_columns(first_ab=0, first_ba=0)
    fit = fit_grid(_nodes(e), e, FlowConfig())
    if fit.valid:
        assert sorted(map(len, fit.dp_groups)) == [6, 6] and sorted(map(len, fit.pipelines)) == [2] * 6
