"""Link evidence for the grid fit: unresolved lags are no vote, open paths are pipelines on a tie."""

import numpy as np
import polars as pl

from rankscope.analysis.flow_groups import fit_grid, pp_likeness
from rankscope.analysis.flow_link_evidence import (
    clock_tick_ns,
    mixed_pipelines,
    neutral_unresolved_lag,
    single_tree_groups,
)

MS = 1_000_000
T0 = 1_764_000_000_000 * MS  # a millisecond-resolution exporter clock


def edges(links, lag_ns=0, sym=0.97, nbytes=1e6):
    """Undirected edge table as flow_features.undirected_edges gives it."""
    rows = [dict(a=a, b=b, bytes=nbytes, bytes_ab=nbytes / 2, bytes_ba=nbytes / 2 * sym, symmetry=sym,
                 first_ab=T0 + 7 * MS * i, first_ba=T0 + 7 * MS * i + lag_ns, num_records=4)
            for i, (a, b) in enumerate(links)]
    return pl.DataFrame(rows)


def test_clock_tick_from_timestamps():
    assert clock_tick_ns(np.array([T0, T0 + 3 * MS])) == MS
    assert clock_tick_ns(np.array([T0 + 1, T0 + 5])) == 1
    assert clock_tick_ns(np.array([])) == 1


def test_symmetric_link_without_a_resolvable_lag_is_unknown_not_dp():
    e = edges([("a", "b"), ("b", "c")])
    assert np.allclose(pp_likeness(e), 0.0)  # the old reading: a DP vote
    assert np.allclose(neutral_unresolved_lag(e, pp_likeness(e)), 0.5)


def test_one_way_links_and_resolved_lags_keep_their_score():
    one_way = edges([("a", "b"), ("b", "c")], sym=0.03)
    like = pp_likeness(one_way)
    assert np.allclose(neutral_unresolved_lag(one_way, like), like)
    lagged = pl.concat([edges([("a", "b")], lag_ns=40 * MS), edges([("c", "d")], lag_ns=0)])
    like = pp_likeness(lagged)
    assert like[0] > 0.9
    assert np.allclose(neutral_unresolved_lag(lagged, like), [like[0], 0.5])


def test_single_tree_groups_counts_open_paths_of_three_or_more():
    # nodes 0-1-2-3 path in one group; 4-5 a pair; 6-7-8 a triangle
    da, db = np.array([0, 1, 2, 4, 6, 7, 8]), np.array([1, 2, 3, 5, 7, 8, 6])
    lab = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2])
    assert single_tree_groups(9, da, db, lab) == 1


def test_pure_pipeline_over_tcp_is_pp4_not_dp4():
    # four stages, one address each, links between neighbours only, both directions opening together
    path = [("10.0.0.2", "10.0.0.4"), ("10.0.0.1", "10.0.0.4"), ("10.0.0.1", "10.0.0.3")]
    nodes = sorted({x for link in path for x in link})
    fit = fit_grid(nodes, edges(path))
    assert fit.valid
    assert [len(g) for g in fit.dp_groups] == [1, 1, 1, 1]
    assert len(fit.pipelines) == 1 and sorted(fit.pipelines[0]) == nodes


def test_bidirectional_ring_over_tcp_stays_one_dp_group():
    ring = [("10.0.0.1", "10.0.0.2"), ("10.0.0.2", "10.0.0.3"), ("10.0.0.3", "10.0.0.4"), ("10.0.0.1", "10.0.0.4")]
    fit = fit_grid(sorted({x for link in ring for x in link}), edges(ring))
    assert [len(g) for g in fit.dp_groups] == [4]


def test_two_by_two_grid_over_tcp_is_reported_ambiguous_with_the_swap():
    # DP links (gradients) heavier than PP links (activations); all two-way, no lag: nothing says which is which
    dp = edges([("10.0.0.1", "10.0.0.2"), ("10.0.0.3", "10.0.0.4")], nbytes=4e7)
    pp = edges([("10.0.0.1", "10.0.0.3"), ("10.0.0.2", "10.0.0.4")], nbytes=2e6)
    fit = fit_grid(["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"], pl.concat([dp, pp]))
    assert fit.valid and len(fit.alternatives) == 1
    alt = fit.alternatives[0]
    assert sorted(map(sorted, alt["dp_groups"])) == sorted(map(sorted, fit.pipelines))
    assert sorted(map(sorted, alt["pp_groups"])) == sorted(map(sorted, fit.dp_groups))


def test_a_lagged_grid_is_not_ambiguous():
    dp = edges([("10.0.0.1", "10.0.0.2"), ("10.0.0.3", "10.0.0.4")], nbytes=4e7, sym=0.03)
    pp = edges([("10.0.0.1", "10.0.0.3"), ("10.0.0.2", "10.0.0.4")], nbytes=2e6, lag_ns=30 * MS)
    fit = fit_grid(["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"], pl.concat([dp, pp]))
    assert fit.alternatives == []
    assert sorted(map(sorted, fit.dp_groups)) == [["10.0.0.1", "10.0.0.2"], ["10.0.0.3", "10.0.0.4"]]


def test_mixed_pipelines_counts_pipelines_with_links_in_two_modes():
    assert mixed_pipelines(np.array([0, 0, 1, 1]), np.array([1, 1, 0, 1])) == 1
    assert mixed_pipelines(np.array([], dtype=int), np.array([], dtype=int)) == 0
