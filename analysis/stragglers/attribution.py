"""Straggler section of the report: what-if attribution (OSDI'25) plus sequence and network what-ifs.

Mapping onto the report (shared/design.md): slowdown = S, waste_fraction =
1 - 1/S, by_cause.worker = M_W, by_cause.stage_imbalance = M_S (exactly as
OSDI'25 defines it, whatever the verdict), by_cause.sequence_imbalance and
by_cause.communication = the shares of the two extra what-ifs, by_optype =
S_t, top_workers = workers by S_w with their evidence. Verdict: ``none``
when S < none_below; otherwise the cause with the largest share, ``mixed``
when no cause explains at least half of the slowdown. A cause also needs its
own evidence (a link slow in every step, a stage slower in every step), else
it is set aside with why (:func:`evidenced_verdict`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from rankscope.analysis.model.steps import startup_steps
from rankscope.analysis.report.causes import CAUSES, cause_shares
from rankscope.analysis.report.diagnosis import Stragglers, Strategy
from rankscope.analysis.stragglers.arrival_skew import arrival_skew
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
from rankscope.analysis.whatif.graph import WhatIfGraph, WhatIfInputError
from rankscope.analysis.whatif.metrics import (
    STALL_TYPES,
    MetricsConfig,
    WhatIfMetrics,
    compute_metrics,
    ideal_durations,
)
from rankscope.analysis.whatif.scenarios import Scenarios, step_times
from rankscope.analysis.whatif.sequence import SequenceConfig, balanced_sequences
from rankscope.collectors.errors import ConfigError, RankscopeError
from rankscope.collectors.job_frames import JobFrames

__all__ = ["CAUSES", "StragglerConfig", "analyze_stragglers", "straggler_section", "verdict"]


@dataclass(frozen=True)
class StragglerConfig:
    none_below: float = 1.05
    """verdict ``none`` when S is below this."""
    explain_at_least: float = 0.5
    """a cause must explain this share of the slowdown, else the verdict is ``mixed``."""
    tie_margin: float = 0.1
    """shares this close to the largest are a tie, broken towards the more specific cause."""
    top_workers: int = 5
    """how many workers by S_w the report lists."""
    slow_worker_at: float = 1.2
    """a GPU whose compute is at least this times its stage peers' is a finding (issue 12)."""
    slow_link_at: float = 1.5
    """a rank whose transfers run at least this times their op type's typical is a finding."""
    slow_stage_at: float = 1.2
    """a stage whose forward/backward compute is at least this times the other stages' is a finding."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    sequence: SequenceConfig = field(default_factory=SequenceConfig)

    def __post_init__(self):
        if not self.none_below >= 1.0:
            raise ConfigError(f"none_below={self.none_below!r}; expected a slowdown >= 1.0")
        if not 0 < self.explain_at_least <= 1:
            raise ConfigError(f"explain_at_least={self.explain_at_least!r}; expected a share in (0, 1]")
        if not 0 <= self.tie_margin < 1:
            raise ConfigError(f"tie_margin={self.tie_margin!r}; expected a share in [0, 1)")
        if self.top_workers < 1:
            raise ConfigError(f"top_workers={self.top_workers!r}; expected a positive count")


def verdict(S: float, shares: dict[str, float], config: StragglerConfig) -> str:
    """none / the cause with the largest share / mixed (pure; see module docstring).

    Shares are capped at 1; causes within ``tie_margin`` of the largest count as tied, and the most
    specific of them wins (CAUSES order): one slow worker also makes its whole stage slow, so
    fixing the stage explains it as well as fixing the worker, but the worker is the finding.
    """
    if not S >= config.none_below:
        return "none"
    # a share above 1 overshoots (the replay is not additive): it explains all, not more than all
    capped = {c: min(shares.get(c, 0.0), 1.0) for c in CAUSES}
    best = max(capped.values())
    if best < config.explain_at_least:
        return "mixed"
    return next(c for c in CAUSES if capped[c] >= best - config.tie_margin)


def evidenced_verdict(S: float, shares: dict[str, float], config: StragglerConfig,
                      lacking: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The verdict, where a cause also needs its own evidence: (verdict, {cause set aside: why}).

    A what-if share says how much fixing a cause would remove; on a busy host it also removes noise
    that no culprit explains (descheduled transfers scattered over ranks and steps; passes that run
    longer in some steps). ``lacking`` names the causes whose evidence is missing, with why; such a
    cause cannot be the verdict, which then comes from the other causes, and the section says so."""
    shares = dict(shares)
    aside: dict[str, str] = {}
    v = verdict(S, shares, config)
    while v in lacking and v not in aside:
        aside[v] = f"{v} explains {min(shares[v], 1.0):.0%} of the slowdown, but " + lacking[v]
        shares[v] = 0.0
        v = verdict(S, shares, config)
    return v, aside


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


def _section_from_graph(frames: JobFrames, config: StragglerConfig, layout) -> tuple[Stragglers, dict]:
    graph = build_graph(frames, layout)
    actual = graph.actual
    ideal = ideal_durations(graph)
    m = compute_metrics(graph, config.metrics, ideal=ideal)
    comm = comm_whatif(graph, actual, ideal, m.T, m.T_ideal)
    bm = frames.batch_meta if frames.batch_meta.height else None
    seq, balanced = balanced_sequences(graph, actual, m.T, m.T_ideal, batch_meta=bm, config=config.sequence)
    launch = _launch_delay_effect(graph, actual, m)
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
    vshares = cause_shares(results)
    stage_ev = stage_evidence(graph, actual)
    top = worker_evidence(graph, actual, m, config.top_workers)
    links = persistent_links(graph, actual, ideal, config.slow_link_at)
    lacking = {}
    if not links:
        lacking["communication"] = (f"no rank's transfers are >= {config.slow_link_at}x its peers' in every "
                                    "step: transfer-time noise (a busy host), not a slow link")
    if worst is not None and worst not in stage_ev.get("slower_in_every_step", []):
        lacking["stage_imbalance"] = (f"stage {worst}'s passes are not slower than the other stages' in every step "
                                      f"(min over steps {stage_ev.get('stage_vs_others_min_over_steps', {}).get(str(worst))}): "
                                      "no stage has more work")
    v, set_aside = evidenced_verdict(m.S, vshares, config, lacking)
    s = Stragglers(slowdown=float(m.S), verdict=v, by_cause=shares,
                   top_workers=top, waste_fraction=float(m.waste), by_optype=dict(m.by_optype))
    culprits = {"worker": {"rank": top[0]["endpoint"], "stage": top[0]["stage"], "dp_rank": top[0]["dp_rank"],
                           "factor": top[0]["compute_vs_stage_peers"]} if top else None,
                "stage_imbalance": {"stage": worst} if worst is not None else None,
                "communication": (comm["ranks"][0] if comm["ranks"] else None)}
    s.extra = {
        "evaluated": True, "basis": "compute", "model": graph.model, "verdict_shares": vshares,
        "verdict_stage": worst, "T_ns": m.T, "T_ideal_ns": m.T_ideal,
        "steps": m.steps, "step_slowdown": m.step_S,
        "by_dp_rank": {str(k): v for k, v in m.by_dp_rank.items()},
        "by_stage": {str(k): v for k, v in m.by_stage.items()},
        "stage_fix_share": {str(k): v for k, v in m.stage_fix.items()},
        "evidence": {"worker": m.M_W, "stage_imbalance": {**m.M_S, **stage_ev},
                     "sequence_imbalance": seq, "communication": comm,
                     "slow_ranks": slow_ranks(graph, actual, config.slow_worker_at),
                     "slow_links": link_evidence(graph, actual, ideal, config.slow_link_at),
                     "persistent_links": links},
        "culprits": culprits,
        "per_step": {k: {str(a): b for a, b in v.items()} for k, v in m.per_step.items()},
        "heatmap": m.heatmap,
        "launch_delay": launch,
        "graph": {k: v for k, v in graph.notes.items() if not k.startswith("_")},
    }
    if set_aside:
        s.extra["set_aside"] = set_aside
    _settle_ambiguity(s, graph, actual, m)
    return s, {"graph": graph, "metrics": m, "ideal": ideal}


def _settle_ambiguity(s: Stragglers, graph: WhatIfGraph, actual: np.ndarray, m: WhatIfMetrics) -> None:
    """A worker with no stage peers (dp = 1, no TP) is also its whole stage: the op classes decide."""
    if s.verdict not in ("worker", "stage_imbalance") or not s.top_workers:
        return
    rank = s.top_workers[0]["endpoint"]
    stage = s.top_workers[0]["stage"]
    if sum(1 for r, (_, st) in m.worker_place.items() if st == stage) > 1:
        return
    call = work_or_hardware(graph, actual, rank)
    s.extra["worker_or_stage"] = {"rank": rank, "stage": stage, **call}
    cul = s.extra["culprits"].get("worker")
    if cul is not None and isinstance(call.get("passes"), float):
        # no stage peers to compare with: the factor is against the other stages, and says so
        cul.update(factor=call["passes"], factor_vs="other stages (no stage peers)")
    if call["call"] == "ambiguous":
        s.extra["ambiguous"] = {"between": ["worker", "stage_imbalance"], "rank": rank, "stage": stage,
                                "why": call["why"]}
    elif call["call"] != s.verdict:
        s.extra["verdict_before_op_class_check"] = s.verdict
        s.verdict = call["call"]
    if s.verdict == "stage_imbalance":
        s.extra["verdict_stage"] = stage


def _arrival_section(frames: JobFrames, config: StragglerConfig, layout) -> Stragglers:
    r = arrival_skew(frames.comm_op, frames.step_mark if frames.step_mark.height else None, layout)
    if not r["evaluated"]:
        return Stragglers(extra={"evaluated": False, "basis": "arrival_skew", "why": r["why"]})
    place = {}
    if layout is not None and layout.height:
        place = {int(row["rank"]): row for row in layout.to_dicts()}
    T = r["T_ns"]
    top = [{"endpoint": x["rank"], "slowdown": T / max(T - max(x["excess_ns"], 0.0), 1e-9),
            "dp_rank": place.get(x["rank"], {}).get("dp_rank"), "stage": place.get(x["rank"], {}).get("stage"),
            "compute_vs_stage_peers": x["own_vs_peers"], "own_work_ns": x["own_work_ns"],
            "last_arrival_share": x["last_arrival_share"]} for x in r["ranks"][:config.top_workers]]
    S = float(r["S"])
    vshares = cause_shares(r["shares"])
    # the arrival basis's link evidence: the slowest group's transfers are slow in every step
    group = r["communication"].get("slowest_group")
    lacking = {} if group and (group.get("min_step_ratio") or 0.0) >= config.slow_link_at else {
        "communication": f"no group's transfers are >= {config.slow_link_at}x their typical in every step: "
                         "transfer-time noise (a busy host), not a slow link"}
    v, set_aside = evidenced_verdict(S, vshares, config, lacking)
    s = Stragglers(slowdown=S, verdict=v, by_cause=dict(vshares), top_workers=top,
                   waste_fraction=1 - 1 / S if S > 0 else 0.0)
    stage = r["stage"].get("worst_stage")
    s.extra = {"evaluated": True, "basis": "arrival_skew", "model": "arrival_skew", "verdict_shares": vshares,
               "verdict_stage": stage, "T_ns": T, "T_ideal_ns": r["T_ideal_ns"], "steps": r["steps"],
               "step_slowdown": r["step_slowdown"],
               "culprits": {"worker": {"rank": top[0]["endpoint"], "stage": top[0]["stage"],
                                       "dp_rank": top[0]["dp_rank"], "factor": top[0]["compute_vs_stage_peers"]},
                            "stage_imbalance": {"stage": stage} if stage is not None else None,
                            "communication": r["communication"].get("slowest_group")},
               "evidence": {"arrival_skew": {k: v for k, v in r.items() if k not in ("evaluated",)},
                            "slow_ranks": [{"rank": x["rank"], "dp_rank": place.get(x["rank"], {}).get("dp_rank"),
                                            "stage": place.get(x["rank"], {}).get("stage"),
                                            "factor": x["own_vs_peers"], "steps": x["slow_steps"],
                                            "basis": "own work between blocking collectives vs peers"}
                                           for x in r["ranks"] if (x["own_vs_peers"] or 0) >= config.slow_worker_at
                                           and x["excess_ns"] > r["noise_floor_ns"]
                                           # slow in most steps: one descheduled step on a busy host is not a slow GPU
                                           and 2 * len(x["slow_steps"]) > len(r["steps"])]},
               "why_no_compute": "no compute_op records: S and the verdict come from collective arrival skew"}
    if set_aside:
        s.extra["set_aside"] = set_aside
    _no_peer_ambiguity(s, layout)
    return s


def _stage_peers(layout, stage) -> int:
    return 0 if layout is None or stage is None else layout.filter(pl.col("stage") == stage).height


def _no_peer_ambiguity(s: Stragglers, layout) -> None:
    """Arrival skew alone cannot tell a slow GPU from a stage with more work when the rank has no stage
    peers (dp = 1, no TP): both make it late everywhere. Name both; the verdict keeps the larger share."""
    if s.verdict not in ("worker", "stage_imbalance") or not s.top_workers:
        return
    top = s.top_workers[0]
    if _stage_peers(layout, top.get("stage")) > 1:
        return
    s.extra["ambiguous"] = {"between": ["worker", "stage_imbalance"], "rank": top["endpoint"], "stage": top.get("stage"),
                            "why": "no stage peers and no compute records: a slower GPU and a stage with more "
                                   "work look alike in collective arrivals"}


FLOOR_QUANTILE = 0.1
"""op-class comparison on the arrival basis: this quantile of op durations is an op's own cost."""
REPLAY_MAX_REL_ERR = 0.25
"""the replay with the recorded launch delays must reproduce each recorded step within this."""


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
    x = s.extra
    if not x.get("evaluated") or x.get("basis") != "compute":
        return None
    err = (x.get("launch_delay") or {}).get("replay_vs_recorded_max_rel_err")
    if err is not None and err > REPLAY_MAX_REL_ERR:
        return (f"the replay of the recorded durations misses a recorded step by {err:.0%}: the dependency "
                "model does not fit these records")
    return None


def _arrival_with_compute_evidence(frames: JobFrames, config: StragglerConfig, layout, replayed: Stragglers,
                                   inter: dict, why: str) -> Stragglers:
    """S and shares from collective arrival skew, with what the compute records still show on their own:
    sequence imbalance (per-microbatch work, no replay needed) and, for a rank without stage peers,
    whether all its op classes are slower (hardware) or only its passes (more work)."""
    a = _arrival_section(frames, config, layout)
    if not a.extra.get("evaluated"):
        replayed.extra["replay_doubt"] = why
        return replayed
    ev = replayed.extra.get("evidence", {})
    a.extra["why_not_compute"] = why
    a.extra["evidence"]["compute_replay"] = {"slowdown": replayed.slowdown, "verdict": replayed.verdict,
                                             "by_cause": replayed.by_cause}
    seq = ev.get("sequence_imbalance") or {}
    a.extra["evidence"]["sequence_imbalance"] = {k: v for k, v in seq.items() if k not in ("share", "raw_share",
                                                                                          "t_balanced")}
    a.extra["evidence"]["slow_ranks_compute"] = ev.get("slow_ranks", [])
    if a.verdict == "none":
        return a
    if seq.get("detected"):
        # per-microbatch work that varies alike in both passes is the batches, not a GPU or a stage
        a.extra["verdict_before_evidence"] = a.verdict
        a.verdict = "sequence_imbalance"
        a.extra["verdict_from"] = "compute evidence (no trusted replay): " + (
            f"the heaviest microbatch is the same in {seq['agreement']['agree']} of {seq['agreement']['pairs']} "
            "pairs of passes (consecutive stages, or a rank's forward and backward)" if seq.get("agreement")
            else "forward/backward correlation")
        return a
    graph = inter.get("graph")
    top = a.top_workers[0] if a.top_workers else None
    if graph is None or top is None or a.verdict not in ("worker", "stage_imbalance"):
        return a
    stage = top.get("stage")
    if _stage_peers(layout, stage) > 1:
        return a

    a.extra.pop("ambiguous", None)  # the compute records may decide what arrivals alone cannot
    # CPU traces of a contended host: compare each op class's floor, not its mean
    call = work_or_hardware(graph, graph.actual, top["endpoint"], floor_quantile=FLOOR_QUANTILE)
    a.extra["worker_or_stage"] = {"rank": top["endpoint"], "stage": stage, **call}
    if call["call"] == "ambiguous":
        a.extra["ambiguous"] = {"between": ["worker", "stage_imbalance"], "rank": top["endpoint"], "stage": stage,
                                "why": call["why"]}
    elif call["call"] != a.verdict:
        a.extra["verdict_before_op_class_check"] = a.verdict
        a.verdict = call["call"]
    if isinstance(call.get("passes"), float):
        # the factor a finding reports: forward/backward against the other stages (no stage peers)
        a.extra["evidence"].setdefault("stage_imbalance", {}).setdefault("stage_vs_others", {})[str(stage)] = \
            call["passes"]
        cul = a.extra["culprits"].get("worker")
        if cul is not None:
            cul.update(factor=call["passes"], factor_vs="other stages (no stage peers)")
    if a.verdict == "stage_imbalance":
        a.extra["verdict_stage"] = stage
    return a


def _honest(s: Stragglers) -> Stragglers:
    """S below 1 is measurement noise (the replay of recorded durations ran longer than the record),
    never negative waste."""
    if s.slowdown < 1.0:
        s.extra["noise"] = True
        s.extra["slowdown_measured"] = s.slowdown
        s.extra["why_noise"] = "S < 1: the ideal replay is no faster than the record; within measurement noise"
        s.waste_fraction = 0.0
    else:
        s.extra["noise"] = False
    return s


def analyze_stragglers(frames: JobFrames, config: StragglerConfig | None = None,
                       layout: pl.DataFrame | None = None) -> tuple[Stragglers, dict]:
    """The straggler section and the intermediate results (graph, metrics, ideal) for exports.

    ``layout`` (rank, stage, dp_rank, tp_rank, pipeline: the job model's) places ranks; without it
    placement is read from the records. Hook records alone (comm_op, no compute_op) are judged by
    collective arrival skew (basis ``arrival_skew``); the intermediate results are then empty.
    """
    config = config or StragglerConfig()
    t0 = time.perf_counter()
    if _comm_only(frames):
        s, inter = _arrival_section(frames, config, layout), {}
    else:
        s, inter = _section_from_graph(frames, config, layout)
        why = no_stage_peers(layout) or replay_contradiction(s)
        if why is not None:
            s = _arrival_with_compute_evidence(frames, config, layout, s, inter, why)
    s.extra["seconds"] = time.perf_counter() - t0
    return _honest(s), inter


def _lacks_placement(frames: JobFrames) -> bool:
    comp = frames.compute_op
    return "stage" not in comp.columns or comp["stage"].null_count() == comp.height


def _comm_only(frames: JobFrames) -> bool:
    comp = frames.compute_op
    has_compute = comp.height > 0 and comp["step"].drop_nulls().len() > 0
    return not has_compute and frames.comm_op.height > 0


def layout_from_strategy(strategy: Strategy | None) -> pl.DataFrame | None:
    """rank, stage, dp_rank, tp_rank, pipeline from an inferred strategy (white-box pipelines are ordered
    upstream first), for when the job model gives no layout. None when the strategy has no int ranks."""
    if strategy is None or not strategy.pp_groups:
        return None
    rows: dict[int, dict] = {}
    try:
        for p, members in enumerate(strategy.pp_groups):
            for stage, r in enumerate(members):
                rows[int(r)] = {"rank": int(r), "stage": stage, "pipeline": p, "dp_rank": None, "tp_rank": None}
        for groups, key in ((strategy.dp_groups, "dp_rank"), (strategy.tp_groups or [], "tp_rank")):
            for members in groups:
                for i, r in enumerate(sorted(int(m) for m in members)):
                    if r in rows:
                        rows[r][key] = i
    except (TypeError, ValueError):
        return None  # flow-only strategies name endpoints by address, not rank
    return pl.DataFrame(list(rows.values()), schema={"rank": pl.Int64, "stage": pl.Int64, "pipeline": pl.Int64,
                                                     "dp_rank": pl.Int64, "tp_rank": pl.Int64})


def _without_steps(frames: JobFrames, left_out: list[int]) -> JobFrames:
    def keep(df: pl.DataFrame) -> pl.DataFrame:
        if df.is_empty() or "step" not in df.columns:
            return df
        return df.filter(pl.col("step").is_null() | ~pl.col("step").is_in(left_out))

    return replace(frames, comm_op=keep(frames.comm_op), compute_op=keep(frames.compute_op),
                   step_mark=keep(frames.step_mark), batch_meta=keep(frames.batch_meta))


def straggler_section(frames: JobFrames, strategy: Strategy | None, config=None,
                      layout: pl.DataFrame | None = None, steps: pl.DataFrame | None = None) -> Stragglers:
    """What-if attribution of one job (see module docstring).

    Needs comm_op and, for the compute basis, compute_op (any source); batch_meta when the job
    wrote sequence lengths; ``layout`` as :func:`analyze_stragglers`. Jobs without replayable
    records get an unevaluated section that says why. Without ``layout``, records that carry no
    stage (hooks, Kineto) take their placement from the inferred strategy.
    """
    if layout is None and _lacks_placement(frames):
        layout = layout_from_strategy(strategy)
    if isinstance(config, (int, float)):
        config = StragglerConfig(none_below=float(config))
    elif config is not None and not isinstance(config, StragglerConfig):
        config = StragglerConfig(none_below=getattr(config, "none_below", 1.05))
    left_out = startup_steps(steps)
    if left_out:
        frames = _without_steps(frames, sorted(left_out))
    try:
        s = analyze_stragglers(frames, config, layout)[0]
        if left_out:
            s.extra["warmup_left_out"] = [{"step": k, "why": v} for k, v in sorted(left_out.items())]
        return s
    except WhatIfInputError as e:
        return Stragglers(extra={"evaluated": False, "why": str(e)})
    except (RankscopeError, ValueError, IndexError) as e:
        # records that do not form a replayable graph (a cycle, a degenerate job) cost this section
        # only, never the whole report; the reason is kept
        return Stragglers(extra={"evaluated": False, "why": f"{type(e).__name__}: {e}"})
