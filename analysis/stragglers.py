"""Straggler section of the report: what-if attribution (OSDI'25) plus sequence and network what-ifs.

Mapping onto the report (shared/design.md): slowdown = S, waste_fraction =
1 - 1/S, by_cause.worker = M_W, by_cause.stage_imbalance = M_S (exactly as
OSDI'25 defines it, whatever the verdict), by_cause.sequence_imbalance and
by_cause.communication = the shares of the two extra what-ifs, by_optype =
S_t, top_workers = workers by S_w with their evidence. Verdict: ``none``
when S < none_below; otherwise the cause with the largest share, ``mixed``
when no cause explains at least half of the slowdown.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from rankscope.analysis.diagnosis import Stragglers, Strategy
from rankscope.analysis.whatif_batch import Scenarios, step_times
from rankscope.analysis.whatif_comm import comm_whatif
from rankscope.analysis.whatif_graph import BWD, FWD, WhatIfGraph, WhatIfInputError, build_graph
from rankscope.analysis.whatif_metrics import (
    STALL_TYPES,
    MetricsConfig,
    WhatIfMetrics,
    compute_metrics,
    ideal_durations,
)
from rankscope.analysis.whatif_sequence import SequenceConfig, sequence_whatif
from rankscope.collectors.errors import ConfigError, RankscopeError
from rankscope.collectors.job_frames import JobFrames

CAUSES = ("worker", "communication", "sequence_imbalance", "stage_imbalance")
"""the verdict's causes, most specific first (a worker, a link, the batches, a whole stage)."""


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


def _worker_evidence(graph: WhatIfGraph, actual: np.ndarray, m: WhatIfMetrics, n: int) -> list[dict]:
    """Top workers by S_w, each with its compute speed relative to its stage peers."""
    comp = graph.ops.with_columns(pl.Series("a", actual)).filter(~pl.col("comm")).with_columns(
        pl.col("stage").fill_null(0))
    # per op type: this rank's mean over the mean of the other ranks of its stage
    per = comp.group_by("rank", "stage", "optype").agg(pl.col("a").sum().alias("s"), pl.len().alias("n"))
    per = per.with_columns(
        ((pl.col("s").sum().over("stage", "optype") - pl.col("s"))
         / (pl.col("n").sum().over("stage", "optype") - pl.col("n"))).alias("peer"),
        (pl.col("s") / pl.col("n")).alias("own"))
    per = per.filter(pl.col("peer") > 0).with_columns((pl.col("own") / pl.col("peer")).alias("ratio"))
    main = per.filter(pl.col("optype").is_in([FWD, BWD]))
    main = main if main.height else per
    speed = dict(main.group_by("rank").agg(
        ((pl.col("ratio") * pl.col("s")).sum() / pl.col("s").sum()).alias("r")).iter_rows())
    stalls = {r: (tot, n) for r, tot, n in comp.filter(pl.col("optype").is_in(list(STALL_TYPES))).group_by(
        "rank").agg(pl.col("a").sum(), pl.len()).iter_rows()}
    n_steps = max(1, len(m.steps))
    out = []
    for rank in m.worker_order[:n]:
        dp, st = m.worker_place[rank]
        out.append({"endpoint": int(rank), "slowdown": float(m.worker_S[rank]), "dp_rank": dp, "stage": st,
                    "S_dp_rank": m.by_dp_rank[dp], "S_stage": m.by_stage[st],
                    "compute_vs_stage_peers": float(speed.get(rank, float("nan"))),
                    "stall_ns_per_step": float(stalls.get(rank, (0.0, 1))[0]) / n_steps,
                    "stall_ns_mean": float(stalls[rank][0] / stalls[rank][1]) if rank in stalls else 0.0})
    return out


def _stage_evidence(graph: WhatIfGraph, actual: np.ndarray) -> dict:
    comp = graph.ops.with_columns(pl.Series("a", actual)).filter(
        pl.col("optype").is_in([FWD, BWD])).with_columns(pl.col("stage").fill_null(0))
    if comp.height == 0:
        return {}
    per = comp.group_by("stage").agg(pl.col("a").mean().alias("m")).sort("stage")
    m = per["m"].to_numpy()
    tot = m.sum()
    vs = {str(s): float(x / ((tot - x) / (len(m) - 1))) if len(m) > 1 and tot > x else None
          for s, x in zip(per["stage"].to_list(), m, strict=True)}
    return {"compute_mean_by_stage": dict(zip(per["stage"].to_list(), m.tolist(), strict=True)),
            "stage_vs_others": vs, "last_stage_vs_others": vs[str(per["stage"][-1])]}


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


def analyze_stragglers(frames: JobFrames, config: StragglerConfig | None = None) -> tuple[Stragglers, dict]:
    """The straggler section and the intermediate results (graph, metrics, ideal) for exports."""
    config = config or StragglerConfig()
    t0 = time.perf_counter()
    graph = build_graph(frames)
    actual = graph.actual
    ideal = ideal_durations(graph)
    m = compute_metrics(graph, config.metrics, ideal=ideal)
    comm = comm_whatif(graph, actual, ideal, m.T, m.T_ideal)
    bm = frames.batch_meta if frames.batch_meta.height else None
    seq = sequence_whatif(graph, actual, m.T, m.T_ideal, batch_meta=bm, config=config.sequence)
    launch = _launch_delay_effect(graph, actual, m)
    balanced = seq.pop("_balanced", None)
    shares = {"worker": float(m.M_W["rem"]), "stage_imbalance": float(m.M_S["rem"]),
              "sequence_imbalance": float(seq["share"]), "communication": float(comm["share"])}
    vshares = dict(shares)
    # M_S fixes the last stage only (OSDI'25); an imbalance can sit on any stage, so the verdict
    # weighs the stage whose fixing removes the most
    worst = max(m.stage_fix, key=lambda k: m.stage_fix[k]) if m.stage_fix else None
    if worst is not None:
        vshares["stage_imbalance"] = max(shares["stage_imbalance"], m.stage_fix[worst])
    if seq.get("detected") and balanced is not None and worst is not None:
        # heavy microbatches hit the last stage hardest, so M_S counts sequence imbalance too: for
        # the verdict, stage imbalance is what fixing that stage still removes once sequences are balanced
        vshares["stage_imbalance"] = _residual_stage_share(graph, balanced, ideal, seq["t_balanced"], m, worst)
    s = Stragglers(
        slowdown=float(m.S), verdict=verdict(m.S, vshares, config), by_cause=shares,
        top_workers=_worker_evidence(graph, actual, m, config.top_workers),
        waste_fraction=float(m.waste), by_optype=dict(m.by_optype))
    s.extra = {
        "evaluated": True, "model": graph.model, "verdict_shares": vshares, "T_ns": m.T, "T_ideal_ns": m.T_ideal,
        "steps": m.steps, "step_slowdown": m.step_S,
        "by_dp_rank": {str(k): v for k, v in m.by_dp_rank.items()},
        "by_stage": {str(k): v for k, v in m.by_stage.items()},
        "stage_fix_share": {str(k): v for k, v in m.stage_fix.items()},
        "evidence": {"worker": m.M_W, "stage_imbalance": {**m.M_S, **_stage_evidence(graph, actual)},
                     "sequence_imbalance": seq, "communication": comm},
        "per_step": {k: {str(a): b for a, b in v.items()} for k, v in m.per_step.items()},
        "heatmap": m.heatmap,
        "launch_delay": launch,
        "graph": {k: v for k, v in graph.notes.items() if not k.startswith("_")},
        "seconds": time.perf_counter() - t0,
    }
    return s, {"graph": graph, "metrics": m, "ideal": ideal}


def straggler_section(frames: JobFrames, strategy: Strategy, config=None) -> Stragglers:
    """What-if attribution of one job (see module docstring).

    Needs compute_op and comm_op (any source); batch_meta when the job wrote
    sequence lengths. Jobs without replayable records get an unevaluated
    section that says why.
    """
    if isinstance(config, (int, float)):
        config = StragglerConfig(none_below=float(config))
    elif config is not None and not isinstance(config, StragglerConfig):
        config = StragglerConfig(none_below=getattr(config, "none_below", 1.05))
    try:
        return analyze_stragglers(frames, config)[0]
    except WhatIfInputError as e:
        return Stragglers(extra={"evaluated": False, "why": str(e)})
    except (RankscopeError, ValueError, IndexError) as e:
        # records that do not form a replayable graph (a cycle, a degenerate job) cost this section
        # only, never the whole report; the reason is kept
        return Stragglers(extra={"evaluated": False, "why": f"{type(e).__name__}: {e}"})
