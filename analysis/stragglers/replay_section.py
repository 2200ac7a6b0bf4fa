"""The straggler section from compute records: replay the job's dependency graph with ideal durations.

Mapping onto the report (shared/design.md): slowdown = S, waste_fraction = 1 - 1/S, by_cause.worker =
M_W, by_cause.stage_imbalance = M_S (exactly as OSDI'25 defines it, whatever the verdict),
by_cause.sequence_imbalance and by_cause.communication = the shares of the two extra what-ifs, by_optype
= S_t, top_workers = workers by S_w with their evidence. The verdict weighs the stage whose fixing removes
the most (M_S fixes the last stage only), and a cause needs its own evidence (:mod:`config`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import polars as pl

from rankscope.analysis.report.causes import cause_shares
from rankscope.analysis.report.stragglers import (
    Heatmap,
    ReplayDetail,
    ReplayWorker,
    Stragglers,
    WhatIf,
    WorkerOrStage,
)
from rankscope.analysis.stragglers.config import StragglerConfig, evidenced_verdict
from rankscope.analysis.whatif.build import build_graph
from rankscope.analysis.whatif.comm import comm_whatif
from rankscope.analysis.whatif.evidence import (
    link_evidence,
    persistent_links,
    slow_ranks,
    stage_evidence,
    work_or_hardware,
    worker_evidence,
)
from rankscope.analysis.whatif.graph import WhatIfGraph
from rankscope.analysis.whatif.metrics import STALL_TYPES, WhatIfMetrics, compute_metrics, ideal_durations
from rankscope.analysis.whatif.scenarios import Scenarios, step_times
from rankscope.analysis.whatif.sequence import balanced_sequences
from rankscope.collectors.job_frames import JobFrames

OnGraph = Callable[[WhatIfGraph, np.ndarray], None]
"""Called with a replayed job's what-if graph and its ideal durations (:func:`replay_section`)."""


def _residual_stage_share(graph: WhatIfGraph, balanced: np.ndarray, ideal: np.ndarray, t_bal: float,
                          m: WhatIfMetrics, stage_id: int) -> float:
    work = graph.ops.select((pl.col("stage").fill_null(0) == stage_id) & ~pl.col("comm")
                            & ~pl.col("optype").is_in(list(STALL_TYPES)))[:, 0].to_numpy()
    last = work.astype(np.int64)
    sc = Scenarios(last, np.array([[False, True]]), np.array([True]))
    t_fixed = float(step_times(graph, balanced, ideal, sc)[:, 0].mean())
    gap = m.T - m.T_ideal
    return (t_bal - t_fixed) / gap if gap > 0 else 0.0


def _launch_delay_effect(graph: WhatIfGraph, actual: np.ndarray, m: WhatIfMetrics) -> dict:
    """Replay with the recorded launch delays (untraced CPU work): how much they cost, and whether
    that replay reproduces the recorded step times (the dependency model's own check)."""
    delay = graph.launch_delays()
    sc = Scenarios(np.zeros(len(actual), dtype=np.int64), np.array([[True]]), np.array([False]))
    base = step_times(graph, actual, actual, sc, launch_delay=delay)[:, 0]
    lo = np.full(len(graph.steps), np.inf)
    hi = np.full(len(graph.steps), -np.inf)
    np.minimum.at(lo, graph.step_index, graph.ops["start_ns"].to_numpy())
    np.maximum.at(hi, graph.step_index, graph.ops["end_ns"].to_numpy())
    err = np.abs(base / (hi - lo) - 1)
    return {"slowdown": float(base.mean() / m.T) if m.T > 0 else 1.0, "T_base_ns": float(base.mean()),
            "replay_vs_recorded_max_rel_err": float(err.max()) if err.size else None}


def _verdict_shares(graph: WhatIfGraph, ideal: np.ndarray, m: WhatIfMetrics, seq: dict, balanced,
                    comm: dict) -> tuple[dict, dict, int | None]:
    """(the OSDI'25 shares, the shares the verdict weighs, the stage the verdict weighs)."""
    shares = {"worker": float(m.M_W["rem"]), "stage_imbalance": float(m.M_S["rem"]),
              "sequence_imbalance": float(seq["share"]), "communication": float(comm["share"])}
    results = dict(shares)
    # M_S fixes the last stage only (OSDI'25); an imbalance can sit on any stage, so the verdict
    # weighs the stage whose fixing removes the most
    worst = max(m.stage_fix, key=lambda k: m.stage_fix[k]) if m.stage_fix else None
    if worst is not None:
        results["stage_imbalance"] = max(shares["stage_imbalance"], m.stage_fix[worst])
    if seq.get("detected") and balanced is not None and worst is not None:
        # heavy microbatches hit the last stage hardest, so M_S counts sequence imbalance too: for
        # the verdict, stage imbalance is what fixing that stage still removes once sequences are balanced
        results["stage_imbalance"] = _residual_stage_share(graph, balanced, ideal, seq["t_balanced"], m, worst)
    return shares, cause_shares(results), worst


def _lacking(links: list, worst: int | None, stage_ev: dict, config: StragglerConfig) -> dict[str, str]:
    """The causes whose own evidence is missing, with why (they cannot be the verdict)."""
    lacking = {}
    if not links:
        lacking["communication"] = (f"no rank's transfers are >= {config.slow_link_at}x its peers' in every "
                                    "step: transfer-time noise (a busy host), not a slow link")
    if worst is not None and worst not in stage_ev.get("slower_in_every_step", []):
        low = stage_ev.get("stage_vs_others_min_over_steps", {}).get(str(worst))
        lacking["stage_imbalance"] = (f"stage {worst}'s passes are not slower than the other stages' in every step "
                                      f"(min over steps {low}): no stage has more work")
    return lacking


def replay_section(frames: JobFrames, config: StragglerConfig, layout,
                   on_graph: OnGraph | None = None) -> tuple[Stragglers, dict]:
    """The section from a replay of the job's dependency graph, and the intermediate results (graph,
    metrics, ideal) for exports. Needs compute_op and comm_op (the what-if graph's columns).

    ``on_graph``: called with the graph and its ideal durations as soon as both exist, for a caller that
    starts other work on them (the critical path) while this section goes on; neither is changed after."""
    graph = build_graph(frames, layout)
    actual = graph.actual
    ideal = ideal_durations(graph)
    if on_graph is not None:
        on_graph(graph, ideal)
    m = compute_metrics(graph, config.metrics, ideal=ideal)
    comm = comm_whatif(graph, actual, ideal, m.T, m.T_ideal)
    bm = frames.batch_meta if frames.batch_meta.height else None
    seq, balanced = balanced_sequences(graph, actual, m.T, m.T_ideal, batch_meta=bm, config=config.sequence)
    shares, vshares, worst = _verdict_shares(graph, ideal, m, seq, balanced, comm)
    stage_ev = stage_evidence(graph, actual)
    top = worker_evidence(graph, actual, m, config.top_workers)
    links = persistent_links(graph, actual, ideal, config.slow_link_at)
    v, set_aside = evidenced_verdict(m.S, vshares, config, _lacking(links, worst, stage_ev, config))
    culprits = {"worker": {"rank": top[0]["endpoint"], "stage": top[0]["stage"], "dp_rank": top[0]["dp_rank"],
                           "factor": top[0]["compute_vs_stage_peers"]} if top else None,
                "stage_imbalance": {"stage": worst} if worst is not None else None,
                "communication": (comm["ranks"][0] if comm["ranks"] else None)}
    s = Stragglers(
        slowdown=float(m.S), verdict=v, by_cause=shares, top_workers=[ReplayWorker(**w) for w in top],
        waste_fraction=float(m.waste), by_optype=dict(m.by_optype), basis="compute",
        whatif=WhatIf(model=graph.model, verdict_shares=vshares, verdict_stage=worst, T_ns=m.T,
                      T_ideal_ns=m.T_ideal, step_slowdown=m.step_S),
        replay=ReplayDetail(
            by_dp_rank={str(k): v for k, v in m.by_dp_rank.items()},
            by_stage={str(k): v for k, v in m.by_stage.items()},
            stage_fix_share={str(k): v for k, v in m.stage_fix.items()},
            per_step={k: {str(a): b for a, b in v.items()} for k, v in m.per_step.items()},
            heatmap=Heatmap(**m.heatmap), launch_delay=_launch_delay_effect(graph, actual, m),
            # a copy first (one C call, under the GIL): the critical path may be caching its order in
            # these notes on the other thread (on_graph)
            graph={k: v for k, v in dict(graph.notes).items() if not k.startswith("_")}),
        steps=m.steps, culprits=culprits,
        evidence={"worker": m.M_W, "stage_imbalance": {**m.M_S, **stage_ev}, "sequence_imbalance": seq,
                  "communication": comm, "slow_ranks": slow_ranks(graph, actual, config.slow_worker_at),
                  "slow_links": link_evidence(graph, actual, ideal, config.slow_link_at),
                  "persistent_links": links},
        set_aside=set_aside or None)
    return _settle_ambiguity(s, graph, actual, m), {"graph": graph, "metrics": m, "ideal": ideal}


def _settle_ambiguity(s: Stragglers, graph: WhatIfGraph, actual: np.ndarray, m: WhatIfMetrics) -> Stragglers:
    """A worker with no stage peers (dp = 1, no TP) is also its whole stage: the op classes decide."""
    if s.verdict not in ("worker", "stage_imbalance") or not s.top_workers:
        return s
    rank = s.top_workers[0].endpoint
    stage = s.top_workers[0].stage
    if sum(1 for r, (_, st) in m.worker_place.items() if st == stage) > 1:
        return s
    call = work_or_hardware(graph, actual, rank)
    culprits = dict(s.culprits)
    if culprits.get("worker") is not None and isinstance(call.get("passes"), float):
        # no stage peers to compare with: the factor is against the other stages, and says so
        culprits["worker"] = {**culprits["worker"], "factor": call["passes"],
                              "factor_vs": "other stages (no stage peers)"}
    s = replace(s, worker_or_stage={"rank": rank, "stage": stage, **call}, culprits=culprits)
    if call["call"] == "ambiguous":
        s = replace(s, ambiguous=WorkerOrStage(between=["worker", "stage_imbalance"], rank=rank, stage=stage,
                                               why=call["why"]))
    elif call["call"] != s.verdict:
        s = replace(s, verdict_before_op_class_check=s.verdict, verdict=call["call"])
    if s.verdict == "stage_imbalance":
        s = replace(s, whatif=replace(s.whatif, verdict_stage=stage))
    return s
