"""The straggler section of one job, from its model: the basis its records allow, and its findings.

- per-rank records with compute: the what-if replay of the job's dependency graph (basis ``compute``),
  unless its ranks have no stage peers or the replay contradicts the record; then collective arrival
  skew with what the compute records still show (:mod:`arrival`);
- per-rank collectives alone (hooks): collective arrival skew (basis ``arrival_skew``);
- flow records alone: the flows' own evidence (basis ``flows``, :mod:`from_flows`).

Start-up steps (the one step definition's warm-up that stands out from the job's pace) are left out of
the what-if. Records that do not form a replayable graph cost this section only, never the whole report.
"""

from __future__ import annotations

import time
from dataclasses import replace

import polars as pl

from rankscope.analysis.model.job_model import JobModel
from rankscope.analysis.model.steps import startup_steps
from rankscope.analysis.report.steps import Warmup
from rankscope.analysis.report.stragglers import Stragglers
from rankscope.analysis.stragglers.arrival import arrival_section, arrival_with_compute_evidence
from rankscope.analysis.stragglers.config import StragglerConfig
from rankscope.analysis.stragglers.from_flows import flow_straggler_section
from rankscope.analysis.stragglers.replay_section import OnGraph, replay_section
from rankscope.analysis.whatif.graph import WhatIfInputError
from rankscope.collectors.errors import RankscopeError
from rankscope.collectors.job_frames import JobFrames

REPLAY_MAX_REL_ERR = 0.25
"""the replay with the recorded launch delays must reproduce each recorded step within this."""
NOISE_WHY = "S < 1: the ideal replay is no faster than the record; within measurement noise"


def no_stage_peers(layout) -> str | None:
    """Why the compute replay cannot judge a pipeline whose ranks have no stage peers (dp = 1, tp = 1).

    Its ideal puts each op at its stage peers' typical duration; with no peers a rank is its own
    ideal, so neither a slow GPU nor a stage with more work shows in S (OSDI'25's M_S would fix the
    last stage only)."""
    if layout is None or layout.is_empty() or layout["stage"].null_count() == layout.height:
        return None
    per = layout.filter(pl.col("stage").is_not_null()).group_by("stage").len()
    if per.height > 1 and per["len"].max() == 1:
        return ("no rank has stage peers (dp = 1, tp = 1): the replay's ideal is each rank's stage peers' "
                "typical time, so it cannot see a slow rank or stage here")
    return None


def replay_contradiction(s: Stragglers) -> str | None:
    """Why the compute replay of a section cannot be trusted, or None.

    Replaying the recorded durations with the recorded launch delays must give back the recorded
    steps; real CPU traces (gloo under the profiler: async sends, nested spans, descheduled passes) can
    break the dependency model. (A what-if share below 0 is no such sign: the ideal is each op type's
    mean, so "fixing" a fast stage lengthens it.)
    """
    if not s.evaluated or s.basis != "compute" or s.replay is None:
        return None
    err = s.replay.launch_delay.get("replay_vs_recorded_max_rel_err")
    if err is not None and err > REPLAY_MAX_REL_ERR:
        return (f"the replay of the recorded durations misses a recorded step by {err:.0%}: the dependency "
                "model does not fit these records")
    return None


def honest(s: Stragglers) -> Stragglers:
    """S below 1 is measurement noise (the replay of recorded durations ran longer than the record),
    never negative waste."""
    if s.slowdown < 1.0:
        return replace(s, noise=True, slowdown_measured=s.slowdown, why_noise=NOISE_WHY, waste_fraction=0.0)
    return replace(s, noise=False)


def _comm_only(frames: JobFrames) -> bool:
    comp = frames.compute_op
    has_compute = comp.height > 0 and comp["step"].drop_nulls().len() > 0
    return not has_compute and frames.comm_op.height > 0


def _per_rank(frames: JobFrames, config: StragglerConfig, layout: pl.DataFrame,
              on_graph: OnGraph | None = None) -> tuple[Stragglers, dict]:
    """The section from per-rank records, and the intermediate results (graph, metrics, ideal) for exports.

    ``frames``: the job model's completed frames (some steps may be left out); ``layout``: its layout
    (rank, stage, dp_rank, tp_rank, pipeline). Hook records alone (comm_op, no compute_op) are judged by
    collective arrival skew (basis ``arrival_skew``); the intermediate results are then empty.
    ``on_graph``: as :func:`~rankscope.analysis.stragglers.replay_section.replay_section` (not called
    without a replay).
    """
    t0 = time.perf_counter()
    if _comm_only(frames):
        s, inter = arrival_section(frames, config, layout), {}
    else:
        s, inter = replay_section(frames, config, layout, on_graph)
        why = no_stage_peers(layout) or replay_contradiction(s)
        if why is not None:
            s = arrival_with_compute_evidence(frames, config, layout, s, inter, why)
    return honest(replace(s, seconds=time.perf_counter() - t0)), inter


def analyze_stragglers(model: JobModel, config: StragglerConfig | None = None) -> tuple[Stragglers, dict]:
    """The section from all of a job model's per-rank records (every step, start-up included), and the
    intermediate results (graph, metrics, ideal) that exports and benchmarks read."""
    return _per_rank(model.frames, config or StragglerConfig(), model.layout_columns())


def _without_steps(frames: JobFrames, left_out: list[int]) -> JobFrames:
    def keep(df: pl.DataFrame) -> pl.DataFrame:
        if df.is_empty() or "step" not in df.columns:
            return df
        return df.filter(pl.col("step").is_null() | ~pl.col("step").is_in(left_out))

    return replace(frames, comm_op=keep(frames.comm_op), compute_op=keep(frames.compute_op),
                   step_mark=keep(frames.step_mark), batch_meta=keep(frames.batch_meta))


def one_sample(frames: JobFrames) -> str | None:
    """Why the records are one sample of the step, or None.

    The what-if's ideal is what an op costs elsewhere in the run: other steps, or the microbatches of a
    schedule that repeats them. One step of one microbatch holds each op once per rank, so a difference
    between ranks is as likely noise as a straggler (eight CPU processes on two cores, one profiler
    window): no S from it. Needs the ``step`` (and ``microbatch``) columns of compute_op, else of comm_op.
    """
    df = frames.compute_op if frames.compute_op.height and "step" in frames.compute_op.columns else frames.comm_op
    if df.is_empty() or "step" not in df.columns or df["step"].drop_nulls().len() == 0:
        return None  # no steps at all: the section says why on its own
    if df["step"].drop_nulls().n_unique() > 1:
        return None
    if "microbatch" in df.columns:
        per_rank = df.filter(pl.col("microbatch").is_not_null()).group_by("rank").agg(
            pl.col("microbatch").n_unique().alias("n"))
        if per_rank.height and per_rank["n"].max() > 1:
            return None  # the schedule repeats microbatches: they are the samples
    return ONE_SAMPLE_WHY


ONE_SAMPLE_WHY = ("one step of one microbatch: each op was recorded once per rank, so the what-if has no "
                  "repeated sample to set a baseline and reports no S from a single sample")


def steady_frames(model: JobModel) -> tuple[JobFrames, dict]:
    """The job model's completed frames without its start-up steps, and those steps (step -> why)."""
    left_out = startup_steps(model.steps)
    frames = _without_steps(model.frames, sorted(left_out)) if left_out else model.frames
    return frames, left_out


def rank_section(model: JobModel, config: StragglerConfig, keep: dict | None = None,
                 on_graph: OnGraph | None = None) -> Stragglers:
    """The section from the job's per-rank records, start-up steps left out. ``keep`` (a dict) receives the
    intermediate results (graph, metrics, ideal) when the section replayed the job's graph; ``on_graph``
    gets that graph and its ideal durations as soon as they exist (see :func:`_per_rank`)."""
    why = one_sample(model.frames)
    if why is not None:
        return Stragglers(evaluated=False, why=why)
    frames, left_out = steady_frames(model)
    try:
        s, inter = _per_rank(frames, config, model.layout_columns(), on_graph)
    except WhatIfInputError as e:
        return Stragglers(evaluated=False, why=str(e))
    except (RankscopeError, ValueError, IndexError) as e:
        # records that do not form a replayable graph (a cycle, a degenerate job) cost this section
        # only, never the whole report; the reason is kept
        return Stragglers(evaluated=False, why=f"{type(e).__name__}: {e}")
    if keep is not None:
        keep.update(inter)
    if left_out:
        s = replace(s, warmup_left_out=[Warmup(step=k, why=v) for k, v in sorted(left_out.items())])
    return s


def flows_section(model: JobModel, config: StragglerConfig) -> Stragglers:
    """The section from the job's flow records alone."""
    inf = model.flows.inference
    if inf.job_flows is None:
        return Stragglers(evaluated=False, basis="flows", why=inf.strategy.why or "no training flows")
    return flow_straggler_section(inf.job_flows, inf.strategy, inf.steps, inf.quality.get("timestamp_resolution_ns", 1),
                                  config.none_below, inf.dp_pairs, model.flows.clocks)


def straggler_section(model: JobModel, config: StragglerConfig | None = None, keep: dict | None = None,
                      on_graph: OnGraph | None = None) -> Stragglers:
    """What-if attribution of one job (see module docstring). ``keep``, ``on_graph``: as :func:`rank_section`."""
    config = config or StragglerConfig()
    s = rank_section(model, config, keep, on_graph)
    if not s.evaluated and model.flows is not None and not model.per_rank:
        return flows_section(model, config)  # no per-rank records: the flows' own straggler evidence
    return s
