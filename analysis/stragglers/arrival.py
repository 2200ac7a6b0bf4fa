"""The straggler section from collective arrival skew: hook records alone (comm_op, no compute_op), or
compute records whose replay cannot be trusted (:mod:`arrival_skew` measures; this reads the verdict).
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from rankscope.analysis.report.causes import cause_shares
from rankscope.analysis.report.stragglers import ArrivalWorker, Stragglers, WhatIf, WorkerOrStage
from rankscope.analysis.stragglers.arrival_skew import arrival_skew
from rankscope.analysis.stragglers.config import StragglerConfig, evidenced_verdict
from rankscope.analysis.whatif.evidence import work_or_hardware
from rankscope.collectors.job_frames import JobFrames

FLOOR_QUANTILE = 0.1
"""op-class comparison on the arrival basis: this quantile of op durations is an op's own cost."""
NO_COMPUTE = "no compute_op records: S and the verdict come from collective arrival skew"
NO_PEERS_WHY = ("no stage peers and no compute records: a slower GPU and a stage with more work look alike in "
                "collective arrivals")


def _place(layout) -> dict:
    if layout is None or not layout.height:
        return {}
    return {int(row["rank"]): row for row in layout.to_dicts()}


def _slow_ranks(r: dict, place: dict, config: StragglerConfig) -> list[dict]:
    return [{"rank": x["rank"], "dp_rank": place.get(x["rank"], {}).get("dp_rank"),
             "stage": place.get(x["rank"], {}).get("stage"), "factor": x["own_vs_peers"], "steps": x["slow_steps"],
             "basis": "own work between blocking collectives vs peers"}
            for x in r["ranks"] if (x["own_vs_peers"] or 0) >= config.slow_worker_at
            and x["excess_ns"] > r["noise_floor_ns"]
            # slow in most steps: one descheduled step on a busy host is not a slow GPU
            and 2 * len(x["slow_steps"]) > len(r["steps"])]


def arrival_section(frames: JobFrames, config: StragglerConfig, layout) -> Stragglers:
    """S, shares and the verdict from how late each rank arrives at blocking collectives."""
    r = arrival_skew(frames.comm_op, frames.step_mark if frames.step_mark.height else None, layout)
    if not r["evaluated"]:
        return Stragglers(evaluated=False, basis="arrival_skew", why=r["why"])
    place = _place(layout)
    T = r["T_ns"]
    top = [ArrivalWorker(endpoint=x["rank"], slowdown=T / max(T - max(x["excess_ns"], 0.0), 1e-9),
                         dp_rank=place.get(x["rank"], {}).get("dp_rank"), stage=place.get(x["rank"], {}).get("stage"),
                         compute_vs_stage_peers=x["own_vs_peers"], own_work_ns=x["own_work_ns"],
                         last_arrival_share=x["last_arrival_share"]) for x in r["ranks"][:config.top_workers]]
    S = float(r["S"])
    vshares = cause_shares(r["shares"])
    # the arrival basis's link evidence: the slowest group's transfers are slow in every step
    group = r["communication"].get("slowest_group")
    lacking = {} if group and (group.get("min_step_ratio") or 0.0) >= config.slow_link_at else {
        "communication": f"no group's transfers are >= {config.slow_link_at}x their typical in every step: "
                         "transfer-time noise (a busy host), not a slow link"}
    v, set_aside = evidenced_verdict(S, vshares, config, lacking)
    stage = r["stage"].get("worst_stage")
    s = Stragglers(
        slowdown=S, verdict=v, by_cause=dict(vshares), top_workers=top, waste_fraction=1 - 1 / S if S > 0 else 0.0,
        basis="arrival_skew",
        whatif=WhatIf(model="arrival_skew", verdict_shares=vshares, verdict_stage=stage, T_ns=T,
                      T_ideal_ns=r["T_ideal_ns"], step_slowdown=r["step_slowdown"]),
        steps=r["steps"],
        culprits={"worker": {"rank": top[0].endpoint, "stage": top[0].stage, "dp_rank": top[0].dp_rank,
                             "factor": top[0].compute_vs_stage_peers},
                  "stage_imbalance": {"stage": stage} if stage is not None else None,
                  "communication": group},
        evidence={"arrival_skew": {k: v for k, v in r.items() if k not in ("evaluated",)},
                  "slow_ranks": _slow_ranks(r, place, config)},
        why_no_compute=NO_COMPUTE, set_aside=set_aside or None)
    return _no_peer_ambiguity(s, layout)


def stage_peers(layout, stage) -> int:
    return 0 if layout is None or stage is None else layout.filter(pl.col("stage") == stage).height


def _no_peer_ambiguity(s: Stragglers, layout) -> Stragglers:
    """Arrival skew alone cannot tell a slow GPU from a stage with more work when the rank has no stage
    peers (dp = 1, no TP): both make it late everywhere. Name both; the verdict keeps the larger share."""
    if s.verdict not in ("worker", "stage_imbalance") or not s.top_workers:
        return s
    top = s.top_workers[0]
    if stage_peers(layout, top.stage) > 1:
        return s
    return replace(s, ambiguous=WorkerOrStage(between=["worker", "stage_imbalance"], rank=top.endpoint,
                                              stage=top.stage, why=NO_PEERS_WHY))


def _sequence_verdict(a: Stragglers, seq: dict) -> Stragglers:
    """Per-microbatch work that varies alike in both passes is the batches, not a GPU or a stage."""
    how = (f"the heaviest microbatch is the same in {seq['agreement']['agree']} of {seq['agreement']['pairs']} "
           "pairs of passes (consecutive stages, or a rank's forward and backward)" if seq.get("agreement")
           else "forward/backward correlation")
    return replace(a, verdict_before_evidence=a.verdict, verdict="sequence_imbalance",
                   verdict_from="compute evidence (no trusted replay): " + how)


def _op_class_check(a: Stragglers, graph, layout) -> Stragglers:
    """For a rank without stage peers: all op classes slower (hardware) or only its passes (more work)."""
    top = a.top_workers[0]
    stage = top.stage
    # CPU traces of a contended host: compare each op class's floor, not its mean
    call = work_or_hardware(graph, graph.actual, top.endpoint, floor_quantile=FLOOR_QUANTILE)
    a = replace(a, ambiguous=None, worker_or_stage={"rank": top.endpoint, "stage": stage, **call})
    if call["call"] == "ambiguous":
        a = replace(a, ambiguous=WorkerOrStage(between=["worker", "stage_imbalance"], rank=top.endpoint,
                                               stage=stage, why=call["why"]))
    elif call["call"] != a.verdict:
        a = replace(a, verdict_before_op_class_check=a.verdict, verdict=call["call"])
    if isinstance(call.get("passes"), float):
        # the factor a finding reports: forward/backward against the other stages (no stage peers)
        ev = dict(a.evidence)
        si = dict(ev.get("stage_imbalance", {}))
        si["stage_vs_others"] = {**si.get("stage_vs_others", {}), str(stage): call["passes"]}
        ev["stage_imbalance"] = si
        culprits = dict(a.culprits)
        if culprits.get("worker") is not None:
            culprits["worker"] = {**culprits["worker"], "factor": call["passes"],
                                  "factor_vs": "other stages (no stage peers)"}
        a = replace(a, evidence=ev, culprits=culprits)
    if a.verdict == "stage_imbalance":
        a = replace(a, whatif=replace(a.whatif, verdict_stage=stage))
    return a


def arrival_with_compute_evidence(frames: JobFrames, config: StragglerConfig, layout, replayed: Stragglers,
                                  inter: dict, why: str) -> Stragglers:
    """S and shares from collective arrival skew, with what the compute records still show on their own:
    sequence imbalance (per-microbatch work, no replay needed) and, for a rank without stage peers,
    whether all its op classes are slower (hardware) or only its passes (more work)."""
    a = arrival_section(frames, config, layout)
    if not a.evaluated:
        return replace(replayed, replay_doubt=why)
    ev = replayed.evidence or {}
    seq = ev.get("sequence_imbalance") or {}
    a = replace(a, why_not_compute=why, evidence={
        **a.evidence,
        "compute_replay": {"slowdown": replayed.slowdown, "verdict": replayed.verdict, "by_cause": replayed.by_cause},
        "sequence_imbalance": {k: v for k, v in seq.items() if k not in ("share", "raw_share", "t_balanced")},
        "slow_ranks_compute": ev.get("slow_ranks", [])})
    if a.verdict == "none":
        return a
    if seq.get("detected"):
        return _sequence_verdict(a, seq)
    graph = inter.get("graph")
    top = a.top_workers[0] if a.top_workers else None
    if graph is None or top is None or a.verdict not in ("worker", "stage_imbalance"):
        return a
    if stage_peers(layout, top.stage) > 1:
        return a
    return _op_class_check(a, graph, layout)
