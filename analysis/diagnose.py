"""The front door of the analysis: one job's frames in, one Diagnosis out.

Every analyzer is reached from here; the CLI, the dashboard and the notebooks call :func:`analyze_job`
(or :func:`diagnose`) and read the Diagnosis it returns. The job goes through the one job model
(:func:`rankscope.analysis.model.job_model.build_job_model`): its frames on one clock, its strategy
(white-box from comm_op, else black-box from its flows), its layout and its steps; then every section
reads the model: stragglers, regressions, hangs, timelines and data quality. Findings come from every
section into one list, the verdict's culprit first.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import field, replace

import polars as pl

from rankscope.analysis.critical_path import critical_path_section, section_of_graph
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
    beside = _sections_beside(model)
    with ThreadPoolExecutor(1, thread_name_prefix="rankscope-sections") as pool:
        # the polars-bound sections run beside the what-if replays, which are numpy loops holding the GIL
        # between calls: the two overlap on a second core (sections are pure functions of the model)
        timeline = pool.submit(_timeline, model) if beside else _timeline(model)
        others = pool.submit(_other_sections, model, baseline, config) if beside else None
        inter: dict = {}
        path: list = []

        def path_beside(graph, ideal):
            # queued behind the sections above on the second thread: it starts once they are done
            path.append(pool.submit(section_of_graph, model, graph, ideal))

        stragglers = straggler_section(model, config.stragglers, inter,
                                       on_graph=path_beside if beside and _path_beside(model) else None)
        # reuses the what-if's graph, which (with its replay plans: ~0.3 GB at 1,024 workers) is let go after
        critical_path = path[0].result() if path else critical_path_section(model, inter)
        inter.clear()
        timeline = timeline.result() if beside else timeline
        regressions, hangs, quality, (traffic, placement, topology) = (
            others.result() if beside else _other_sections(model, baseline, config))
    steps = model.steps_section
    if timeline is not None:
        tables["timeline"] = timeline
        steps = _with_phases(steps, timeline)
    d = Diagnosis(job=model.frames.job, sources=list(model.frames.sources), strategy=model.strategy, steps=steps,
                  stragglers=stragglers, regressions=regressions, hangs=hangs,
                  data_quality=_with_topology(quality, topology),
                  critical_path=critical_path,
                  findings=findings_of(stragglers, regressions) + traffic_findings(traffic), traffic=traffic,
                  placement=placement)
    return d, tables


BESIDE_BUDGET_BYTES = 256 << 20
"""Most memory the sections run beside the replays may add to the peak (:func:`_sections_beside`)."""
BESIDE_BYTES_PER_RECORD = 48
"""What running the sections beside the replays added to the peak, per comm_op, compute_op and flow record:
45 bytes on the OSDI'25 AR trace tiled 16x (1.9 M records, +84 MiB, median of 4) and 31 on 16,384 simulated
GPUs (12.7 M records, +400 MiB: 7.81 -> 8.21 GiB)."""


def _sections_beside(model: JobModel) -> bool:
    """Whether the timeline, regressions, hangs, data quality and network sections run on a second thread
    beside the straggler and critical-path replays: they then overlap on a second core (AR tiled 16x: 5.56
    -> 4.96 s wall, 4 interleaved runs), but their working sets add to the replays' peak, so only while that
    stays within :data:`BESIDE_BUDGET_BYTES`; a bigger job runs them in order."""
    f = model.frames
    records = sum(x.height for x in (f.comm_op, f.compute_op, f.flow) if x is not None)
    return records * BESIDE_BYTES_PER_RECORD <= BESIDE_BUDGET_BYTES


PATH_BESIDE_MAX_RECORDS = 500_000
"""Most comm_op and compute_op records of a job whose critical path runs on the second thread as soon as the
what-if's graph exists, beside the rest of the straggler section (:func:`_path_beside`)."""


def _path_beside(model: JobModel) -> bool:
    """Whether the critical path runs beside the straggler section's evidence (its replays of sequences, links
    and ranks) rather than after it: on a small job the second core is idle by then. Its working set would add
    to the straggler section's peak, which decides a big job's memory, so a big job keeps the order."""
    f = model.frames
    return f.comm_op.height + f.compute_op.height <= PATH_BESIDE_MAX_RECORDS


def _timeline(model: JobModel) -> pl.DataFrame | None:
    """Per-rank, per-step phases of a job with per-rank records; None without."""
    return model_timelines(model) if model.per_rank else None


def _other_sections(model: JobModel, baseline: JobFrames | None, config: DiagnoseConfig) -> tuple:
    """(regressions, hangs, data quality, network view) of one job model."""
    return (regression_section(model, baseline, config.regressions), hang_section(model), data_quality(model),
            _network(model, config.topology))


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
