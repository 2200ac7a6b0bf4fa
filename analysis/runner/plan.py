"""The one job plan: which jobs a store holds and how a flow capture splits into jobs.

``rankscope analyze`` and the dashboard both call :func:`plan_jobs` and
:func:`load_planned`, so a report and a dashboard page of the same name
always hold the same records. Naming follows design.md: each training job
(a store job with comm_op, compute_op or step_mark records) by its name; each
job that job recognition finds in a flow-only capture P as ``P`` when there
is one, else ``P-1``, ``P-2``, ... Non-training traffic gets no job.

This module reads a Store (the one place in analysis that does) because
planning needs job recognition, which lives here and not in collectors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, field, replace

from rankscope.analysis.diagnose import analyze_job
from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.recognise import FabricJobs, RecognisedJob, job_flows, recognise_jobs
from rankscope.analysis.report.diagnosis import Diagnosis
from rankscope.analysis.runner.cache import ResultCache, result_key, store_version
from rankscope.collectors.job_frames import JobFrames, load_job
from rankscope.collectors.record_class import record
from rankscope.collectors.store import Store

TRAINING_KINDS = ("comm_op", "compute_op", "step_mark")


@record
class PlannedJob:
    """One job to analyse: a training job of the store, or a job recognised in a flow capture."""

    name: str
    """the report name."""
    kind: str
    """``job`` (a training job's own records) or ``capture`` (a job recognised in a flow-only capture)."""
    source: str
    """the store job its records are read from: the training job or the capture."""
    endpoints: tuple[str, ...] = ()
    """a capture job's endpoint addresses (its flows are those among them)."""
    flow_job: str | None = None
    """a training job's flow capture to compare with (needs an endpoint_map)."""
    quality: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    """job recognition's figures about the capture (fabric quality), for data_quality."""


def training_jobs(store: Store) -> list[str]:
    """Store jobs with comm_op, compute_op or step_mark records."""
    return [j for j in store.jobs() if any(store.count(k, j) for k in TRAINING_KINDS)]


def flow_captures(store: Store, training: list[str]) -> list[str]:
    """The store's flow captures: jobs with flow records that are not training jobs."""
    return [j for j in store.jobs() if j not in training and store.count("flow", j)]


def plan_jobs(store: Store, job: str | None = None, flow_job: str | None = None,
              flow: FlowConfig | None = None, recognise: Callable[[str], FabricJobs] | None = None
              ) -> list[PlannedJob]:
    """The jobs to analyse, training jobs first, then the jobs of each flow-only capture.

    ``job`` keeps only that one (a training job, a capture, or a job found in
    one, e.g. ``fabric-2``); ``flow_job`` names the capture a training job's
    comm_op records are compared with. An empty list means nothing matched.
    ``recognise(capture)``: job recognition of one capture, when not in this process from its whole
    flow records (:func:`rankscope.analysis.runner.capture_split.recognise_split`).
    """
    flow = flow or FlowConfig()
    training = training_jobs(store)
    if job is not None and job in training:
        return [PlannedJob(job, "job", job, flow_job=flow_job)]
    captures = flow_captures(store, training)
    plan = [PlannedJob(j, "job", j, flow_job=flow_job) for j in training] if job is None else []
    for cap in captures:
        if job is not None and job != cap and not job.startswith(cap + "-"):
            continue
        found = recognised_jobs(store, cap, flow, recognise)
        for rj in found.jobs:
            if job is None or job in (cap, rj.name):
                plan.append(PlannedJob(rj.name, "capture", cap, tuple(rj.endpoints), quality=found.quality))
    return plan


def why_no_jobs(store: Store, flow: FlowConfig) -> list[str]:
    """For each flow capture of the store in which no training job was recognised, one line saying what
    was set apart and why: `analyze` then says why it has nothing to analyse instead of only that."""
    lines = []
    for cap in flow_captures(store, training_jobs(store)):
        found = recognised_jobs(store, cap, flow)
        if found.jobs:
            continue
        q = found.quality
        rejected, undecided = q.get("not_training") or [], q.get("undecided_job_or_storage") or []
        parts = []
        if rejected:
            no_grid = sum(not r.get("grid_valid") for r in rejected)
            parts.append(f"{len(rejected)} connected set(s) of heavy links without a training job's shape "
                         f"({no_grid} fit no DP x PP grid of collectives; {len(rejected) - no_grid} fit one but "
                         f"show neither repeated bursts nor rail copies; first endpoint {rejected[0]['first']})")
        if undecided:
            parts.append(f"{len(undecided)} set(s) that could be a job or its storage either way (first endpoint "
                         f"{undecided[0]['first']}; {undecided[0]['reason']})")
        if not parts:
            parts.append(f"no heavy, repeated traffic between {q.get('non_training_endpoints', 0)} endpoint(s)")
        lines.append(f"capture {cap}: " + "; ".join(parts))
    return lines


def recognised_jobs(store: Store, capture: str, flow: FlowConfig,
                    recognise: Callable[[str], FabricJobs] | None = None) -> FabricJobs:
    """Job recognition on one flow capture, through the store's result cache: every `analyze` and every
    dashboard start plans the store's jobs, and recognition on a large capture costs seconds (1.7 s for a
    4,096-GPU fabric) even when the analysis itself is answered from the cache. ``recognise``: as for
    :func:`plan_jobs`; both ways share one cache entry (they give the same jobs)."""
    cache = ResultCache(store)
    key = result_key("recognise_jobs", [store_version(store, [capture])], (capture, flow))
    hit = cache.get_json(key)
    if hit is not None:
        try:
            return FabricJobs([RecognisedJob(**j) for j in hit["jobs"]], hit["quality"])
        except (TypeError, KeyError):
            pass  # an entry of another shape is a miss
    found = recognise(capture) if recognise is not None else recognise_jobs(store.read("flow", capture), capture, flow)
    cache.put_json(key, {"jobs": [asdict(j) for j in found.jobs], "quality": found.quality})
    return found


def load_planned(store: Store, planned: PlannedJob, fresh=None) -> JobFrames:
    """The frames of one planned job (named ``planned.name``).

    A capture's job gets only the flows among its endpoints; a training job
    compared with a capture that holds other jobs too keeps only its own addresses. ``fresh``
    (:class:`~rankscope.collectors.fresh_rows.FreshRows`): rows just ingested by this process, used
    instead of re-reading a training job's Parquet where they are the whole of it.
    """
    if planned.kind == "job":
        frames = load_job(store, planned.source, flow_job=planned.flow_job, fresh=fresh)
        if planned.flow_job and not frames.endpoint_map.is_empty():
            frames.flow = job_flows(frames.flow, frames.endpoint_map["address"].to_list())
        frames.job = planned.name
        return frames
    cap = planned.source
    maps = {"endpoint_map": store.read("endpoint_map", cap)} if store.count("endpoint_map", cap) else {}
    frames = JobFrames.from_frames(planned.name, flow=job_flows(store.read("flow", cap), list(planned.endpoints)),
                                   **maps)
    frames.job_endpoints = tuple(planned.endpoints)
    return frames


def with_capture(d: Diagnosis, planned: PlannedJob) -> Diagnosis:
    """The report of a job recognised in a flow capture names the capture and what recognition counted."""
    if planned.kind != "capture":
        return d
    return replace(d, data_quality=replace(d.data_quality, capture=planned.source, fabric=planned.quality))


def analyse_planned(store: Store, planned: PlannedJob, config, fresh=None) -> tuple[Diagnosis, dict]:
    """(Diagnosis, tables) of one planned job, read from the store."""
    d, tables = analyze_job(load_planned(store, planned, fresh), config)
    return with_capture(d, planned), tables
