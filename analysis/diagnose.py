"""The front door of the analysis: one job's frames in, one Diagnosis out.

Every analyzer is reached from here; the CLI, the dashboard and the notebooks
call :func:`diagnose` and read the Diagnosis it returns. Strategy comes from
comm_op records when the job has them (white-box, exact), else from flow
records (black-box); with both and an endpoint_map the two are compared.
Rank clocks are aligned before step boundaries and per-rank timelines are
built; :func:`job_timelines` exposes the timeline table itself.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import polars as pl

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.hangs import hang_section
from rankscope.analysis.kernels.regressions import RegressionConfig, regression_section
from rankscope.analysis.model.clocks import (
    ClockConfig,
    apply_exporter_offsets,
    exporter_clock_offsets,
    exporter_clocks,
)
from rankscope.analysis.model.data_quality import rank_coverage
from rankscope.analysis.model.job_model import JobModel, build_job_model
from rankscope.analysis.model.steps import steps_frame, steps_section
from rankscope.analysis.model.timelines import rank_timelines
from rankscope.analysis.report.diagnosis import Diagnosis, Steps, Strategy
from rankscope.analysis.report.findings import build_findings
from rankscope.analysis.stragglers.attribution import StragglerConfig, straggler_section
from rankscope.analysis.strategy.compare import compare_strategies
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.job_frames import JobFrames


@dataclass(frozen=True)
class DiagnoseConfig:
    """Options of a whole diagnosis (each analyzer's own config hangs off here)."""

    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    """what-if attribution (verdict ``none`` below ``stragglers.none_below``, 1.05)."""
    regressions: RegressionConfig = field(default_factory=RegressionConfig)
    """GEMM alignment and throughput (flagged below ``regressions.throughput.threshold``, 0.9)."""
    clock: ClockConfig = field(default_factory=ClockConfig)
    """rank clock alignment."""
    flow: FlowConfig = field(default_factory=FlowConfig)
    """black-box strategy inference and job recognition from flows."""

    def __post_init__(self):
        if not isinstance(self.stragglers, StragglerConfig) or not isinstance(self.regressions, RegressionConfig):
            raise ConfigError("DiagnoseConfig: stragglers and regressions must be StragglerConfig and "
                              "RegressionConfig")


def data_quality(frames: JobFrames) -> dict:
    counts = {k: getattr(frames, k).height for k in
              ("comm_op", "compute_op", "flow", "step_mark", "batch_meta", "endpoint_map")}
    return {"records": counts, "rejected": dict(frames.rejects),
            "num_rejected": int(sum(frames.rejects.values())), "relative_time": frames.relative_time,
            **rank_coverage(frames)}


@dataclass
class AlignedJob:
    """A job's per-rank records on one clock, with the corrections that were applied."""

    comm_op: pl.DataFrame
    compute_op: pl.DataFrame
    step_mark: pl.DataFrame
    rank_offsets: pl.DataFrame


def align_job(frames: JobFrames, config: ClockConfig | None = None) -> AlignedJob:
    """Align comm_op, compute_op and step_mark of one job (the job model's aligned frames)."""
    m = build_job_model(frames, config)
    return AlignedJob(comm_op=m.aligned_comm, compute_op=m.aligned_compute, step_mark=m.aligned_step_mark,
                      rank_offsets=m.rank_offsets)


def model_timelines(model: JobModel) -> pl.DataFrame:
    """Per-rank, per-step phases from a job model (see :func:`rankscope.analysis.model.timelines.rank_timelines`)."""
    return rank_timelines(model.rank_steps, model.aligned_comm, model.aligned_compute)


def job_timelines(frames: JobFrames, config: DiagnoseConfig | None = None) -> pl.DataFrame:
    """Per-rank, per-step phases of one job (see :func:`rankscope.analysis.model.timelines.rank_timelines`)."""
    config = config or DiagnoseConfig()
    return model_timelines(build_job_model(frames, config.clock))


def job_step_table(frames: JobFrames, config: DiagnoseConfig | None = None) -> pl.DataFrame:
    """The job's steps by the one step definition (what analyze reports and diff compares)."""
    config = config or DiagnoseConfig()
    return build_job_model(frames, config.clock).steps


def _clock_quality(off: pl.DataFrame) -> dict:
    if off.is_empty():
        return {"domains": 0, "max_abs_offset_ns": 0.0, "max_abs_drift": 0.0}
    return {"domains": int(off["domain"].n_unique()), "max_abs_offset_ns": float(off["offset_ns"].abs().max()),
            "max_abs_drift": float(off["drift"].abs().max())}


def _whitebox(model: JobModel, d: Diagnosis) -> pl.DataFrame:
    d.strategy = model.strategy
    d.steps = steps_section(model.steps, model.steps_source)
    tl = model_timelines(model)
    if not tl.is_empty():
        per_rank = tl.group_by("rank").agg(pl.col("compute_ns", "comm_ns", "exposed_comm_ns", "idle_ns",
                                                  "exposed_wait_ns").sum()).sort("rank")
        d.steps.extra["phases_by_rank"] = per_rank.to_dicts()
    d.data_quality["clock"] = _clock_quality(model.rank_offsets)
    if model.frames.relative_time:
        d.data_quality["clock"]["note"] = "relative-time records: each step keeps its own origin, clocks not fitted"
    return tl


def _blackbox(frames: JobFrames, config: DiagnoseConfig, d: Diagnosis) -> None:
    # only flow records need the flow analyses: a white-box job does not load them (~10 ms of its startup)
    from rankscope.analysis.stragglers.from_flows import flow_straggler_section
    from rankscope.analysis.strategy.flows.infer import infer_flows

    exp_off = exporter_clock_offsets(frames.flow)
    flow = apply_exporter_offsets(frames.flow, exp_off)
    res = infer_flows(flow, config.flow, frames.endpoint_map, one_job=bool(frames.job_endpoints))
    d.strategy = res.strategy
    d.steps = res.steps
    d.data_quality["flows"] = res.quality
    if res.job_flows is not None:
        d.stragglers = flow_straggler_section(res.job_flows, res.strategy, res.steps,
                                              res.quality.get("timestamp_resolution_ns", 1),
                                              config.stragglers.none_below, res.dp_pairs, exporter_clocks(exp_off))
    d.data_quality["exporter_clock"] = {
        "exporters": int(exp_off.height),
        "max_abs_offset_ns": float(exp_off["offset_ns"].abs().max()) if exp_off.height else 0.0}


def diagnose(frames: JobFrames, config: DiagnoseConfig | None = None,
             baseline: JobFrames | None = None) -> Diagnosis:
    """Run every analysis on one job. Needs: any subset of the record kinds (JobFrames)."""
    return analyze_job(frames, config, baseline)[0]


def _stragglers(model: JobModel, strategy: Strategy, config: DiagnoseConfig):
    """The one call of the straggler section: completed frames, and the layout where it takes one."""
    kw = {}
    if "layout" in inspect.signature(straggler_section).parameters:
        kw["layout"] = model.layout_columns()
    if "steps" in inspect.signature(straggler_section).parameters:
        kw["steps"] = model.steps
    return straggler_section(model.frames, strategy, config.stragglers, **kw)


def _hangs(model: JobModel, missing_ranks: list[int]) -> list[dict]:
    """The one call of the hang section: completed frames, and the ranks without records where it takes
    them (a missing trace alone is no hang)."""
    kw = {}
    if "missing_ranks" in inspect.signature(hang_section).parameters:
        kw["missing_ranks"] = missing_ranks
    return hang_section(model.frames, **kw)


def analyze_job(frames: JobFrames, config: DiagnoseConfig | None = None,
                baseline: JobFrames | None = None) -> tuple[Diagnosis, dict[str, pl.DataFrame]]:
    """:func:`diagnose` plus the tables the report's figures draw from.

    Returns (Diagnosis, tables) with tables ``timeline`` (per rank per step
    phases, white-box only), ``steps`` (step id, duration_ns, span_ns, warmup:
    the one step definition) and ``layout`` (rank, stage, dp_rank, tp_rank,
    pipeline, source).
    """
    config = config or DiagnoseConfig()
    d = Diagnosis(job=frames.job, sources=list(frames.sources))
    d.data_quality = data_quality(frames)
    model = build_job_model(frames, config.clock)
    tables: dict[str, pl.DataFrame] = {"layout": model.layout}
    has_comm = not frames.comm_op.is_empty()
    has_flow = not frames.flow.is_empty()
    if has_comm:
        tables["timeline"] = _whitebox(model, d)
        if has_flow:
            flows_only = Diagnosis(job=frames.job)
            _blackbox(frames, config, flows_only)
            d.strategy.extra["comparison"] = compare_strategies(d.strategy, flows_only.strategy,
                                                                frames.endpoint_map)
    elif has_flow:
        _blackbox(frames, config, d)
    else:
        d.strategy = Strategy(extra={"evaluated": False, "why": "no comm_op or flow records"})
        if not model.steps.is_empty():
            d.steps = steps_section(model.steps, model.steps_source)
        else:
            d.steps = Steps(extra={"evaluated": False, "why": "no step boundaries found"})
    d.data_quality["layout"] = {"source": model.layout["source"][0] if model.layout.height else "unknown",
                                "filled": model.filled, "notes": model.notes}
    flow_only = d.stragglers if has_flow and not has_comm else None
    d.stragglers = _stragglers(model, d.strategy, config)
    if flow_only is not None and d.stragglers.extra.get("evaluated") is False:
        d.stragglers = flow_only  # no per-rank records: the flows' own straggler evidence
    d.regressions = regression_section(model.frames, baseline, config.regressions)
    d.hangs = _hangs(model, d.data_quality.get("missing_ranks") or [])
    d.extra["findings"] = build_findings(d.stragglers, d.regressions)
    tables["steps"] = steps_frame(model.steps) if not model.steps.is_empty() else _flow_steps(d)
    return d, tables


def _flow_steps(d: Diagnosis) -> pl.DataFrame:
    durs = d.steps.extra.get("durations_ns") or []
    return pl.DataFrame({"step": list(range(len(durs))), "duration_ns": durs},
                        schema={"step": pl.Int64, "duration_ns": pl.Int64})
