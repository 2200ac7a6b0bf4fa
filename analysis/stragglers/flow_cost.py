"""What a culprit found in the flows costs the step: a what-if on the step's structure as the flows show it.

A flows finding says how slow something is (a NIC's rate, a stage's forward time); that is not what it
costs. Where the slow part overlaps compute or other traffic, it costs nothing; where every rank waits
for it, it costs all of its lateness. The flows show where the job waits. A 1F1B step is a pipeline phase
(activations and gradients on the pipeline links, all pipelines starting together after the previous
step's barrier), then the data-parallel sync (DP rings, some launched as buckets fill in the last
backward) and the optimizer's barrier. Replaying the step with the culprit at its peers' pace:

- its pipelines end when the latest of the others does, so the sync starts that much earlier
  (``pipeline_late_ns``: how much later the culprit's pipelines end than the latest other pipeline on
  the same exporter clock, in the same step);
- its DP rings end when the latest of the other rings does (``sync_tail_ns``: how much later the
  culprit's rings end than every other ring, in the same step).

The cost is their sum, the median over whole steps. Steps are told apart by the pause of the pipeline
links between two steps' pipeline phases. Both terms are read on the whole step, so lateness that the
job's other work hides (a slow ring that ends before a later stage's ring) costs nothing. A V5-like
job (DP12 x PP4, one NIC at 1/2.5 rate, measured 2.2 % of the step with and without the fault) costs
its ring's tail; a V8-like one (a slow GPU whose TP group paces its host's pipelines) costs the
pipelines' lateness plus its optimizer's tail on its ring.

The sum assumes what the late pipeline delays (every ring it crosses) would shift with it; rings it does
not cross that end late anyway are counted in neither term, so where they set the step the cost is an
upper bound.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.report.strategy import Strategy

MIN_PAUSE = 0.03
"""a pause of the pipeline links longer than this share of the step separates two steps' pipeline phases
(within a phase 1F1B keeps some pipeline link busy: gaps there are a microbatch's compute, a few per cent
of the step at most with a dozen microbatches)."""
STEP_SLACK = 0.1
"""the pauses must come a step apart, give or take this share: else they are no step's boundaries."""
MIN_STEPS = 2
"""whole steps (between two pauses) needed for a cost: one may hold a hiccup."""


def _links(strategy: Strategy) -> tuple[dict, dict]:
    """(pipeline link 'src|dst' -> pipeline index, DP link 'src|dst' -> DP group index)."""
    pipes = [p for p in strategy.pp_groups or [] if len(p) > 1]
    pp = {}
    for i, p in enumerate(pipes):
        for a, b in zip(p, p[1:]):
            pp[f"{a}|{b}"] = pp[f"{b}|{a}"] = i
    group = {x: i for i, g in enumerate(strategy.dp_groups or []) if len(g) > 1 for x in g}
    dp = {f"{a}|{b}": group[a] for a in group for b in group if a != b and group[a] == group[b]}
    return pp, dp


def _step_starts(pp: pl.DataFrame, step_ns: float) -> np.ndarray:
    """Where each step's pipeline phase starts: the first pipeline record after a pause of all pipeline links,
    the longest pauses a step apart, one a step (within the phase, pauses are a microbatch's compute, and
    the first step has no pause before it); empty when those pauses are not a step apart."""
    s = pp.sort("start_ns")
    gap = (s["start_ns"] - s["end_ns"].cum_max().shift(1)).fill_null(0).to_numpy().astype(float)
    t = s["start_ns"].to_numpy()
    most = int(round(float(t[-1] - t[0]) / step_ns)) + 1 if len(t) else 0
    keep: list[int] = []
    for i in np.argsort(-gap, kind="stable"):
        if len(keep) >= most or gap[i] <= MIN_PAUSE * step_ns:
            break
        if all(abs(t[i] - t[j]) >= 0.5 * step_ns for j in keep):
            keep.append(int(i))
    # a step's pause is its sync and barrier: pauses well under the usual one are within a phase
    keep = sorted(i for i in keep if gap[i] >= 0.5 * np.median(gap[keep]))
    starts = t[keep]
    if len(starts) < 2 or abs(float(np.median(np.diff(starts))) / step_ns - 1) > STEP_SLACK:
        return starts[:0]
    return starts


def _late_ends(f: pl.DataFrame, bad: set[int], by_clock: bool) -> float | None:
    """Within one step: how much later the latest end among units ``bad`` is than the latest end among the
    others (on the same clock where ``by_clock`` and some other unit shares it), or None with no other."""
    ends = f.group_by("unit", "clock").agg(end=pl.col("end_ns").max())
    mine, rest = ends.filter(pl.col("unit").is_in(list(bad))), ends.filter(~pl.col("unit").is_in(list(bad)))
    if mine.is_empty() or rest.is_empty():
        return None
    if by_clock:
        shared = rest.group_by("clock").agg(other=pl.col("end").max())
        here = mine.join(shared, on="clock")
        if not here.is_empty():
            return float((here["end"] - here["other"]).max())
    return float(mine["end"].max() - rest["end"].max())


def _median_late(recs: pl.DataFrame, starts: np.ndarray, bad: set[int], by_clock: bool) -> float | None:
    step = np.searchsorted(starts, recs["start_ns"].to_numpy(), side="right") - 1
    recs = recs.with_columns(step=pl.Series(step)).filter((pl.col("step") >= 0) & (pl.col("step") < len(starts) - 1))
    late = [x for _, g in recs.group_by("step") if (x := _late_ends(g, bad, by_clock)) is not None]
    return float(np.median(late)) if late else None


def step_cost(flow: pl.DataFrame, strategy: Strategy, step_ns: float, culprits: set[str],
              clocks: dict[str, str] | None = None) -> dict:
    """The step time the culprits (addresses, or a group of them that flows cannot split) cost (module doc).

    Needs flow src_addr, dst_addr, start_ns, end_ns (is_data, exporter where known) and the strategy's
    pp_groups and dp_groups. Returns extra_ns (None with ``why`` when the flows cannot show the step's
    structure), pipeline_late_ns, sync_tail_ns and steps (whole steps read).
    """
    pp_of, dp_of = _links(strategy)
    if not pp_of and not dp_of:
        return {"extra_ns": None, "why": "no pipeline or data-parallel link to replay the step on"}
    f = flow.filter(pl.col("is_data")) if "is_data" in flow.columns else flow
    key = pl.concat_str(["src_addr", "dst_addr"], separator="|")
    clock = (pl.col("exporter").replace_strict(clocks or {}, default=pl.col("exporter"), return_dtype=pl.String)
             if "exporter" in f.columns else pl.lit(""))
    f = f.with_columns(key=key, clock=clock)
    pp = f.filter(pl.col("key").is_in(list(pp_of))).with_columns(
        unit=pl.col("key").replace_strict(pp_of, return_dtype=pl.Int64))
    dp = f.filter(pl.col("key").is_in(list(dp_of))).with_columns(
        unit=pl.col("key").replace_strict(dp_of, return_dtype=pl.Int64))
    # a pure DP job starts each step with its ring traffic's pause instead
    starts = _step_starts(pp if not pp.is_empty() else dp, step_ns)
    if len(starts) - 1 < MIN_STEPS:
        return {"extra_ns": None, "why": f"the {'pipeline' if not pp.is_empty() else 'data-parallel'} links never "
                                         "pause between steps: the step's phases cannot be told apart"}
    pipes = [p for p in strategy.pp_groups or [] if len(p) > 1]
    bad_pipes = {i for i, p in enumerate(pipes) if culprits & set(p)}
    bad_rings = {i for i, g in enumerate(g for g in strategy.dp_groups or [] if len(g) > 1) if culprits & set(g)}
    pipe_late = _median_late(pp, starts, bad_pipes, True) if bad_pipes and not pp.is_empty() else 0.0
    tail = _median_late(dp, starts, bad_rings, False) if bad_rings and not dp.is_empty() else 0.0
    if pipe_late is None or tail is None:
        # the culprit is in every pipeline or every ring (a TP group late to all of a pure DP job's rings):
        # nothing on time shows when the step would end without it
        return {"extra_ns": None, "why": f"the culprit is in every {'pipeline' if pipe_late is None else 'DP ring'}"
                                         ": none on time to compare with"}
    parts = {"pipeline_late_ns": max(pipe_late, 0.0), "sync_tail_ns": max(tail, 0.0)}
    return {"extra_ns": parts["pipeline_late_ns"] + parts["sync_tail_ns"], **parts, "steps": len(starts) - 1}
