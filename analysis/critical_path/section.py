"""The report's ``critical_path`` section from a job model and the straggler what-if's graph."""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.critical_path.edits import top_edits
from rankscope.analysis.critical_path.path import StepPaths, path_delays, rank_step_key, step_paths
from rankscope.analysis.critical_path.shares import GAP_CLASS, rank_slack, segment_frame, shares
from rankscope.analysis.model.job_model import JobModel
from rankscope.analysis.report.steps import CriticalPath, PathEdit, PathOp, StepPath
from rankscope.analysis.stragglers.section import steady_frames
from rankscope.analysis.whatif.build import build_graph
from rankscope.analysis.whatif.graph import WhatIfGraph
from rankscope.analysis.whatif.metrics import ideal_durations
from rankscope.collectors.errors import RankscopeError

MAX_STEPS_LISTED = 16
"""steps whose whole path the report lists (the shares cover every steady step)."""
HOOK_LIMITS = ("hook records only: a rank's compute is the gap between its collectives (launch_gap), so the "
               "path shows which rank's gap held each collective and which transfers it waited on, but it "
               "cannot name the compute op, tell compute from CPU work in a gap, or see ops no hook recorded; "
               "only link edits can be replayed")
COMPUTE_LIMITS = ("compute and communication records: the path names ops; launch_gap is untraced CPU work "
                  "between an op and its predecessor")


def _recorded_step_times(graph: WhatIfGraph) -> np.ndarray:
    """Each step's recorded time as the replay measures it: the longest of the ranks' own spans (every rank
    starts the step at 0 in the replay; see :func:`path_delays`)."""
    # scatters over (rank, step) ids, not a group-by of a four-column copy of every op
    n_steps = len(graph.steps)
    key, n_keys = rank_step_key(graph.ops["rank"].to_numpy(), graph.step_index, n_steps)
    lo, hi = np.full(n_keys, np.inf), np.full(n_keys, -np.inf)
    np.minimum.at(lo, key, graph.ops["start_ns"].to_numpy())
    np.maximum.at(hi, key, graph.ops["end_ns"].to_numpy())
    has = np.zeros(n_keys, dtype=bool)
    has[key] = True
    out = np.full(n_steps, -np.inf)
    np.maximum.at(out, np.flatnonzero(has) % n_steps, (hi - lo)[has])
    out[np.isneginf(out)] = np.nan  # a step without ops
    return out


def _listed_steps(graph: WhatIfGraph, seg: pl.DataFrame, paths: StepPaths) -> list[StepPath]:
    n_listed = min(len(graph.steps), MAX_STEPS_LISTED)
    listed = seg.filter(pl.col("step_index") < n_listed)
    # a gap is named by its op's type: gathered once (one look-up per row took a tenth of the section)
    optype = graph.ops["optype"].gather(listed["op"]).to_list()
    by_step: list[list[PathOp]] = [[] for _ in range(n_listed)]
    for r, t in zip(listed.iter_rows(named=True), optype, strict=True):
        by_step[r["step_index"]].append(PathOp(
            rank=int(r["rank"]), op=str(r["op_class"]) if r["op_class"] != GAP_CLASS else str(t),
            op_class=GAP_CLASS if r["op_class"] == GAP_CLASS else ("communication" if r["comm"] else "compute"),
            start_ns=float(r["start_ns"]), duration_ns=float(r["dur_ns"]), link=r["link"],
            waited_for=int(r["waited"]) if r["waited"] >= 0 else None))
    # the walk went back from each step's end: listed from its start
    return [StepPath(step=int(graph.steps[si]), time_ns=float(paths.step_time[si]), ops=ops[::-1])
            for si, ops in enumerate(by_step)]


def path_of_graph(graph: WhatIfGraph, ideal: np.ndarray, hooks_only: bool) -> CriticalPath:
    """The section from a what-if graph and its per-op ideal durations (see :mod:`rankscope.analysis.critical_path`)."""
    actual = graph.actual
    delay = path_delays(graph)
    paths = step_paths(graph, actual, delay)
    seg = segment_frame(graph, paths)
    ok = np.isfinite(paths.step_time)
    base = float(paths.step_time[ok].mean()) if ok.any() else 0.0
    total = float(paths.step_time[ok].sum())
    recorded = _recorded_step_times(graph)
    err = np.abs(paths.step_time[ok] / recorded[ok] - 1) if ok.any() else np.zeros(0)
    top = seg.group_by("step_index", "rank").agg(pl.col("dur_ns").sum()).sort(
        ["step_index", "dur_ns", "rank"], descending=[False, True, False]).group_by(
        "step_index", maintain_order=True).first()
    edits = top_edits(graph, seg, actual, ideal, delay, base)
    return CriticalPath(
        evaluated=True, basis="hooks" if hooks_only else "compute", limits=HOOK_LIMITS if hooks_only else COMPUTE_LIMITS,
        model=graph.model, step_time_ns=base,
        replay_vs_recorded_max_rel_err=float(err.max()) if err.size else None,
        share=shares(seg, total), slack_by_rank=rank_slack(graph, paths.op_end, paths.step_time),
        top_rank_by_step={str(int(graph.steps[si])): int(r) for si, r, _ in top.iter_rows()},
        edits=[PathEdit(kind=e.kind, what=e.what, ranks=e.ranks, stage=e.stage, link=e.link,
                        path_share=e.path_share, predicted_step_ns=e.predicted_step_ns, saving=e.saving)
               for e in edits],
        steps=_listed_steps(graph, seg, paths), max_steps_listed=MAX_STEPS_LISTED)


def critical_path_section(model: JobModel, inter: dict | None = None) -> CriticalPath:
    """The critical path of every steady step of a job with per-rank records.

    ``inter``: the straggler section's intermediate results (its graph and ideal durations), reused when
    present; otherwise the graph is built from the model's steady frames (hook-only records)."""
    if not model.per_rank:
        return CriticalPath(evaluated=False, why="no per-rank records: the path needs each rank's ops")
    inter = inter or {}
    graph = inter.get("graph")
    try:
        if graph is None:
            graph = build_graph(steady_frames(model)[0], model.layout_columns())
        ideal = inter.get("ideal")
        ideal = ideal_durations(graph) if ideal is None else ideal
    except (RankscopeError, ValueError, IndexError) as e:
        return CriticalPath(evaluated=False, why=f"{type(e).__name__}: {e}")
    return section_of_graph(model, graph, ideal)


def section_of_graph(model: JobModel, graph: WhatIfGraph, ideal: np.ndarray) -> CriticalPath:
    """The section from a job's what-if graph and its ideal durations (the straggler section's, or built for
    the path): :func:`path_of_graph`, or not evaluated, with why, when the graph cannot be replayed."""
    try:
        return path_of_graph(graph, ideal, hooks_only=model.frames.compute_op.height == 0)
    except (RankscopeError, ValueError, IndexError) as e:
        # a graph that cannot be replayed costs this section only
        return CriticalPath(evaluated=False, why=f"{type(e).__name__}: {e}")
