"""The report's ``stragglers`` section: the what-if slowdown S, its causes, and who or what causes it."""

from __future__ import annotations

from typing import Any, Literal

from rankscope.analysis.report.codec import doc
from rankscope.analysis.report.steps import Warmup
from rankscope.collectors.record_class import record

Verdict = Literal["none", "worker", "stage_imbalance", "sequence_imbalance", "communication", "mixed"]


@record
class ReplayWorker:
    """A worker by S_w, from the compute replay."""

    endpoint: int = doc("the rank.")
    slowdown: float = doc("S_w: the job's slowdown with only this worker's ops at their ideal.")
    dp_rank: int | None = doc("its data-parallel rank.")
    stage: int | None = doc("its pipeline stage.")
    S_dp_rank: float = doc("S of its whole DP rank.")
    S_stage: float = doc("S of its whole stage.")
    compute_vs_stage_peers: float | None = doc("its compute time over its stage peers' (null when it has none).")
    stall_ns_per_step: float = doc("its stall ops (gc, data loading) per step.")
    stall_ns_mean: float = doc("the mean length of one stall op.")


@record
class ArrivalWorker:
    """A worker by how late it arrives at blocking collectives (hook records, no compute)."""

    endpoint: int = doc("the rank.")
    slowdown: float = doc("the step over the step without its excess lateness.")
    dp_rank: int | None = doc("its data-parallel rank.")
    stage: int | None = doc("its pipeline stage.")
    compute_vs_stage_peers: float | None = doc("its own work between collectives over its stage peers'.")
    own_work_ns: float = doc("its own work between blocking collectives per step.")
    last_arrival_share: float = doc("share of collectives it arrived at last.")


@record
class FlowWorker:
    """An endpoint the flows name: a slow NIC or link, or a late sender."""

    endpoint: str = doc("the address; with one_of, the first of them in address order (flows cannot tell which).")
    slowdown: float = doc("the step over the step without its cost.")
    kind: str = doc("what the flows found: slow_nic, slow_link or slow_worker.")
    one_of: list[str] | None = doc("the addresses the culprit is one of, where flows cannot single it out (the "
                                   "endpoints of a tensor-parallel group, which run in lock step).", None,
                                   omit="none")


TopWorker = ReplayWorker | ArrivalWorker | FlowWorker


@record
class WorkerOrStage:
    """A rank without stage peers: a slow GPU and a stage with more work look alike."""

    between: list[str] = doc("the verdicts it could be: worker, stage_imbalance.")
    rank: Any = doc("the rank.")
    stage: int | None = doc("its stage.")
    why: str = doc("why the records cannot tell.")


@record
class RingOrWorker:
    """A slow DP ring that crosses a late pipeline: a slow NIC and a slow worker look alike in flows."""

    between: list[str] = doc("communication and worker.")
    rank: str = doc("the late stage's address.")
    communication_extra_ns: float = doc("what the slow ring costs per step.")
    worker_extra_ns: float = doc("what the late stage costs per step.")
    why: str = doc("why the flows cannot tell.")
    ring: list[str] | None = doc("the slow ring's members, when it crosses the pipeline elsewhere.", None,
                                 omit="none")


@record
class Heatmap:
    """Worker x step slowdown S_w."""

    workers: list[int] = doc("the ranks, in row order.")
    steps: list[int] = doc("the step ids, in column order.")
    slowdown: list[list[float]] = doc("S_w of each worker in each step.")


@record
class WhatIf:
    """The what-if numbers of a section that replayed or timed the job."""

    model: str = doc("the dependency model: osdi, generic or arrival_skew.")
    verdict_shares: dict[str, float] = doc("each cause's share of the slowdown as the verdict weighs it.")
    verdict_stage: int | None = doc("the stage the verdict weighs for stage imbalance.")
    T_ns: float = doc("T: the mean recorded step time.")
    T_ideal_ns: float = doc("T_ideal: the mean step time with every op at its ideal.")
    step_slowdown: list[float] = doc("S of each step, in ``steps`` order.")


@record
class ReplayDetail:
    """What the compute replay measured besides S."""

    by_dp_rank: dict[str, float] = doc("S with one DP rank's ops at their ideal, per DP rank.")
    by_stage: dict[str, float] = doc("S with one stage's ops at their ideal, per stage.")
    stage_fix_share: dict[str, float] = doc("the share of the slowdown fixing each stage removes.")
    per_step: dict[str, dict] = doc("by_optype, by_dp_rank and by_stage per step.")
    heatmap: Heatmap = doc("worker x step S_w.")
    launch_delay: dict[str, Any] = doc("the replay with the recorded launch delays: its S and how well it "
                                       "reproduces the recorded steps.")
    graph: dict[str, Any] = doc("the dependency graph's counts (ops outside the model, unpaired p2p, ...).")


@record
class FlowsChecks:
    """What the flows-only straggler checks read."""

    link_rates: dict[str, Any] = doc("how many links' payload rates were compared, and the thresholds.")
    late_dp_links: str = doc("what the check for data-parallel links that open late found, or why it could "
                             "not run.")


@record
class Stragglers:
    """What-if attribution: S = T / T_ideal, the share of it each cause explains, and the verdict."""

    slowdown: float = doc("S = T / T_ideal (what-if): 1.0 means no straggling.", 1.0)
    verdict: Verdict = doc("none below the bar; else the cause with the largest share, mixed when none explains "
                       "half of the slowdown.", "none")
    by_cause: dict[str, float] = doc("share of the slowdown that fixing each cause alone removes: worker "
                                     "(M_W), stage_imbalance (M_S), sequence_imbalance, communication.",
                                     factory=dict)
    top_workers: list[TopWorker] = doc("workers by their own slowdown, with their evidence.", factory=list)
    waste_fraction: float = doc("1 - 1/S.", 0.0)
    by_optype: dict[str, float] = doc("S_t per op type.", factory=dict)
    basis: str | None = doc("what S was computed from: compute, arrival_skew or flows.", None, omit="none")
    evaluated: bool = doc("S and the verdict were computed; false with ``why`` otherwise.", True)
    why: str | None = doc("why the section was not evaluated.", None, omit="none")
    whatif: WhatIf | None = doc("the what-if numbers (compute and arrival bases).", None, flatten=True)
    replay: ReplayDetail | None = doc("what the compute replay measured besides S.", None, flatten=True)
    flows: FlowsChecks | None = doc("what the flows-only checks read.", None, flatten=True)
    steps: list[int] | None = doc("the steps analysed.", None, omit="none")
    culprits: dict[str, Any] | None = doc("cause -> who it blames (rank, stage, group or address), with the "
                                          "ratio measured.", None, omit="none")
    evidence: dict[str, Any] | None = doc("the numbers behind each cause: the what-ifs, slow ranks, slow "
                                          "links, stage and sequence evidence.", None, omit="none")
    set_aside: dict[str, str] | None = doc("causes whose share was largest but whose own evidence is "
                                           "missing, with why.", None, omit="none")
    worker_or_stage: dict[str, Any] | None = doc("for a rank without stage peers: whether all its op classes "
                                                 "are slower (hardware) or only its passes (more work).", None,
                                                 omit="none")
    ambiguous: WorkerOrStage | RingOrWorker | None = doc("two causes the evidence cannot tell apart.", None,
                                                          omit="none")
    verdict_before_op_class_check: str | None = doc("the verdict before the op-class check changed it.", None,
                                                    omit="none")
    verdict_before_evidence: str | None = doc("the verdict before the compute evidence changed it.", None,
                                              omit="none")
    verdict_from: str | None = doc("what set the verdict, when not the largest share.", None, omit="none")
    why_no_compute: str | None = doc("why S comes from arrival skew (no compute records).", None, omit="none")
    why_not_compute: str | None = doc("why the compute replay was not trusted.", None, omit="none")
    replay_doubt: str | None = doc("a doubt about the compute replay that nothing could settle.", None,
                                   omit="none")
    warmup_left_out: list[Warmup] | None = doc("start-up steps left out of the what-if.", None, omit="none")
    seconds: float | None = doc("how long the what-if took (not part of the input's answer).", None,
                                omit="none")
    noise: bool | None = doc("S < 1 was measured: within noise, reported as 1.", None, omit="none")
    slowdown_measured: float | None = doc("the S measured, when under 1.", None, omit="none")
    why_noise: str | None = doc("why S < 1 is noise.", None, omit="none")
    not_evaluated: dict[str, str] | None = doc("flows: causes the flows could not check, with why.", None,
                                               omit="none")
    ambiguous_flows: list[dict] | None = doc("flows: evidence of a slow group that names nobody.", None,
                                             omit="none")
    findings_flows: list[dict] | None = doc("flows: what the checks found, as measured.", None, omit="none")
    below_threshold: list[dict] | None = doc("flows: what the checks found that costs under the bar.", None,
                                             omit="none")
    checked: dict[str, Any] | None = doc("flows: what was checked when nothing was found.", None, omit="none")
