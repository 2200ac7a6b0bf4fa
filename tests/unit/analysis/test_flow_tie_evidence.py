"""Ties between an interleaved pipeline's cycle and a collective over the same links (fabric.tie_evidence).

Over TCP with exporter timeouts longer than the job each link is one record per direction: no
direction lag, and a two-way balanced cycle fits a ring/tree all-reduce and a pipeline alike.
The wrap link of an interleaved schedule is crossed one chunk fewer times than the other stage links:
that is the evidence, and without it the tie must stand.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.grid import fit_grid
from rankscope.analysis.fabric.tie_evidence import (
    ends_from_wrap,
    ends_walk,
    short_link,
    two_short,
    wrap_by_bytes,
)
from rankscope.analysis.strategy.flows.confidence import VALID_GRID_CONFIDENCE
from rankscope.analysis.strategy.flows.infer import infer_flows
from rankscope.datasets.simulator import Realism, SimConfig, simulate

NODES = [f"n{i}" for i in range(8)]


def _cycle_edges(link_bytes: list[float], last: list[float] | None = None) -> pl.DataFrame:
    """An 8-cycle n0-n1-...-n7-n0, payload both ways, both directions opening together (TCP)."""
    n = len(link_bytes)
    rows = []
    for i, b in enumerate(link_bytes):
        x, y = NODES[i], NODES[(i + 1) % n]
        a, c = min(x, y), max(x, y)
        rows.append({"a": a, "b": c, "bytes": 2 * b, "bytes_ab": b, "bytes_ba": b * 0.999, "first_ab": 1000,
                     "first_ba": 1000, "data_symmetry": 0.999,
                     "last_link": float(last[i]) if last is not None else None})
    return pl.DataFrame(rows)


def test_short_link_needs_a_chunk_clear_of_the_noise():
    rng = np.random.default_rng(0)
    equal = 1e9 * (1 + 0.005 * rng.standard_normal(8))
    assert short_link(equal) is None  # sampling noise among equal links is no wrap
    wrap = equal.copy()
    wrap[3] *= 0.5
    assert short_link(wrap)[0] == 3 and abs(short_link(wrap)[1] - 0.5) < 0.02
    three_chunks = equal.copy()
    three_chunks[5] *= 2 / 3
    assert short_link(three_chunks)[0] == 5
    slight = equal.copy()
    slight[2] *= 0.97  # 3 %: less than a chunk of any schedule looked for
    assert short_link(slight) is None
    noisy = 1e9 * (1 + 0.1 * rng.standard_normal(8))
    noisy[0] = 0.8e9
    assert short_link(noisy) is None or short_link(noisy)[1] < 0.8  # a 20 % dip among 10 % noise is not read
    assert short_link(np.array([1e9, 0.3e9, 1e9, 1e9])) is None  # far more than a chunk short: not a wrap
    # two chunks: half, give or take the short link's own noise (either side of one half)
    assert short_link(np.array([4.96e8, 1.0e9, 1.0014e9, 1.0013e9]))[0] == 0


def test_two_short_links_fit_no_pipeline_schedule():
    assert two_short(np.array([4e9, 8.1e9, 8.0e9, 4.05e9]))  # a double binary tree's 4-cycle
    assert not two_short(np.array([0.5e9, 1e9, 1.01e9, 0.99e9]))  # one wrap: a pipeline
    assert not two_short(np.array([0.9e9, 1e9, 1.1e9, 0.95e9, 1.05e9]))  # noise among equal links
    assert not two_short(np.array([0.5e9, 1e9, 0.5e9]))  # three links leave no rest to compare with


def test_record_ends_walk_only_when_they_rise_round_the_cycle():
    assert ends_walk(np.array([5.0, 6, 7, 8, 1, 2, 3, 4])) == 4
    assert ends_walk(np.array([3.0, 1, 4, 1, 5, 9, 2, 6])) is None
    assert ends_walk(np.full(8, 7.0)) is None  # a coarse clock: equal ends show nothing


def test_a_cycle_with_one_short_link_is_an_interleaved_pipeline_cut_there():
    b = [1e9] * 8
    b[5] = 0.5e9  # n5 - n6 is the wrap: the pipeline runs n6 ... n5
    fit = fit_grid(NODES, _cycle_edges(b), FlowConfig())
    assert fit.valid and fit.tie_broken and not fit.ambiguous
    assert len(fit.pipelines) == 1 and len(fit.pipelines[0]) == 8
    assert len(fit.alternatives) == 1 and fit.alternatives[0]["pp"] == 1  # the collective stays listed
    assert "2 model chunks" in fit.tie_evidence


def test_a_cycle_of_equal_links_stays_a_tie():
    fit = fit_grid(NODES, _cycle_edges([1e9] * 8), FlowConfig())
    assert fit.valid and fit.ambiguous and not fit.tie_broken and len(fit.alternatives) == 1


def test_record_ends_that_walk_from_another_link_keep_the_tie():
    b = [1e9] * 8
    b[5] = 0.5e9
    # the last records end in order round the cycle, but earliest on n1 - n2, not on the short link
    last = [(i - 1) % 8 * 20e6 for i in range(8)]
    fit = fit_grid(NODES, _cycle_edges(b, last), FlowConfig())
    assert fit.ambiguous and not fit.tie_broken
    # ends that walk from the short link agree with it
    last = [(i - 5) % 8 * 20e6 for i in range(8)]
    assert fit_grid(NODES, _cycle_edges(b, last), FlowConfig()).tie_broken
    # and so do they when a stray late record on the wrap itself makes it end last, not first
    last[5] = 500e6
    assert fit_grid(NODES, _cycle_edges(b, last), FlowConfig()).tie_broken
    assert ends_from_wrap(np.array(last), 5) == 1 and ends_from_wrap(np.array(last[::-1]), 2) == -1


def test_wrap_by_bytes_needs_both_directions():
    path = NODES
    sent = {}
    for i in range(8):
        x, y = path[i], path[(i + 1) % 8]
        sent[(x, y)], sent[(y, x)] = 1e9, 1e9
    sent[(path[2], path[3])] = 0.5e9
    assert wrap_by_bytes(path, sent) is None  # one direction short: a lost record, not a missing chunk
    sent[(path[3], path[2])] = 0.5e9
    assert wrap_by_bytes(path, sent) == 2


def _tcp_job(**kw) -> tuple[pl.DataFrame, dict]:
    cfg = dict(dp=1, pp=8, tp=1, gpus_per_host=1, steps=3, microbatches=8, layers=16, seed=7, gemm_records=False,
               schedule="interleaved", active_timeout_s=60.0, idle_timeout_s=60.0,
               realism=Realism(transport="tcp", mtu=1448, host_order="scattered"))
    cfg.update(kw)
    res = simulate(SimConfig(**cfg))
    return pl.from_arrow(res.tables["flow"]), res.truth


def _same_path_any_direction(a: list[str], b: list[str]) -> bool:
    return a == b or a == b[::-1]


def test_simulated_tcp_interleaved_pipeline_is_resolved_to_the_pipeline():
    flow, truth = _tcp_job()
    s = infer_flows(flow).strategy
    assert (s.dp, s.pp) == (1, 8)
    assert s.flows.tie_broken and s.flows.confidence_evidence == "tie broken by a short wrap link"
    assert _same_path_any_direction(s.pp_groups[0], truth["pp_groups_by_address"][0])
    assert s.confidence > 1 / 2 * VALID_GRID_CONFIDENCE


def test_simulated_tcp_data_parallel_ring_stays_a_ring():
    flow, truth = _tcp_job(dp=8, pp=1, schedule="1f1b", microbatches=2, algorithm="ring")
    s = infer_flows(flow).strategy
    assert (s.dp, s.pp) == (8, 1) and not s.flows.tie_broken and not s.flows.ambiguous


def test_simulated_plain_1f1b_pipeline_over_tcp_has_no_wrap_to_find():
    # a plain 1F1B (not interleaved) pipeline is a path: no cycle, nothing to break, no short link claimed
    flow, truth = _tcp_job(schedule="1f1b")
    s = infer_flows(flow).strategy
    assert not s.flows.tie_broken
    assert (s.dp, s.pp) == (1, 8)


def test_simulated_tree_all_reduce_tie_stays_data_parallel_by_its_bytes():
    # dp4 x pp2, double binary tree over TCP (one connection a pair, both directions opened together at
    # set-up), millisecond clock, one record per direction for the whole job: no lag is measurable, so
    # dp4 pp2 and dp2 pp4 (the trees' 4-cycles read as cyclic pipelines) fit alike; the cycles' links carry
    # 1 : 2 : 2 : 1 (links in both trees twice), which no pipeline schedule does. (Over RoCE the gradients
    # leave on queue pairs of their own, whose records start with them: the lag shows.)
    cfg = SimConfig(dp=4, pp=2, tp=1, gpus_per_host=1, steps=3, microbatches=4, layers=8, seed=7, gemm_records=False,
                    algorithm="tree", active_timeout_s=60.0, idle_timeout_s=60.0,
                    realism=Realism(double_tree=True, timestamp_ns=1_000_000, reverse=True, ack_every=8,
                                    transport="tcp"))
    res = simulate(cfg)
    s = infer_flows(pl.from_arrow(res.tables["flow"])).strategy
    assert (s.dp, s.pp) == (4, 2) and s.flows.alternatives and not s.flows.ambiguous
    assert s.flows.confidence_evidence == "tie broken: no pipeline fits the bytes"
    assert sorted(map(sorted, s.dp_groups)) == sorted(map(sorted, res.truth["dp_groups_by_address"]))
