import numpy as np
import polars as pl

from rankscope.analysis.model.steps import rank_step_windows, steps_section
from rankscope.analysis.model.timelines import TIMELINE_COLUMNS, rank_timelines
from rankscope.analysis.strategy.flows.period import period_steps, step_period

from .wb_frames import build_job


def _spans(rows):
    return pl.DataFrame(rows, schema=["rank", "step", "start_ns", "end_ns"], orient="row")


def test_phases_are_interval_unions_that_add_up_to_the_step():
    marks = _spans([(0, 0, 0, 100), (0, 1, 100, 200)])
    comp = _spans([(0, 0, 0, 30), (0, 0, 20, 50), (0, 1, 100, 150)])
    comm = _spans([(0, 0, 40, 70), (0, 1, 190, 230)])  # the last one runs past the step end: clipped
    tl = rank_timelines(rank_step_windows(marks, comm.head(0), comp.head(0)), comm, comp)
    assert tl.columns == list(TIMELINE_COLUMNS)
    s0, s1 = tl.row(0, named=True), tl.row(1, named=True)
    assert (s0["compute_ns"], s0["comm_ns"], s0["exposed_comm_ns"], s0["idle_ns"]) == (50, 30, 20, 30)
    assert (s1["compute_ns"], s1["comm_ns"], s1["exposed_comm_ns"], s1["idle_ns"]) == (50, 10, 10, 40)
    for r in (s0, s1):
        assert r["compute_ns"] + r["exposed_comm_ns"] + r["idle_ns"] == r["duration_ns"]
        assert r["exposed_wait_ns"] == r["exposed_comm_ns"] + r["idle_ns"]


def test_steps_from_the_step_column_when_there_are_no_marks():
    comm, comp, _ = build_job(dp=2, pp=2, steps=4, step_ms=50.0)
    st = rank_step_windows(comm.head(0).select("rank", "step", "start_ns", "end_ns").clear(), comm, comp)
    sec = steps_section(st, "step column")
    assert sec.count == 4
    assert abs(sec.median_ns - 50e6) / 50e6 < 0.003
    assert len(sec.boundaries_ns) == 4 and sorted(sec.boundaries_ns) == sec.boundaries_ns


def test_step_period_from_record_starts_that_skip_steps():
    rng = np.random.default_rng(1)
    period = 1_000_000_000
    # 20 pairs; each pair's records start on a burst but skip 2 or 3 steps at random (active timeout)
    keys, times = [], []
    for k in range(20):
        s = 0
        while s < 60:
            keys.append(k)
            times.append(s * period + int(rng.normal(0, 2e6)))
            s += int(rng.choice([2, 3]))
    p = step_period(np.array(keys), np.array(times))
    assert abs(p - period) / period < 0.003


def test_step_period_needs_periodic_starts():
    assert step_period(np.array([0, 0]), np.array([1, 2])) is None
    assert period_steps(0, 10, 5.0) == [0, 5, 10]


def test_empty_steps_are_not_evaluated():
    sec = steps_section(pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "start_ns": pl.Int64,
                                             "end_ns": pl.Int64}), "x")
    assert sec.count == 0 and sec.evaluated is False
