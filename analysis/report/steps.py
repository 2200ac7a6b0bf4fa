"""The report's ``steps`` section: how many steps, how long, where they start, and which were warm-up."""

from __future__ import annotations

from rankscope.analysis.report.codec import doc
from rankscope.collectors.record_class import record


@record
class Warmup:
    """A step left out of the median."""

    step: int = doc("the step id.")
    why: str = doc("why it is warm-up.")


@record
class RankPhases:
    """One rank's time over all steps, by phase (nanoseconds)."""

    rank: int = doc("the rank.")
    compute_ns: int = doc("union of its compute spans.")
    comm_ns: int = doc("union of its communication spans.")
    exposed_comm_ns: int = doc("communication not hidden under compute.")
    idle_ns: int = doc("neither compute nor communication.")
    exposed_wait_ns: int = doc("exposed communication plus idle: the time it waited.")


@record
class StepTable:
    """Steps from per-rank records (step marks or step labels), by the one step definition."""

    step_ids: list[int] = doc("each step's id.")
    spans_ns: list[int] = doc("each step's job-wide span, earliest rank start to latest rank end.")
    basis: str = doc("how durations were measured: rank_period (each rank's start to next start, median "
                     "over ranks) or span (relative-time traces).")
    warmup: list[Warmup] = doc("steps left out of the median, and why.")
    num_in_median: int = doc("how many steps the median is taken over.")


@record
class FlowPeriod:
    """Steps from the period of the flows' data-parallel bursts."""

    record_cover: float = doc("median record length over the period.")
    note: str = doc("how the boundaries were placed.")
    longest_record_cover: float = doc("95th-percentile record length over the period: at half or more, a "
                                      "record may hold two steps.")
    record_coverage_between_bursts: float = doc("median share of time between a link's bursts that its "
                                                "records cover.")
    period_from_phase_coherence_ns: int | None = doc("the period the phase coherence chose, when the "
                                                     "bursts' median spacing replaced it.", None, omit="none")
    period_note: str | None = doc("why the period was replaced.", None, omit="none")
    period_multiple: int | None = doc("how many link periods make one step of the whole traffic.", None,
                                      omit="none")
    autocorrelation_by_multiple: dict[str, float] | None = doc("the traffic's autocorrelation at each multiple "
                                                               "of the link period.", None, omit="none")
    period_weak: bool | None = doc("the traffic does not repeat clearly at the period.", None, omit="none")
    autocorrelation_by_fraction: dict[str, float] | None = doc("the autocorrelation at whole fractions of the "
                                                               "period, when one repeats as well.", None,
                                                               omit="none")


@record
class FlowPeriodMiss:
    """Why the flows gave no step time: what their records show."""

    continued_records: float | None = doc("share of records that continue their flow's previous one.", None,
                                          omit="none")
    median_record_ns: float | None = doc("median record length.", None, omit="none")
    burst_starts_per_flow: float | None = doc("burst starts per flow.", None, omit="none")
    period_seen_ns: int | None = doc("the period seen, when under two ticks of the time resolution.", None,
                                     omit="none")
    timestamp_resolution_ns: int | None = doc("the records' time resolution.", None, omit="none")


@record
class Steps:
    """The job's steps by the one step definition that analyze, diff, export and the dashboard share."""

    count: int = doc("number of steps.", 0)
    median_ns: float = doc("median step time of the steps that are not warm-up.", 0.0)
    boundaries_ns: list[int] = doc("start of each step on the aligned clock.", factory=list)
    source: str | None = doc("where the boundaries come from: step_mark, step column, or the flows' period.",
                             None, omit="none")
    evaluated: bool = doc("steps were found; false with ``why`` otherwise.", True)
    why: str | None = doc("why the steps are unknown or uncertain.", None, omit="none")
    ambiguous: bool | None = doc("the step time may be a whole multiple or fraction of the one reported.",
                                 None, omit="none")
    durations_ns: list[int] | None = doc("each step's duration (the step time).", None, omit="none")
    table: StepTable | None = doc("steps from per-rank records.", None, flatten=True)
    period: FlowPeriod | None = doc("steps from the flows' period.", None, flatten=True)
    period_miss: FlowPeriodMiss | None = doc("what the flows showed when they gave no step time.", None,
                                             flatten=True)
    phases_by_rank: list[RankPhases] | None = doc("each rank's compute, communication and wait over all steps.",
                                                  None, omit="none")

    @property
    def warmup(self) -> list[Warmup]:
        return list(self.table.warmup) if self.table is not None else []




@record
class PathOp:
    """One piece of a step's critical path: an op's work (compute, or a synced op's transfer) or the launch
    gap before it (untraced CPU work, or on hook-only records the compute between two collectives)."""

    rank: int = doc("the rank it ran on.")
    op: str = doc("its op type (forward-compute, backward-compute, all_reduce:dp, forward-send, ...).")
    op_class: str = doc("compute, communication, or launch_gap (the time before the op started, after its "
                        "predecessor ended).")
    start_ns: float = doc("when it started on the replay's clock (every step from 0).")
    duration_ns: float = doc("its length on the path.")
    link: str | None = doc("a transfer's link: 'send 3->5' or the collective's op and member ranks.", None,
                           omit="none")
    waited_for: int | None = doc("for a transfer: the rank that launched the collective or pair last (the "
                                 "path goes on there).", None, omit="none")


@record
class StepPath:
    """The chain of ops that set one step's end, from the step's start to its end."""

    step: int = doc("the step id.")
    time_ns: float = doc("the step's replayed time: the path's length.")
    ops: list[PathOp] = doc("the path, first op first.")


@record
class PathEdit:
    """An edit to the path and the step time the replay predicts with it."""

    kind: str = doc("worker (a rank's compute at its stage peers' rate), stage (a stage's compute at the other "
                    "stages' rate) or link (transfers at their op type's median rate).")
    what: str = doc("the edit in words.")
    ranks: list[int] = doc("the ranks it changes.")
    stage: int | None = doc("the stage, for worker and stage edits.", None, omit="none")
    link: str | None = doc("the link, for link edits ('send 3->5', or 'rank 3' for a rank's network link).",
                           None, omit="none")
    path_share: float = doc("share of the path held by the ops it changes.", 0.0)
    predicted_step_ns: float = doc("mean step time the replay predicts with the edit.", 0.0)
    saving: float = doc("1 - predicted / current mean step time.", 0.0)


@record
class CriticalPath:
    """The step's critical path across all ranks (from the what-if dependency graph, replayed with the
    recorded durations and launch delays, so it reproduces the recorded steps)."""

    evaluated: bool = doc("whether it was computed.", False)
    why: str | None = doc("why not, when not evaluated.", None, omit="none")
    basis: str | None = doc("compute (compute records and collectives) or hooks (collectives only).", None,
                            omit="none")
    limits: str | None = doc("what the path can and cannot show on these records.", None, omit="none")
    model: str | None = doc("the dependency model (osdi25 or generic).", None, omit="none")
    step_time_ns: float | None = doc("mean replayed step time over the steps the path is taken over.", None,
                                     omit="none")
    replay_vs_recorded_max_rel_err: float | None = doc("largest relative difference between a step's replayed "
                                                       "and recorded time (the model's own check).", None,
                                                       omit="none")
    share: dict[str, dict[str, float]] = doc("share of the path over the steady steps, by rank, stage, "
                                             "op_class and link (a key's path time over the steps' time).",
                                             factory=dict, omit="empty")
    top_rank_by_step: dict[str, int] = doc("per step, the rank that holds the most of its path.", factory=dict,
                                           omit="empty")
    slack_by_rank: dict[str, dict[str, float]] = doc("per rank, how much later its last op of a step could "
                                                     "have ended without moving the step's end: median_ns and "
                                                     "min_ns over the steps.", factory=dict, omit="empty")
    edits: list[PathEdit] = doc("what would shorten the step: the three edits with the shortest predicted "
                                "step time, shortest first.", factory=list, omit="empty")
    steps: list[StepPath] = doc("the path of each steady step (the first max_steps_listed).", factory=list,
                                omit="empty")
    max_steps_listed: int | None = doc("how many steps' paths are listed at most.", None, omit="none")
