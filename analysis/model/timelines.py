"""Per-rank, per-step phases on the aligned clock.

Phases per rank and step are interval unions, computed column-wise: compute (union of compute spans),
communication (union of comm spans), exposed communication (comm not hidden under compute) and idle
(neither): exposed communication plus idle is the time the rank waited. Steps are the one step definition
(:mod:`rankscope.analysis.model.steps`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.model.sort_key import sort_by_columns
from rankscope.analysis.model.timeline_arrays import window_unions

TIMELINE_COLUMNS = ("rank", "step", "start_ns", "end_ns", "duration_ns", "compute_ns", "comm_ns",
                    "exposed_comm_ns", "idle_ns", "exposed_wait_ns")


def union_ns(iv: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Total length of the union of [start_ns, end_ns) per key group, vectorised (sort + running max)."""
    if iv.is_empty():
        return iv.select(keys).clear().with_columns(union_ns=pl.lit(None, pl.Int64))  # the keys' own types
    # on one packed int64 when the keys allow (5x faster); the union is the same for any order of the
    # intervals that start together, so neither sort needs a tie-break
    s = sort_by_columns(iv, [*keys, "start_ns"])
    # end of everything that started before this interval (running max, shifted): the frame is sorted
    # by key, so the previous row's running max is the group's unless the key changed there
    same = pl.all_horizontal([pl.col(k).eq_missing(pl.col(k).shift(1)) for k in keys])
    prev_end = _group_running_max(s, same)
    if prev_end is None:
        prev_end = pl.when(same).then(pl.col("end_ns").cum_max().over(keys).shift(1))
    s = s.with_columns(prev_end=prev_end)
    # each interval adds only its part beyond that
    add = pl.max_horizontal(pl.col("end_ns") - pl.max_horizontal(pl.col("start_ns"),
                                                                  pl.col("prev_end").fill_null(pl.col("start_ns"))), 0)
    return s.group_by(keys).agg(union_ns=add.sum().cast(pl.Int64))


def _group_running_max(s: pl.DataFrame, same: pl.Expr) -> pl.Expr | None:
    """The previous row's running max of end_ns within its key group (null on a group's first row), as
    one running max over the whole sorted frame: each group's ends are lifted into a band of their own
    (group index x span), so a max never crosses a group boundary. Exact in integers; None when the
    bands would not fit in int64 or an end is null (then the windowed form)."""
    b = s.select(lo=pl.min_horizontal(pl.col("start_ns").min(), pl.col("end_ns").min()),
                 hi=pl.max_horizontal(pl.col("start_ns").max(), pl.col("end_ns").max()),
                 nulls=pl.col("end_ns").null_count())
    lo, hi, nulls = b.row(0)
    if nulls or lo is None or hi is None:
        return None
    span = int(hi) - int(lo) + 1
    if (s.height + 1) * span >= 2**62:
        return None
    band = (~same).cast(pl.Int64).cum_sum() * span
    lifted = pl.col("end_ns").cast(pl.Int64) - int(lo) + band
    return pl.when(same).then(lifted.cum_max().shift(1) - band + int(lo))


def _clip_to_steps(spans: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Assign spans (rank, start_ns, end_ns, optional step) to a step window, clipped to it.

    A span labelled with a step goes to that step's window (on relative-time
    traces every window of a rank starts at 0, so only the label can tell
    them apart); an unlabelled one to the window containing its start.
    """
    empty = pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})
    if spans.is_empty() or steps.is_empty():
        return empty
    w = steps.select("rank", "step", w0="start_ns", w1="end_ns")
    s = spans.select(pl.col("rank").cast(pl.Int64), "start_ns", "end_ns",
                     (pl.col("step").cast(pl.Int64) if "step" in spans.columns
                      else pl.lit(None, dtype=pl.Int64)).alias("step"))
    lab = s.filter(pl.col("step").is_not_null()).join(w, on=["rank", "step"], how="inner")
    unl = s.filter(pl.col("step").is_null()).drop("step").sort("start_ns").join_asof(
        w.sort("w0"), left_on="start_ns", right_on="w0", by="rank", strategy="backward", check_sortedness=False)
    j = pl.concat([lab.select("rank", "step", "start_ns", "end_ns", "w0", "w1"),
                   unl.select("rank", "step", "start_ns", "end_ns", "w0", "w1")])
    j = j.filter(pl.col("step").is_not_null() & (pl.col("start_ns") < pl.col("w1")))
    return j.select("rank", "step", start_ns=pl.max_horizontal(pl.col("start_ns"), pl.col("w0")),
                    end_ns=pl.min_horizontal(pl.col("end_ns"), pl.col("w1")))


def _polars_unions(steps: pl.DataFrame, comp_src: pl.DataFrame, comm_src: pl.DataFrame) -> pl.DataFrame:
    """``steps`` with duration_ns and the union lengths compute_ns, comm_ns and busy_ns of each window, in
    polars: for spans without a step label (placed by their start) or with nulls."""
    comp = _clip_to_steps(comp_src, steps)
    comm = _clip_to_steps(comm_src, steps)
    k = ["rank", "step"]
    u_comp = union_ns(comp, k).rename({"union_ns": "compute_ns"})
    u_comm = union_ns(comm, k).rename({"union_ns": "comm_ns"})
    u_all = union_ns(pl.concat([comp, comm]) if not (comp.is_empty() and comm.is_empty()) else comp, k
                      ).rename({"union_ns": "busy_ns"})
    return (steps.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns"))
            .join(u_comp, on=k, how="left").join(u_comm, on=k, how="left").join(u_all, on=k, how="left")
            .with_columns(pl.col("compute_ns", "comm_ns", "busy_ns").fill_null(0)))


def _spans(df: pl.DataFrame) -> pl.DataFrame:
    return df.select("rank", "start_ns", "end_ns", *(["step"] if "step" in df.columns else []))


def rank_timelines(steps: pl.DataFrame, comm_op: pl.DataFrame, compute_op: pl.DataFrame) -> pl.DataFrame:
    """Per-rank, per-step phases.

    Needs steps (each rank's step windows, :func:`rankscope.analysis.model.steps.rank_step_windows`), comm_op and compute_op rank,
    start_ns, end_ns and step where known (all on the aligned clock; pending comm ops run to the step end).
    Returns the columns in ``TIMELINE_COLUMNS``, one row per (rank, step).
    """
    if steps.is_empty():
        return pl.DataFrame(schema={c: pl.Int64 for c in TIMELINE_COLUMNS})
    comp_src = _spans(compute_op) if not compute_op.is_empty() else pl.DataFrame()
    comm_src = (_spans(comm_op).with_columns(pl.col("end_ns").fill_null(np.iinfo(np.int64).max // 2))
                if not comm_op.is_empty() else pl.DataFrame())
    k = ["rank", "step"]
    unions = (window_unions(steps, comp_src, comm_src)
              if all(df.is_empty() or "step" in df.columns for df in (comp_src, comm_src)) else None)
    if unions is not None:
        out = steps.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns"),
                                 **{c: pl.Series(u) for c, u in zip(("compute_ns", "comm_ns", "busy_ns"), unions,
                                                                    strict=True)})
    else:
        out = _polars_unions(steps, comp_src, comm_src)
    out = out.with_columns(exposed_comm_ns=pl.col("busy_ns") - pl.col("compute_ns"),
                           idle_ns=pl.max_horizontal(pl.col("duration_ns") - pl.col("busy_ns"), 0))
    out = out.with_columns(exposed_wait_ns=pl.col("exposed_comm_ns") + pl.col("idle_ns"))
    return out.select(*TIMELINE_COLUMNS).sort(k)


