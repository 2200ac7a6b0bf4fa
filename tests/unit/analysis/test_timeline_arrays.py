"""The array form of the per-(rank, step) unions gives the polars form's timeline exactly, and steps aside where
it cannot stand in for it."""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.model import timelines
from rankscope.analysis.model.timeline_arrays import window_of, window_unions
from rankscope.analysis.model.timelines import rank_timelines


def _job(seed: int, n: int = 4000):
    """Step windows of 5 ranks x 4 steps and spans labelled with a step, some outside their window (before
    its start, after its end), some of a (rank, step) without a window, some with an end before their start."""
    rng = np.random.default_rng(seed)
    w = [(r, s, s * 10**6 + r * 10**3, (s + 1) * 10**6 - 7) for r in range(5) for s in range(4)]
    steps = pl.DataFrame(w, schema=["rank", "step", "start_ns", "end_ns"], orient="row")

    def spans(m: int) -> pl.DataFrame:
        step = rng.integers(0, 5, m)  # step 4 has no window
        start = step * 10**6 + rng.integers(-10**5, 11 * 10**5, m)
        return pl.DataFrame({"rank": rng.integers(0, 5, m).astype(np.int32), "start_ns": start,
                             "end_ns": start + rng.integers(-50, 2 * 10**5, m), "step": step})

    return steps, spans(n), spans(n // 2)


def _polars_form(steps, comm, comp) -> pl.DataFrame:
    """rank_timelines with the array form switched off."""
    saved = timelines.window_unions
    timelines.window_unions = lambda *a: None
    try:
        return rank_timelines(steps, comm, comp)
    finally:
        timelines.window_unions = saved


def test_arrays_give_the_polars_timeline_bit_for_bit():
    for seed in range(4):
        steps, comm, comp = _job(seed)
        assert window_unions(steps, comp, comm) is not None
        assert rank_timelines(steps, comm, comp).equals(_polars_form(steps, comm, comp))


def test_one_kind_of_span_only_and_none():
    steps, comm, comp = _job(11)
    for c, m in ((comp, comm.head(0)), (comp.head(0), comm), (comp.head(0), comm.head(0))):
        assert rank_timelines(steps, m, c).equals(_polars_form(steps, m, c))


def test_the_polars_form_takes_what_the_arrays_cannot():
    steps, comm, comp = _job(5)
    # a span without a step label is placed by its start (a join_asof): not the arrays' work
    unlabelled = comm.with_columns(pl.when(pl.col("rank") == 2).then(None).otherwise(pl.col("step")).alias("step"))
    assert window_unions(steps, comp, unlabelled) is None
    assert rank_timelines(steps, unlabelled, comp).equals(_polars_form(steps, unlabelled, comp))
    # two windows of one (rank, step): no one window to place a span in
    twice = pl.concat([steps, steps.head(1)])
    assert window_unions(twice, comp, comm) is None


def test_window_of_places_each_span_in_its_windows_row():
    steps = pl.DataFrame({"rank": [3, 1, 3], "step": [7, 7, 8], "start_ns": [0, 0, 0], "end_ns": [1, 1, 1]})
    got = window_of(steps, np.array([1, 3, 3, 2, 3, -5]), np.array([7, 8, 7, 7, 9, 7]))
    assert got.tolist() == [1, 2, 0, -1, -1, -1]
