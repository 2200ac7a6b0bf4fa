"""The one step definition: each rank's step windows, the job's step table and the report's ``steps``.

analyze, diff, export and the dashboard all read step times from here, so
they agree on every store.

- A rank's window of a step comes from its step_mark record, else from the
  span of its ops labelled with that step (:func:`rank_step_windows`).
- A step's job-wide window runs from the earliest rank start to the latest
  rank end; that is the step's own **span**.
- Its **duration** (the step time), when all steps are on one clock, is the
  median over ranks of each rank's own window, which runs to the rank's next
  step start: what a training loop measures per iteration, untraced gaps such
  as data loading included. Per rank, not job-wide, because pipeline stages
  drift apart by a fixed offset (a last stage starts its next step while the
  first still runs backwards), so job-wide start-to-start or span times mix
  that offset in. On relative-time traces (every step starts at 0, as in the
  OSDI'25 traces) or when a rank's starts do not increase, there is no common
  clock across steps and the step's own job-wide span is used.
- **Warm-up** steps are left out of the median and listed with why: the
  first recorded step (rendezvous, allocator and compilation warm-up,
  profiler start) and any further leading steps slower than
  ``warmup_factor`` times the median of the steps after them. At least one
  step always stays in the median.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.report.steps import Steps, StepTable, Warmup

WARMUP_FACTOR = 1.5
"""a leading step slower than this times the steady median is warm-up (start-up cost, not the job's pace)."""

WINDOW_SCHEMA = {"rank": pl.Int64, "step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64}
STEP_SCHEMA = {"step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "span_ns": pl.Int64,
               "duration_ns": pl.Int64, "basis": pl.Utf8, "warmup": pl.Boolean, "why": pl.Utf8}


def rank_step_windows(step_mark: pl.DataFrame, comm_op: pl.DataFrame, compute_op: pl.DataFrame) -> pl.DataFrame:
    """One row per (rank, step): start_ns, end_ns (aligned inputs expected).

    Needs step_mark rank, step, start_ns, end_ns; else comm_op/compute_op rank, step, start_ns, end_ns.
    On a clock where steps follow each other, a step without an end (or one
    ending before the rank's next step starts) ends where that next step starts.
    """
    if not step_mark.is_empty():
        t = step_mark.select(pl.col("rank").cast(pl.Int64), pl.col("step").cast(pl.Int64),
                             pl.col("start_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64))
    else:
        # selected before filtered: an eager filter copies every column it carries (comm_op's ~20)
        parts = [f.select(pl.col("rank").cast(pl.Int64), pl.col("step").cast(pl.Int64),
                          pl.col("start_ns").cast(pl.Int64),
                          pl.col("end_ns").fill_null(pl.col("start_ns")).cast(pl.Int64))
                  .filter(pl.col("step").is_not_null())
                 for f in (comm_op, compute_op) if not f.is_empty() and "step" in f.columns]
        parts = [p for p in parts if not p.is_empty()]
        if not parts:
            return pl.DataFrame(schema=WINDOW_SCHEMA)
        t = pl.concat(parts)
    t = t.group_by(["rank", "step"]).agg(pl.col("start_ns").min(), pl.col("end_ns").max()).sort(["rank", "step"])
    nxt = pl.col("start_ns").shift(-1).over("rank")
    # only stretch to the next start when it lies ahead (relative-time steps all start at 0)
    ahead = nxt.is_not_null() & (nxt > pl.col("start_ns"))
    return t.with_columns(end_ns=pl.when(pl.col("end_ns").is_null() & ahead).then(nxt)
                          .otherwise(pl.col("end_ns"))).with_columns(
        end_ns=pl.when(ahead & (pl.col("end_ns") < nxt)).then(nxt).otherwise(pl.col("end_ns")))


def job_steps(windows: pl.DataFrame, relative_time: bool = False,
              warmup_factor: float = WARMUP_FACTOR) -> pl.DataFrame:
    """The job's steps from per-rank windows (see module docstring).

    Needs rank, step, start_ns, end_ns. Returns the columns of ``STEP_SCHEMA``
    sorted by step: span_ns (the step's own job-wide span), duration_ns (the
    step time), basis (``rank_period`` or ``span``), warmup and why.
    """
    if windows.is_empty():
        return pl.DataFrame(schema=STEP_SCHEMA)
    w = windows.filter(pl.col("start_ns").is_not_null()).with_columns(
        end_ns=pl.coalesce(pl.col("end_ns"), pl.col("start_ns"))).sort(["rank", "step"])
    increasing = w.select((pl.col("start_ns").diff().over("rank").fill_null(1) > 0).all()).item()
    one_clock = not relative_time and bool(increasing)
    g = (w.group_by("step").agg(pl.col("start_ns").min(), pl.col("end_ns").max(),
                                per_rank=(pl.col("end_ns") - pl.col("start_ns")).median())
         .sort("step").with_columns(span_ns=pl.col("end_ns") - pl.col("start_ns")))
    if one_clock:
        g = g.with_columns(duration_ns=pl.col("per_rank").round(0).cast(pl.Int64), basis=pl.lit("rank_period"))
    else:
        g = g.with_columns(duration_ns=pl.col("span_ns"), basis=pl.lit("span"))
    warm, why = _warmup(g["duration_ns"].to_numpy(), warmup_factor)
    return g.with_columns(pl.Series("warmup", warm, pl.Boolean), pl.Series("why", why, pl.Utf8)).select(
        [pl.col(c).cast(t) for c, t in STEP_SCHEMA.items()])


def _warmup(dur: np.ndarray, factor: float) -> tuple[list[bool], list[str | None]]:
    n = len(dur)
    warm: list[bool] = [False] * n
    why: list[str | None] = [None] * n
    if n < 2:
        return warm, why
    warm[0] = True
    why[0] = "first step: start-up (rendezvous, allocator and compilation warm-up, profiler start)"
    i = 1
    # further leading steps are warm-up while they stand out from the steps after them
    while i < n - 1:
        rest = float(np.median(dur[i + 1:]))
        if rest > 0 and dur[i] > factor * rest:
            warm[i] = True
            why[i] = f"start-up: {dur[i] / rest:.2f}x the median of the steps after it (> {factor}x)"
            i += 1
        else:
            break
    return warm, why


def steps_section(table: pl.DataFrame, source: str) -> Steps:
    """The report's ``steps`` from :func:`job_steps` (or from per-rank windows, which it runs through
    :func:`job_steps` on one clock): median of the steps that are not warm-up."""
    if "warmup" not in table.columns:
        table = job_steps(table)
    if table.is_empty():
        return Steps(evaluated=False, why="no step boundaries found", source=source)
    steady = table.filter(~pl.col("warmup"))
    med = float(steady["duration_ns"].median()) if steady.height else float(table["duration_ns"].median())
    warm = [Warmup(step=int(r["step"]), why=r["why"]) for r in table.filter(pl.col("warmup")).iter_rows(named=True)]
    bases = sorted(set(table["basis"].to_list()))
    detail = StepTable(step_ids=[int(x) for x in table["step"]], spans_ns=[int(x) for x in table["span_ns"]],
                       basis=bases[0] if len(bases) == 1 else ", ".join(bases), warmup=warm,
                       num_in_median=int(steady.height))
    return Steps(count=int(table.height), median_ns=med, boundaries_ns=[int(x) for x in table["start_ns"]],
                 source=source, durations_ns=[int(x) for x in table["duration_ns"]], table=detail)


def steps_frame(table: pl.DataFrame) -> pl.DataFrame:
    """The ``steps`` table the figures draw (step id, duration_ns, span_ns, warmup)."""
    if table.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "duration_ns": pl.Int64, "span_ns": pl.Int64,
                                    "warmup": pl.Boolean})
    return table.select("step", "duration_ns", "span_ns", "warmup")


def startup_steps(steps: pl.DataFrame | None) -> dict:
    """Leading warm-up steps (the one step definition's) that stand out from the job's pace: {step: why}.

    The what-if replays every step it is given and averages them; a start-up step several times the
    steady step (rendezvous, allocator, profiler start) would count as slowdown of a clean job, and
    its ops would lengthen every op type's ideal. A first step that does not stand out stays (a
    trace of steady steps, e.g. OSDI'25's, is replayed whole)."""
    if steps is None or steps.is_empty() or "warmup" not in steps.columns:
        return {}
    steady = steps.filter(~pl.col("warmup"))
    if steady.is_empty():
        return {}
    pace = float(steady["duration_ns"].median())
    out = steps.filter(pl.col("warmup") & (pl.col("duration_ns") > WARMUP_FACTOR * pace))
    return {int(r["step"]): f"warm-up, {r['duration_ns'] / pace:.2f}x the steady median step (> {WARMUP_FACTOR}x)"
            for r in out.iter_rows(named=True)}


def flow_step_table(section: Steps) -> pl.DataFrame:
    """The step table (``STEP_SCHEMA``) of a flows-only job: one row per period the flows' steps span,
    each the flows' one period long (flows give one step time for all steps)."""
    durs = section.durations_ns or []
    if not section.evaluated or not durs:
        return pl.DataFrame(schema=STEP_SCHEMA)
    starts = list(section.boundaries_ns)[:len(durs)]
    n = len(starts)
    return pl.DataFrame({"step": list(range(n)), "start_ns": starts,
                         "end_ns": [s + d for s, d in zip(starts, durs)], "span_ns": durs[:n],
                         "duration_ns": durs[:n], "basis": ["flow_period"] * n, "warmup": [False] * n,
                         "why": [None] * n}, schema=STEP_SCHEMA)
