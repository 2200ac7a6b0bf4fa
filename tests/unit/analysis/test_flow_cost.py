"""The cost of a flows finding as a what-if on the step's structure (stragglers.flow_cost), on hand-built
1F1B steps: pipelines that start together, then each stage's DP ring, then the barrier."""

import polars as pl
import pytest

from rankscope.analysis.report.strategy import Strategy
from rankscope.analysis.stragglers.flow_cost import step_cost

MS = 1_000_000
STEP = 1000 * MS
PIPES = [[f"10.0.0.{d + 1}", f"10.0.1.{d + 1}"] for d in range(4)]
STRATEGY = Strategy(dp=4, pp=2, pp_groups=PIPES, dp_groups=[[p[k] for p in PIPES] for k in range(2)])


def _steps(slow_pipe: float = 1.0, ring_ms: tuple[float, float] = (200.0, 200.0), n: int = 6):
    """(flows, step time) of n steps of 4 pipelines (PP2, 8 microbatches over a 480 ms phase; pipeline 2's phase stretched by
    ``slow_pipe``); stage 1's ring runs ring_ms[1] from the latest pipeline's end, stage 0's ring ring_ms[0]
    from 50 ms later (its last backward comes last); the next step starts 100 ms after the last ring."""
    rows, t0 = [], 1_764_000_000 * 10**9
    first = t0
    for _ in range(n):
        ends = []
        for i, (a, b) in enumerate(PIPES):
            mb = 60 * MS * (slow_pipe if i == 2 else 1.0)
            for m in range(8):
                t = t0 + int(m * mb)
                rows += [(a, b, t, t + MS, "e"), (b, a, t + int(mb / 2), t + int(mb / 2) + MS, "e")]
            ends.append(t0 + int(8 * mb))
        sync = max(ends)
        ring_end = []
        for k, start in ((1, sync), (0, sync + 50 * MS)):
            g = STRATEGY.dp_groups[k]
            end = start + int(ring_ms[k] * MS)
            rows += [(g[j], g[(j + 1) % 4], start, end, "e") for j in range(4)]
            ring_end.append(end)
        t0 = max(ring_end) + 100 * MS
    f = pl.DataFrame(rows, schema=["src_addr", "dst_addr", "start_ns", "end_ns", "exporter"], orient="row")
    return f.with_columns(is_data=pl.lit(True)), (t0 - first) / n


def test_a_late_pipeline_costs_its_lateness():
    f, step = _steps(slow_pipe=1.25)
    c = step_cost(f, STRATEGY, step, {"10.0.1.3"})
    # its last gradient sent back comes 7.5 microbatches in, 25 % later
    assert c["pipeline_late_ns"] == pytest.approx(0.25 * 7.5 * 60 * MS, abs=MS)
    assert c["sync_tail_ns"] == 0 and c["steps"] >= 4


def test_a_slow_ring_hidden_behind_a_later_ring_costs_nothing():
    # stage 1's ring 1.2x slower still ends before stage 0's, which starts 50 ms later
    f, step = _steps(ring_ms=(200.0, 240.0))
    c = step_cost(f, STRATEGY, step, {"10.0.1.2"})
    assert c["extra_ns"] == 0


def test_a_slow_ring_that_outlasts_the_others_costs_its_tail():
    f, step = _steps(ring_ms=(200.0, 330.0))
    c = step_cost(f, STRATEGY, step, {"10.0.1.2"})
    assert c["sync_tail_ns"] == pytest.approx(80 * MS, abs=MS) and c["pipeline_late_ns"] == 0


def test_links_that_never_pause_give_no_cost_and_say_why():
    rows = [(a, b, t * 10 * MS, t * 10 * MS + 9 * MS, "e") for t in range(500) for a, b in PIPES]
    f = pl.DataFrame(rows, schema=["src_addr", "dst_addr", "start_ns", "end_ns", "exporter"], orient="row")
    c = step_cost(f, STRATEGY, STEP, {"10.0.0.1"})
    assert c["extra_ns"] is None and "never pause" in c["why"]


def test_a_culprit_in_every_ring_has_no_reference_and_no_cost():
    # a pure DP job's TP group late to all rings: nothing on time says when the step would end without it
    f, step = _steps(slow_pipe=1.25)
    strategy = Strategy(dp=4, pp=1, dp_groups=STRATEGY.dp_groups)
    c = step_cost(f.filter(pl.col("src_addr").str.slice(0, 7) == pl.col("dst_addr").str.slice(0, 7)), strategy,
                  step, {"10.0.0.1", "10.0.1.1"})
    assert c["extra_ns"] is None and "every DP ring" in c["why"], c
