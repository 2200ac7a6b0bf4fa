"""Evidence behind the what-if verdict: per-rank compute speed, per-stage compute, per-rank transfers.

Pure functions over a WhatIfGraph and its per-op actual durations. They name
culprits and factors; the shares of the slowdown come from the replays
(whatif.metrics, whatif.comm, whatif.sequence), never from here.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.whatif.graph import BWD, FWD, WhatIfGraph
from rankscope.analysis.whatif.metrics import STALL_TYPES, WhatIfMetrics

OUTLIER_SIGMAS = 8.0
"""below the finding threshold, a rank is still a finding when its factor sits this many robust standard
deviations (1.4826 x MAD over all ranks) above the ranks' median: a small slowdown far outside the noise."""
OUTLIER_FLOOR = 1.05
"""... and at least this factor (a 1% effect is not worth a page, however clean the data)."""
PASSES = (FWD, BWD)
"""Op types that scale with the layers a stage holds (more work), unlike the optimizer step's fixed share."""


def _compute(graph: WhatIfGraph, actual: np.ndarray) -> pl.DataFrame:
    """The compute ops' rank, stage, dp_rank, step, optype and duration ``a``: only what the evidence reads.
    Selected before filtered: a filter copies every column it carries (the graph's 14 over 743 k compute ops
    of the OSDI'25 AR trace tiled 16x: ~140 MB at the what-if's peak)."""
    return graph.ops.select("rank", pl.col("stage").fill_null(0), pl.col("dp_rank").fill_null(0), "step",
                            "optype", pl.Series("a", actual), "comm").filter(~pl.col("comm")).drop("comm")


def _peer_ratio(df: pl.DataFrame, by: list[str], peers: list[str]) -> pl.DataFrame:
    """Per group ``by``: its mean of ``a`` over the mean of the others sharing ``peers`` (NaN-free: no peers, no row)."""
    per = df.group_by(by).agg(pl.col("a").sum().alias("s"), pl.len().alias("n"))
    per = per.with_columns(
        ((pl.col("s").sum().over(peers) - pl.col("s")) / (pl.col("n").sum().over(peers) - pl.col("n"))).alias("peer"),
        (pl.col("s") / pl.col("n")).alias("own"))
    return per.filter(pl.col("peer") > 0).with_columns((pl.col("own") / pl.col("peer")).alias("ratio"))


def _weighted(per: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    main = per.filter(pl.col("optype").is_in(list(PASSES)))
    main = main if main.height else per
    return main.group_by(key).agg(((pl.col("ratio") * pl.col("s")).sum() / pl.col("s").sum()).alias("r"))


def rank_speed(graph: WhatIfGraph, actual: np.ndarray) -> dict[int, float]:
    """rank -> its forward/backward compute over its stage peers' (per op type, weighted by time)."""
    per = _peer_ratio(_compute(graph, actual).filter(~pl.col("optype").is_in(list(STALL_TYPES))),
                      ["rank", "stage", "optype"], ["stage", "optype"])
    return dict(_weighted(per, ["rank"]).iter_rows())


def slow_ranks(graph: WhatIfGraph, actual: np.ndarray, at_least: float) -> list[dict]:
    """Ranks whose compute is >= at_least x their stage peers', with the steps where it is."""
    comp = _compute(graph, actual).filter(~pl.col("optype").is_in(list(STALL_TYPES)))
    speed = rank_speed(graph, actual)
    slow = _flagged(speed, at_least)
    stalled = _stalled_ranks(graph, actual, at_least, exclude=slow)
    if not slow:
        return stalled
    per_step = _weighted(_peer_ratio(comp, ["rank", "stage", "optype", "step"], ["stage", "optype", "step"]),
                         ["rank", "step"]).filter(pl.col("rank").is_in(slow) & (pl.col("r") >= min(at_least, OUTLIER_FLOOR)))
    steps = {r: sorted(s) for r, s in per_step.group_by("rank").agg(pl.col("step")).iter_rows()}
    place = dict(((r, (d, s)) for r, d, s in comp.group_by("rank").agg(
        pl.col("dp_rank").first(), pl.col("stage").first()).iter_rows()))
    by_type = _peer_ratio(comp, ["rank", "stage", "optype"], ["stage", "optype"]).filter(pl.col("rank").is_in(slow))
    types = {}
    # sorted: the group_by's order varies, and the report's keys followed it from run to run
    for r, o, x in by_type.select("rank", "optype", "ratio").sort("rank", "optype").iter_rows():
        types.setdefault(r, {})[o] = float(x)
    sigma = _robust_sigma(speed)
    out = [{"rank": int(r), "dp_rank": int(place[r][0]), "stage": int(place[r][1]), "factor": float(speed[r]),
            "sigmas_above_median": (float((speed[r] - np.median(list(speed.values()))) / sigma) if sigma > 0 else None),
            "steps": [int(s) for s in steps.get(r, [])], "by_optype": types.get(r, {})} for r in slow]
    return sorted(out + stalled, key=lambda x: (-x["factor"], x["rank"]))  # ties in rank order, run after run


def _robust_sigma(values: dict) -> float:
    v = np.array([x for x in values.values() if x is not None and np.isfinite(x)])
    return float(1.4826 * np.median(np.abs(v - np.median(v)))) if v.size >= 3 else 0.0


def _flagged(factor: dict, at_least: float) -> list:
    """Ranks at or above the threshold, or clear outliers above OUTLIER_FLOOR (see OUTLIER_SIGMAS)."""
    sigma = _robust_sigma(factor)
    med = float(np.median([x for x in factor.values() if x is not None])) if factor else 1.0
    return [r for r, v in factor.items() if v is not None and (
        v >= at_least or (v >= OUTLIER_FLOOR and sigma > 0 and (v - med) / sigma >= OUTLIER_SIGMAS))]


def _stalled_ranks(graph: WhatIfGraph, actual: np.ndarray, at_least: float, exclude: list) -> list[dict]:
    """Ranks whose own time with stalls (gc, data loading) is >= at_least x their stage peers', per step."""
    comp = _compute(graph, actual)
    stall = comp.filter(pl.col("optype").is_in(list(STALL_TYPES)))
    if stall.height == 0:
        return []
    per = comp.group_by("rank", "stage", "dp_rank", "step").agg(pl.col("a").sum().alias("s")).with_columns(
        ((pl.col("s").sum().over("stage", "step") - pl.col("s"))
         / (pl.len().over("stage", "step") - 1)).alias("peer")).filter(pl.col("peer") > 0).with_columns(
        (pl.col("s") / pl.col("peer")).alias("r"))
    agg = per.group_by("rank", "stage", "dp_rank").agg(
        (pl.col("s").sum() / pl.col("peer").sum()).alias("factor"),
        pl.col("step").filter(pl.col("r") >= min(at_least, OUTLIER_FLOOR)).sort().alias("steps"))
    stalls = dict(stall.group_by("rank").agg(pl.col("a").sum()).iter_rows())
    factor = dict(agg.select("rank", "factor").iter_rows())
    # a stall is a recorded event, not a speed estimate: a rank that stalls where its stage peers do
    # not (twice their median, and 1% of its own time) is a finding however little it costs
    own = dict(per.group_by("rank").agg(pl.col("s").sum()).iter_rows())
    stage_of = dict(agg.select("rank", "stage").iter_rows())
    peer_stall = {}
    for r, st in stage_of.items():
        others = [stalls.get(p, 0.0) for p, s2 in stage_of.items() if s2 == st and p != r]
        peer_stall[r] = float(np.median(others)) if others else 0.0
    stalling = [r for r in factor if stalls.get(r, 0.0) >= max(2 * peer_stall[r], 0.01 * own.get(r, 0.0))
                and stalls.get(r, 0.0) > 0]
    n_steps = max(1, len(graph.steps))
    return [{"rank": int(r["rank"]), "dp_rank": int(r["dp_rank"]), "stage": int(r["stage"]),
             "factor": float(r["factor"]), "steps": [int(x) for x in r["steps"]], "by_optype": {},
             "stall_ns_per_step": float(stalls.get(r["rank"], 0.0)) / n_steps, "with_stalls": True}
            for r in agg.filter(pl.col("rank").is_in(sorted(set(_flagged(factor, at_least)) | set(stalling)))
                                & ~pl.col("rank").is_in(exclude)).to_dicts()
            if stalls.get(r["rank"], 0.0) > 0]


def worker_evidence(graph: WhatIfGraph, actual: np.ndarray, m: WhatIfMetrics, n: int) -> list[dict]:
    """Top workers by S_w, each with its compute speed relative to its stage peers."""
    comp = _compute(graph, actual)
    speed = rank_speed(graph, actual)
    stalls = {r: (tot, k) for r, tot, k in comp.filter(pl.col("optype").is_in(list(STALL_TYPES))).group_by(
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


def stage_evidence(graph: WhatIfGraph, actual: np.ndarray) -> dict:
    """Per stage: mean forward/backward op time, and each stage's over the other stages'."""
    comp = _compute(graph, actual).filter(pl.col("optype").is_in(list(PASSES)))
    if comp.height == 0:
        return {}
    per = comp.group_by("stage").agg(pl.col("a").mean().alias("m")).sort("stage")
    m = per["m"].to_numpy()
    tot = m.sum()
    vs = {str(s): float(x / ((tot - x) / (len(m) - 1))) if len(m) > 1 and tot > x else None
          for s, x in zip(per["stage"].to_list(), m, strict=True)}
    # per step, each stage over the others: an imbalance under the finding threshold still counts when
    # it holds in every step (a partition is fixed; noise is not)
    ps = comp.group_by("stage", "step").agg(pl.col("a").mean().alias("m")).with_columns(
        ((pl.col("m").sum().over("step") - pl.col("m")) / (pl.len().over("step") - 1)).alias("o")).filter(
        pl.col("o") > 0).with_columns((pl.col("m") / pl.col("o")).alias("r"))
    # sorted: group_by's order varies run to run, and the report's key order should not
    lo = ({str(s): float(x) for s, x in ps.group_by("stage").agg(pl.col("r").min()).sort("stage").iter_rows()}
          if len(m) > 1 else {})
    consistent = [int(s) for s, x in lo.items() if x >= OUTLIER_FLOOR]
    return {"compute_mean_by_stage": dict(zip(per["stage"].to_list(), m.tolist(), strict=True)),
            "stage_vs_others": vs, "last_stage_vs_others": vs[str(per["stage"][-1])],
            "stage_vs_others_min_over_steps": lo, "slower_in_every_step": sorted(consistent)}


def _floor_ratio(comp: pl.DataFrame, rank: int, q: float) -> pl.DataFrame:
    """Per op class: the rank's ``q`` quantile of op durations over the other ranks' (pooled).

    On a busy host a descheduled op only ever runs longer, so a low quantile is the op's own cost
    (timeit's minimum, made robust to a single short outlier)."""
    mine = comp.filter(pl.col("rank") == rank).group_by("optype").agg(own=pl.col("a").quantile(q))
    rest = comp.filter(pl.col("rank") != rank).group_by("optype").agg(peer=pl.col("a").quantile(q))
    return mine.join(rest, on="optype").filter(pl.col("peer") > 0).with_columns(
        (pl.col("own") / pl.col("peer")).alias("ratio"))


def work_or_hardware(graph: WhatIfGraph, actual: np.ndarray, rank: int, tolerance: float = 0.1,
                     floor_quantile: float | None = None) -> dict:
    """A rank without stage peers (dp = 1, no TP): is it slow hardware or a stage with more work?

    Slower hardware slows every op class by about the same factor; more layers slow the passes
    (forward/backward) but not the rest (the optimizer step, the loss). Compares the rank's
    per-op-class mean with the other ranks' (all stages); with ``floor_quantile``, that low quantile of
    each class's op durations instead (records from a contended host). Returns {call: worker |
    stage_imbalance | ambiguous, passes, others, why}.
    """
    comp = _compute(graph, actual).filter(~pl.col("optype").is_in(list(STALL_TYPES)))
    if floor_quantile is not None:
        per = _floor_ratio(comp, rank, floor_quantile)
    else:
        per = _peer_ratio(comp, ["rank", "optype"], ["optype"]).filter(pl.col("rank") == rank)
    ratio = dict(per.select("optype", "ratio").iter_rows())
    passes = [ratio[o] for o in PASSES if o in ratio]
    rest = {o: x for o, x in ratio.items() if o not in PASSES}
    if not passes or not rest:
        return {"call": "ambiguous", "passes": passes, "others": rest,
                "why": "no op class outside forward/backward on this rank to tell more work from slower hardware"}
    p = float(np.mean(passes))
    r = float(np.median(list(rest.values())))
    if abs(r - 1) <= tolerance and p > 1 + tolerance:
        call, why = "stage_imbalance", f"forward/backward {p:.2f}x the other stages' but {', '.join(rest)} {r:.2f}x: more work, not slower hardware"
    elif abs(r / p - 1) <= tolerance and r > 1 + tolerance:
        call, why = "worker", f"every op class slower by about the same factor ({p:.2f}x passes, {r:.2f}x the rest): slower hardware"
    else:
        call, why = "ambiguous", f"forward/backward {p:.2f}x, the rest {r:.2f}x: neither all op classes alike nor passes alone"
    return {"call": call, "passes": p, "others": rest, "why": why}


MIN_LINK_RANKS = 3
"""Ranks with transfers needed before a slow link is named at one of them."""


def link_evidence(graph: WhatIfGraph, actual: np.ndarray, ideal: np.ndarray, at_least: float) -> list[dict]:
    """Ranks whose transfers run >= at_least x their op type's typical, most slowed ops first.

    A slow link slows every transfer that crosses it; the rank at its end is the one with the most
    slow transfers (its collectives and its point-to-point pairs both), its group peers share only some.
    """
    comm = graph.ops["comm"].to_numpy()
    if not comm.any():
        return []
    # With fewer than 3 ranks every transfer crosses the same link(s) both ends share: a slow
    # one cannot be pinned on either end (HTA's 2-rank sample flagged both ranks).
    if graph.ops["rank"].filter(pl.Series(comm)).n_unique() < MIN_LINK_RANKS:  # the one column, not the ops
        return []
    df = pl.DataFrame({"rank": graph.ops["rank"], "step": graph.ops["step"], "a": actual, "i": ideal,
                       "comm": comm}).filter(pl.col("comm") & (pl.col("i") > 0)).with_columns(
        (pl.col("a") / pl.col("i")).alias("x"))
    per = df.group_by("rank").agg(
        pl.col("x").filter(pl.col("x") >= at_least).median().alias("factor"),
        (pl.col("x") >= at_least).sum().alias("n_slow"), pl.len().alias("n"),
        pl.col("step").filter(pl.col("x") >= at_least).unique().sort().alias("steps")).filter(pl.col("n_slow") > 0)
    # ties (equal counts and ratios) in rank order: the report lists them the same way on every run
    per = per.sort(["n_slow", "factor", "rank"], descending=[True, True, False])
    return [{"rank": int(r["rank"]), "factor": float(r["factor"]), "slow_transfers": int(r["n_slow"]),
             "transfers": int(r["n"]), "steps": [int(s) for s in r["steps"]]} for r in per.head(8).to_dicts()]


MIN_LINK_STEPS = 2
"""a link is persistently slow only when seen in at least this many steps (one step cannot show persistence)."""


def persistent_links(graph: WhatIfGraph, actual: np.ndarray, ideal: np.ndarray, at_least: float) -> list[dict]:
    """Ranks whose transfers of one op type run >= at_least x their peers' in most steps (issue 12: a link
    whose transfers are >= 1.5x its peers').

    Per step and op type, each rank's median transfer (actual over the op's typical) is set against
    the median of the other ranks with that op type; the factor is the smallest over the steps. A
    slow link slows its transfers in every step; a busy host's descheduled transfers land on any
    rank, a step at a time (on real gloo CPU traces a clean job's ranks stood out 1.5-4.9x in two of
    three steps, never in all). This is the link evidence a ``communication`` verdict needs."""
    comm = graph.ops["comm"].to_numpy()
    if not comm.any():
        return []
    df = pl.DataFrame({"rank": graph.ops["rank"], "step": graph.ops["step"], "optype": graph.ops["optype"],
                       "a": actual, "i": ideal, "comm": comm}).filter(pl.col("comm") & (pl.col("i") > 0))
    per = df.group_by("rank", "step", "optype").agg((pl.col("a") / pl.col("i")).median().alias("x"))
    if per["rank"].n_unique() < MIN_LINK_RANKS:
        return []
    per = per.sort("step", "optype", "x")
    peers = per.with_columns(px=pl.Series(_median_of_others(per)))
    out = peers.filter(pl.col("px").is_not_nan()).with_columns((pl.col("x") / pl.col("px")).alias("vs_peers")).group_by("rank", "optype").agg(
        pl.col("vs_peers").min().alias("factor"), pl.col("step").sort().alias("steps")).filter(
        (pl.col("factor") >= at_least) & (pl.col("steps").list.len() >= MIN_LINK_STEPS)).sort(
        # rank and op break ties (a link's two directions often have one factor): group_by's order varies
        "factor", "rank", "optype", descending=[True, False, False])
    return [{"rank": int(r["rank"]), "op": r["optype"], "factor": float(r["factor"]),
             "steps": [int(s) for s in r["steps"]]} for r in out.to_dicts()]


def _median_of_others(per: pl.DataFrame) -> np.ndarray:
    """Per row of ``per`` (sorted by step, optype, x), the median x of the other rows of its (step,
    optype): a leave-one-out median read off the sorted group, O(n) where the self-join it replaces
    was O(ranks^2) per step (5 s and 3 GB at 512 GPUs). NaN where a row has no peer."""
    x = per["x"].to_numpy().astype(float)
    key = per.select(pl.struct("step", "optype").rle_id()).to_series().to_numpy()
    n_rows = len(x)
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if n_rows else np.array([], dtype=np.int64)
    sizes = np.diff(np.r_[starts, n_rows])
    o = np.repeat(starts, sizes)
    n = np.repeat(sizes, sizes)
    k = np.arange(n_rows) - o
    m = n - 1
    lo, hi = (m - 1) // 2, m // 2
    lo = np.where(lo < k, lo, lo + 1)  # index among the others -> index in the group
    hi = np.where(hi < k, hi, hi + 1)
    ok = m >= 1
    out = np.full(n_rows, np.nan)
    out[ok] = (x[(o + lo)[ok]] + x[(o + hi)[ok]]) / 2
    return out
