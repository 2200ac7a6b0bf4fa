"""Stage order from the data-parallel traffic of each stage: the last stage finishes its backward first.

In every pipeline schedule (GPipe, 1F1B, interleaved) the final backward of a step runs from the last
stage to the first: the last stage's gradients are ready first, and each upstream stage waits for the
gradient of its last micro-batch before it can finish. So within each step a stage's data-parallel
gradient reduction (all-reduce, or reduce-scatter then all-gather) ends later the further upstream the
stage is. That holds whatever the transport does to the pipeline link itself (ACK flows that open both
of its directions together), and for two-stage pipelines, whose single link shows no chronology.

Each DP group's payload records are merged into bursts (one a step when the exporter cuts records at
least once a step); the burst ends of two stages are matched step by step, and a step votes when the
two ends are further apart than the clock can blur (20 ticks, and MIN_STAGE_END_GAP_NS). The last burst
is left out (it may run on into the job's shutdown), and so are groups with fewer than MIN_STEP_BURSTS.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import polars as pl

from rankscope.analysis.flow_features import MIN_BURST_GAP_NS, on_pairs

MIN_STAGE_END_GAP_NS = 1_000_000
"""two stages' gradient reductions ending closer than this vote nothing: exporters' clock offsets left
after alignment are of this order, and one micro-batch's backward is longer."""


MIN_STEP_BURSTS = 3
"""a DP group whose traffic shows fewer bursts than this does not show its steps."""


def _burst_ends(t: pl.DataFrame, gap_ns: int) -> np.ndarray:
    t = t.sort("start_ns")
    s, e = t["start_ns"].to_numpy(), t["end_ns"].to_numpy()
    if not len(s):
        return np.zeros(0, dtype=np.int64)
    busy = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > busy[:-1] + gap_ns]
    idx = np.flatnonzero(new)
    return np.maximum.reduceat(e, idx) if len(idx) else np.zeros(0, dtype=np.int64)


def dp_end_votes(flows: pl.DataFrame, dp_groups: list[list[str]], pipelines: list[list[str]],
                 dp_pairs: set[tuple[str, str]], resolution_ns: int) -> dict[tuple[int, int], tuple[int, int]]:
    """Per ordered pair of DP groups (i, j) joined by a pipeline link: (steps voting i upstream of j,
    steps voting j upstream of i). Needs flows src_addr, dst_addr, start_ns, end_ns (is_data if present);
    ``dp_pairs``: the job's data-parallel links as (a, b) address pairs."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    if flows.is_empty() or not dp_pairs or len(dp_groups) < 2:
        return out
    group_of = {x: i for i, g in enumerate(dp_groups) for x in g}
    f = flows.filter(pl.col("is_data")) if "is_data" in flows.columns else flows
    f = on_pairs(f, dp_pairs)
    if f.is_empty():
        return out
    f = f.with_columns(g=pl.col("src_addr").replace_strict(group_of, default=-1, return_dtype=pl.Int64))
    gap = max(MIN_BURST_GAP_NS, 20 * int(resolution_ns))
    floor = max(MIN_STAGE_END_GAP_NS, 20 * int(resolution_ns))
    # a step's bursts only: the last burst may run on into the job's shutdown (barriers, teardown), and
    # fewer than MIN_STEP_BURSTS bursts are records kept open across steps, whose ends are no step's
    ends = {int(g): b[:-1] for (g,), t in f.group_by("g") if g >= 0
            for b in [_burst_ends(t, gap)] if len(b) >= MIN_STEP_BURSTS}
    stage_pairs = {(group_of[u], group_of[v]) for p in pipelines for u, v in zip(p, p[1:])
                   if u in group_of and v in group_of}
    stage_pairs |= {(group_of[p[-1]], group_of[p[0]]) for p in pipelines if len(p) > 2}
    counts: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for i, j in stage_pairs:
        a, b = (i, j) if i < j else (j, i)
        ea, eb = ends.get(a), ends.get(b)
        if ea is None or eb is None or not len(ea) or not len(eb) or (a, b) in counts:
            continue
        # match each of a's bursts to b's nearest; a step apart is no match
        spacing = np.median(np.diff(ea)) if len(ea) > 1 else np.inf
        for x in ea:
            y = eb[np.argmin(np.abs(eb - x))]
            d = int(x) - int(y)
            if abs(d) <= floor or abs(d) >= 0.5 * spacing:
                continue
            counts[(a, b)][0 if d > 0 else 1] += 1  # a's reduction ends later: a is upstream
    for (a, b), (up, down) in counts.items():
        out[(a, b)] = (up, down)
        out[(b, a)] = (down, up)
    return out
