"""The front door of the analysis: one job's frames in, one Diagnosis out.

Every analyzer is reached from here; the CLI, the dashboard and the notebooks
call :func:`diagnose` and read the Diagnosis it returns. Strategy comes from
comm_op records when the job has them (white-box, exact), else from flow
records (black-box); with both and an endpoint_map the two are compared.
Rank clocks are aligned before step boundaries and per-rank timelines are
built; :func:`job_timelines` exposes the timeline table itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from rankscope.analysis.clock_align import (
    ClockConfig,
    apply_exporter_offsets,
    apply_rank_offsets,
    exporter_clock_offsets,
    rank_clock_offsets,
)
from rankscope.analysis.diagnosis import Diagnosis, Steps, Strategy
from rankscope.analysis.findings import build_findings
from rankscope.analysis.flow_config import FlowConfig
from rankscope.analysis.hangs import hang_section
from rankscope.analysis.regressions import RegressionConfig, regression_section
from rankscope.analysis.stragglers import StragglerConfig, straggler_section
from rankscope.analysis.strategy_compare import compare_strategies
from rankscope.analysis.strategy_flows import infer_flows
from rankscope.analysis.strategy_whitebox import infer_whitebox
from rankscope.analysis.timelines import rank_timelines, step_table, steps_section
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
            "num_rejected": int(sum(frames.rejects.values())), "relative_time": frames.relative_time}


@dataclass
class AlignedJob:
    """A job's per-rank records on one clock, with the corrections that were applied."""

    comm_op: pl.DataFrame
    compute_op: pl.DataFrame
    step_mark: pl.DataFrame
    rank_offsets: pl.DataFrame


def align_job(frames: JobFrames, config: ClockConfig | None = None) -> AlignedJob:
    """Align comm_op, compute_op and step_mark of one job (needs comm_op collectives for the fit)."""
    off = rank_clock_offsets(frames.comm_op, config)
    return AlignedJob(comm_op=apply_rank_offsets(frames.comm_op, off),
                      compute_op=apply_rank_offsets(frames.compute_op, off),
                      step_mark=apply_rank_offsets(frames.step_mark, off), rank_offsets=off)


def job_timelines(frames: JobFrames, config: DiagnoseConfig | None = None) -> pl.DataFrame:
    """Per-rank, per-step phases of one job (see :func:`rankscope.analysis.timelines.rank_timelines`)."""
    config = config or DiagnoseConfig()
    a = align_job(frames, config.clock)
    return rank_timelines(step_table(a.step_mark, a.comm_op, a.compute_op), a.comm_op, a.compute_op)


def _clock_quality(off: pl.DataFrame) -> dict:
    if off.is_empty():
        return {"domains": 0, "max_abs_offset_ns": 0.0, "max_abs_drift": 0.0}
    return {"domains": int(off["domain"].n_unique()), "max_abs_offset_ns": float(off["offset_ns"].abs().max()),
            "max_abs_drift": float(off["drift"].abs().max())}


def _whitebox(frames: JobFrames, config: DiagnoseConfig, d: Diagnosis) -> pl.DataFrame:
    d.strategy = infer_whitebox(frames.comm_op)
    a = align_job(frames, config.clock)
    steps = step_table(a.step_mark, a.comm_op, a.compute_op)
    source = "step_mark" if not frames.step_mark.is_empty() else "step column"
    d.steps = steps_section(steps, source)
    tl = rank_timelines(steps, a.comm_op, a.compute_op)
    if not tl.is_empty():
        per_rank = tl.group_by("rank").agg(pl.col("compute_ns", "comm_ns", "exposed_comm_ns", "idle_ns",
                                                  "exposed_wait_ns").sum()).sort("rank")
        d.steps.extra["phases_by_rank"] = per_rank.to_dicts()
    d.data_quality["clock"] = _clock_quality(a.rank_offsets)
    return tl


def _blackbox(frames: JobFrames, config: DiagnoseConfig, d: Diagnosis) -> None:
    exp_off = exporter_clock_offsets(frames.flow)
    flow = apply_exporter_offsets(frames.flow, exp_off)
    res = infer_flows(flow, config.flow, frames.endpoint_map)
    d.strategy = res.strategy
    d.steps = res.steps
    d.data_quality["flows"] = res.quality
    d.data_quality["exporter_clock"] = {
        "exporters": int(exp_off.height),
        "max_abs_offset_ns": float(exp_off["offset_ns"].abs().max()) if exp_off.height else 0.0}


def diagnose(frames: JobFrames, config: DiagnoseConfig | None = None,
             baseline: JobFrames | None = None) -> Diagnosis:
    """Run every analysis on one job. Needs: any subset of the record kinds (JobFrames)."""
    return analyze_job(frames, config, baseline)[0]


def analyze_job(frames: JobFrames, config: DiagnoseConfig | None = None,
                baseline: JobFrames | None = None) -> tuple[Diagnosis, dict[str, pl.DataFrame]]:
    """:func:`diagnose` plus the tables the report's figures draw from.

    Returns (Diagnosis, tables) with tables ``timeline`` (per rank per step
    phases, white-box only) and ``steps`` (step, duration_ns).
    """
    config = config or DiagnoseConfig()
    d = Diagnosis(job=frames.job, sources=list(frames.sources))
    d.data_quality = data_quality(frames)
    tables: dict[str, pl.DataFrame] = {}
    has_comm = not frames.comm_op.is_empty()
    has_flow = not frames.flow.is_empty()
    if has_comm:
        tables["timeline"] = _whitebox(frames, config, d)
        if has_flow:
            flows_only = Diagnosis(job=frames.job)
            _blackbox(frames, config, flows_only)
            d.strategy.extra["comparison"] = compare_strategies(d.strategy, flows_only.strategy,
                                                                frames.endpoint_map)
    elif has_flow:
        _blackbox(frames, config, d)
    else:
        d.strategy = Strategy(extra={"evaluated": False, "why": "no comm_op or flow records"})
        if not frames.step_mark.is_empty() or not frames.compute_op.is_empty():
            d.steps = steps_section(step_table(frames.step_mark, frames.comm_op, frames.compute_op), "step_mark")
        else:
            d.steps = Steps(extra={"evaluated": False, "why": "no step boundaries found"})
    d.stragglers = straggler_section(frames, d.strategy, config.stragglers)
    d.regressions = regression_section(frames, baseline, config.regressions)
    d.hangs = hang_section(frames)
    d.extra["findings"] = build_findings(d.stragglers, d.regressions)
    durs = d.steps.extra.get("durations_ns") or []
    tables["steps"] = pl.DataFrame({"step": list(range(len(durs))), "duration_ns": durs},
                                   schema={"step": pl.Int64, "duration_ns": pl.Int64})
    return d, tables
