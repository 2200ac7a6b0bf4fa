"""The one job model: what every section of a diagnosis reads, built once per job.

:func:`build_job_model` takes one job's records and returns a :class:`JobModel`:

- ``strategy``: the job's strategy: white-box from comm_op (exact) when the job has comm_op, else
  black-box from its flow records; ``whitebox`` and ``flows`` keep each side, and a job with both gets
  their comparison;
- ``flows``: the job's flow records on one clock (exporter offsets applied) and what they tell
  (:class:`FlowView`);
- ``layout``: one row per rank with stage, dp_rank, tp_rank and pipeline.
  Record columns win where they exist (``stage`` of compute_op/comm_op,
  ``dp_rank``, ``tp_rank``); the rest comes from the inferred strategy: the
  position in the rank's pp group is its stage, the pp group's index its
  pipeline, the position in its dp (tp) group its dp (tp) rank. ``source``
  says which;
- ``frames``: the *completed* frames, on the recorded clocks. Where the raw
  records had nulls, compute_op gets stage (from the layout), step (from the
  rank's step windows) and microbatch, and comm_op gets step and microbatch.
  Microbatch ids come from span order: in both 1F1B and GPipe a rank runs
  the forwards of a step's microbatches in order and their backwards in the
  same order, so the k-th forward (backward) span of a (rank, step) is
  microbatch k when the rank has as many forwards as backwards; kernels take
  the id of the forward/backward span that encloses them; the k-th send
  (recv) to (from) one peer in a step carries microbatch k. Both only when
  the schedule is not interleaved (:func:`regular_pipeline`); otherwise
  stage and microbatch stay unknown and ``notes`` says why (a virtual stage
  is not the rank's pipeline position);
- ``aligned_comm``, ``aligned_compute``, ``aligned_step_mark``: the records
  on one clock (``rank_offsets``), with the completed labels (relative-time
  traces are left as recorded: every step has its own origin, so there is
  no clock to fit);
- ``rank_steps`` and ``steps``: the one step definition of :mod:`steps` (for a flows-only job, the
  steps the flows' period gives), and ``steps_section``, the report's steps;
- ``coverage``: the ranks the sources declare and those no record covers.

A rank recorded by two sources at once (the live hook and the profiler of
the same run) would count each call twice, and the replay would see each
collective wait on its own copy (a cycle). So comm_op and step_mark keep one
source per rank (:func:`one_source_per_rank`): comm_op the source that names
its process groups most often (the hook does, gloo Kineto does not), then the
one with the most records; step_mark the source of the rank's compute
records (their step labels come from the same marks), else comm_op's.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.model.clocks import (
    ClockConfig,
    apply_exporter_offsets,
    apply_rank_offsets,
    exporter_clock_offsets,
    exporter_clocks,
    rank_clock_offsets,
)
from rankscope.analysis.model.coverage import RECORD_KINDS, Coverage, rank_coverage, usable_claims
from rankscope.analysis.model.labels import (
    complete_comm,
    complete_compute,
    filled_counts,
    regular_pipeline,
    with_labels,
    with_steps,
)
from rankscope.analysis.model.layout import rank_layout
from rankscope.analysis.model.sources import one_source_each
from rankscope.analysis.model.steps import flow_step_table, job_steps, rank_step_windows, steps_section
from rankscope.analysis.report.steps import Steps
from rankscope.analysis.report.strategy import Strategy
from rankscope.analysis.strategy.call_positions import pass_spans
from rankscope.analysis.strategy.compare import compare_strategies
from rankscope.analysis.strategy.flows.infer import FlowInference, infer_flows
from rankscope.analysis.strategy.group_names import with_group_names
from rankscope.analysis.strategy.groups_from_streams import label_groups, memberships_from
from rankscope.analysis.strategy.whitebox import infer_whitebox
from rankscope.collectors.job_frames import JobFrames
from rankscope.collectors.record_class import record

NO_RECORDS = "no comm_op or flow records"


@record
class FlowView:
    """A job's flow records on one clock, and what the flows alone tell of the job."""

    flow: pl.DataFrame
    """the flow records with each exporter's offset applied."""
    exporter_offsets: pl.DataFrame
    """exporter, offset_ns, num_matched (:func:`rankscope.analysis.model.clocks.exporter_clock_offsets`)."""
    clocks: dict[str, str]
    """exporter -> the clock its times are on after the offsets."""
    inference: FlowInference
    """the black-box strategy, steps and pair-traffic quality, and the job's own training flows."""


@record
class JobModel:
    """One job as every analysis sees it (see module docstring)."""

    frames: JobFrames
    """completed frames on the recorded clocks (what the what-if replays)."""
    aligned_comm: pl.DataFrame
    aligned_compute: pl.DataFrame
    aligned_step_mark: pl.DataFrame
    rank_offsets: pl.DataFrame
    strategy: Strategy
    """the job's strategy (white-box when it has comm_op, else from its flows, else not evaluated)."""
    whitebox: Strategy | None
    """the strategy from comm_op alone; None without comm_op."""
    flows: FlowView | None
    """the job's flows and their reading; None without flow records."""
    layout: pl.DataFrame
    """rank, stage, dp_rank, tp_rank, pipeline (Int64, null where unknown), source."""
    rank_steps: pl.DataFrame
    """rank, step, start_ns, end_ns on the aligned clock."""
    steps: pl.DataFrame
    """the job's steps (:data:`rankscope.analysis.model.steps.STEP_SCHEMA`)."""
    steps_section: Steps
    """the report's steps."""
    records: dict[str, int]
    """records of each kind as loaded (before one source per rank was kept)."""
    coverage: Coverage
    """declared ranks and the ones no record covers."""
    filled: dict
    """how many nulls the model filled, per frame and column."""
    notes: list[str]
    """what the model could not fill, and why."""

    @property
    def per_rank(self) -> bool:
        """Whether the job has per-rank records (collectives), not flows alone."""
        return not self.frames.comm_op.is_empty()

    def layout_columns(self) -> pl.DataFrame:
        """The layout in the straggler contract's columns: rank, stage, dp_rank, tp_rank, pipeline."""
        return self.layout.select("rank", "stage", "dp_rank", "tp_rank", "pipeline")


def flow_view(frames: JobFrames, config: FlowConfig | None = None) -> FlowView | None:
    """The job's flows on one clock and their black-box reading; None without flow records."""
    if frames.flow.is_empty():
        return None
    offsets = exporter_clock_offsets(frames.flow)
    flow = apply_exporter_offsets(frames.flow, offsets)
    inference = infer_flows(flow, config or FlowConfig(), frames.endpoint_map, one_job=bool(frames.job_endpoints))
    return FlowView(flow=flow, exporter_offsets=offsets, clocks=exporter_clocks(offsets), inference=inference)


def declared_layout(white: Strategy, declared: list[dict]) -> Strategy:
    """The white-box strategy with the job's world size and tp from a source that declares its layout.

    Traces that keep one rank per tensor-parallel (or data-sequence-parallel) group, as the OSDI'25 what-if
    traces do, show only those ranks: their collectives tell DP and PP, but tp and the world size are the
    declared layout's. The tp groups' other members are absent, so the groups are not listed."""
    layouts = [d for d in usable_claims(declared)[0] if d.get("layout")]
    if not layouts:
        return white
    world = max(d["world_size"] for d in layouts)
    tp = max(d.get("tp_size", 1) for d in layouts)
    if world <= white.world_size and tp == (white.tp or 1):
        return white
    note = (f"world size {world} and tp {tp} from the layout the source declares ({layouts[0]['format']}); the "
            f"records hold {white.world_size} of its ranks")
    return replace(white, world_size=max(world, white.world_size), tp=tp,
                   tp_groups=white.tp_groups if tp == (white.tp or 1) else None, notes=[*(white.notes or []), note])


def _strategy(white: Strategy | None, flows: FlowView | None, endpoint_map: pl.DataFrame,
              declared: list[dict]) -> Strategy:
    if white is not None:
        white = declared_layout(white, declared)
    if white is not None and flows is not None:
        return replace(white, comparison=compare_strategies(white, flows.inference.strategy, endpoint_map))
    if white is not None:
        return white
    if flows is not None:
        return flows.inference.strategy.claimed()
    return Strategy(evaluated=False, why=NO_RECORDS)


def _steps_section(table: pl.DataFrame, source: str, per_rank: bool, flows: FlowView | None) -> Steps:
    if per_rank or (flows is None and not table.is_empty()):
        return steps_section(table, source)
    if flows is not None:
        return flows.inference.steps
    return Steps(evaluated=False, why="no step boundaries found")


def build_job_model(frames: JobFrames, clock: ClockConfig | None = None, flow: FlowConfig | None = None) -> JobModel:
    """Build the model of one job. Needs any subset of the record kinds (JobFrames)."""
    notes: list[str] = []
    records = {k: getattr(frames, k).height for k in RECORD_KINDS}
    coverage = rank_coverage(frames)
    frames = one_source_each(frames, notes)
    frames = _groups_from_streams(frames, notes)
    white = (infer_whitebox(frames.comm_op, timing=not frames.relative_time, passes=pass_spans(frames.compute_op))
             if not frames.comm_op.is_empty() else None)
    if white is not None and frames.named_groups:
        white = with_group_names(white, frames.named_groups)  # the job's own names outrank the inference
    flows = flow_view(frames, flow)
    layout = rank_layout(frames, white)
    # steps from the records as given (labels and marks), on the aligned clock
    offsets = (rank_clock_offsets(frames.comm_op, clock) if not frames.relative_time
               else rank_clock_offsets(frames.comm_op.head(0), clock))
    mark = apply_rank_offsets(frames.step_mark, offsets)
    comm_a = apply_rank_offsets(frames.comm_op, offsets)
    comp_a = apply_rank_offsets(frames.compute_op, offsets)
    windows = rank_step_windows(mark, comm_a, comp_a)
    source = "step_mark" if not frames.step_mark.is_empty() else "step column"
    # on relative time every window of a rank starts at 0: only a record's own label can place it in a step
    step_windows = windows if not frames.relative_time else windows.head(0)
    comp = with_steps(frames.compute_op, comp_a, step_windows)
    comm = with_steps(frames.comm_op, comm_a, step_windows)
    regular, why = regular_pipeline(comm, comp, white)
    if not regular:
        notes.append(f"stage and microbatch not filled from the layout and span order: {why}")
    comp = complete_compute(comp, layout if regular else layout.head(0), regular)
    comm = complete_comm(comm, comp, regular)
    filled = filled_counts({"compute_op": (frames.compute_op, comp), "comm_op": (frames.comm_op, comm)})
    done = replace(frames, compute_op=comp, comm_op=comm)
    table = job_steps(windows, frames.relative_time)
    per_rank = not frames.comm_op.is_empty()
    section = _steps_section(table, source, per_rank, flows)
    if table.is_empty() and flows is not None and not per_rank:
        table = flow_step_table(section)
    return JobModel(frames=done, aligned_comm=with_labels(comm_a, comm), aligned_compute=with_labels(comp_a, comp),
                    aligned_step_mark=mark, rank_offsets=offsets,
                    strategy=_strategy(white, flows, frames.endpoint_map, frames.declared), whitebox=white,
                    flows=flows,
                    layout=layout, rank_steps=windows, steps=table, steps_section=section,
                    records=records, coverage=coverage, filled=filled, notes=notes)


def _groups_from_streams(frames: JobFrames, notes: list[str]) -> JobFrames:
    """Collectives without a group get one from their stream and the declared memberships."""
    members = memberships_from(frames.declared)
    if not members:
        return frames
    comm, res = label_groups(frames.comm_op, members)
    if res.get("labelled"):
        notes.append(f"process groups of {res['labelled']} of {res['streams']} collective stream(s) matched "
                     f"from declared memberships by end times ({res['undecided']} undecided)")
    elif res.get("streams"):
        notes.append(f"{res['streams']} collective stream(s) without a group; none matched a declared group")
    return replace(frames, comm_op=comm) if res.get("labelled") else frames
