"""The front door of the analysis: one job's frames in, one Diagnosis out.

Every analyzer is reached from here; the CLI, the dashboard and the notebooks call :func:`analyze_job`
(or :func:`diagnose`) and read the Diagnosis it returns. The job goes through the one job model
(:func:`rankscope.analysis.model.job_model.build_job_model`): its frames on one clock, its strategy
(white-box from comm_op, else black-box from its flows), its layout and its steps; then every section
reads the model: stragglers, regressions, hangs, timelines and data quality. Findings come from every
section into one list, the verdict's culprit first.
"""

from __future__ import annotations

from dataclasses import field, replace

import polars as pl

from rankscope.analysis.critical_path import critical_path_section
from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.hangs import hang_section
from rankscope.analysis.kernels.regressions import RegressionConfig, regression_section
from rankscope.analysis.model.clocks import ClockConfig
from rankscope.analysis.model.data_quality import data_quality
from rankscope.analysis.model.job_model import JobModel, build_job_model
from rankscope.analysis.model.steps import steps_frame
from rankscope.analysis.model.timelines import rank_timelines
from rankscope.analysis.network import Topology, network_view, traffic_findings
from rankscope.analysis.report.diagnosis import Diagnosis
from rankscope.analysis.report.steps import RankPhases, Steps
from rankscope.analysis.stragglers.config import StragglerConfig
from rankscope.analysis.stragglers.findings import findings_of
from rankscope.analysis.stragglers.section import straggler_section
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.job_frames import JobFrames
from rankscope.collectors.record_class import record

PHASES = ("compute_ns", "comm_ns", "exposed_comm_ns", "idle_ns", "exposed_wait_ns")


@record
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
    topology: Topology | None = None
    """where each flow endpoint hangs (``--topology``); None: inferred from the flow exporters."""

    def __post_init__(self):
        kinds = ((self.stragglers, StragglerConfig), (self.regressions, RegressionConfig),
                 (self.clock, ClockConfig), (self.flow, FlowConfig))
        bad = [type(v).__name__ for v, k in kinds if not isinstance(v, k)]
        if self.topology is not None and not isinstance(self.topology, Topology):
            bad.append(type(self.topology).__name__)
        if bad:
            raise ConfigError(f"DiagnoseConfig: got {', '.join(bad)}; expected StragglerConfig, RegressionConfig, "
                              "ClockConfig and FlowConfig")


def model_of(frames: JobFrames, config: DiagnoseConfig | None = None) -> JobModel:
    """The job model of one job's frames under a diagnosis' options."""
    config = config or DiagnoseConfig()
    return build_job_model(frames, config.clock, config.flow)


def model_timelines(model: JobModel) -> pl.DataFrame:
    """Per-rank, per-step phases from a job model (see :func:`rankscope.analysis.model.timelines.rank_timelines`)."""
    return rank_timelines(model.rank_steps, model.aligned_comm, model.aligned_compute)


def job_timelines(frames: JobFrames, config: DiagnoseConfig | None = None) -> pl.DataFrame:
    """Per-rank, per-step phases of one job (see :func:`rankscope.analysis.model.timelines.rank_timelines`)."""
    return model_timelines(model_of(frames, config))


def _with_phases(steps: Steps, timeline: pl.DataFrame) -> Steps:
    """The steps section with each rank's phase totals (white-box jobs with a timeline)."""
    if timeline.is_empty():
        return steps
    per_rank = timeline.group_by("rank").agg(pl.col(*PHASES).sum()).sort("rank")
    return replace(steps, phases_by_rank=[RankPhases(**r) for r in per_rank.iter_rows(named=True)])


def analyze_model(model: JobModel, config: DiagnoseConfig | None = None,
                  baseline: JobFrames | None = None) -> tuple[Diagnosis, dict[str, pl.DataFrame]]:
    """Every section of one job model: the Diagnosis and the tables the report's figures draw from.

    Tables: ``layout`` (rank, stage, dp_rank, tp_rank, pipeline, source), ``steps`` (step id,
    duration_ns, span_ns, warmup: the one step definition) and, for per-rank records, ``timeline``
    (per rank per step phases).
    """
    config = config or DiagnoseConfig()
    tables: dict[str, pl.DataFrame] = {"layout": model.layout, "steps": steps_frame(model.steps)}
    steps = model.steps_section
    if model.per_rank:
        tables["timeline"] = model_timelines(model)
        steps = _with_phases(steps, tables["timeline"])
    inter: dict = {}
    stragglers = straggler_section(model, config.stragglers, inter)
    # right after the what-if whose graph it reuses, and that graph (with its replay plans: ~0.3 GB at
    # 1,024 workers) is let go before the other sections run
    critical_path = critical_path_section(model, inter)
    inter.clear()
    regressions = regression_section(model, baseline, config.regressions)
    traffic, placement, topology = _network(model, config.topology)
    d = Diagnosis(job=model.frames.job, sources=list(model.frames.sources), strategy=model.strategy, steps=steps,
                  stragglers=stragglers, regressions=regressions, hangs=hang_section(model),
                  data_quality=_with_topology(data_quality(model), topology),
                  critical_path=critical_path,
                  findings=findings_of(stragglers, regressions) + traffic_findings(traffic), traffic=traffic,
                  placement=placement)
    return d, tables


def _network(model: JobModel, topology: Topology | None):
    """The traffic and placement sections of a flow job (None without flows: white-box reports keep their
    shape)."""
    if model.flows is None or model.per_rank:
        return None, None, None
    return network_view(model.strategy, model.flows.inference.job_flows, model.steps_section.count, topology)


def _with_topology(quality, topology: Topology | None):
    """data_quality.flows says where the topology came from (a file, or inferred from the exporters: how
    many endpoints were placed, and which only as a guess)."""
    if topology is None or quality.flows is None:
        return quality
    return replace(quality, flows={**quality.flows, "topology": {"source": topology.source,
                                                                 "endpoints": len(topology.rows),
                                                                 "notes": list(topology.notes)}})


def analyze_job(frames: JobFrames, config: DiagnoseConfig | None = None,
                baseline: JobFrames | None = None) -> tuple[Diagnosis, dict[str, pl.DataFrame]]:
    """:func:`diagnose` plus the tables the report's figures draw from (see :func:`analyze_model`)."""
    return analyze_model(model_of(frames, config), config, baseline)


def diagnose(frames: JobFrames, config: DiagnoseConfig | None = None,
             baseline: JobFrames | None = None) -> Diagnosis:
    """Run every analysis on one job. Needs: any subset of the record kinds (JobFrames)."""
    return analyze_job(frames, config, baseline)[0]
