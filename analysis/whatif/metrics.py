"""OSDI'25 what-if metrics: S, waste, S_t, S_w, M_W, M_S, per step, worker x step heatmap.

Definitions (as the authors' analyzer computes them):

- T: mean step time of the replayed actual trace (no launch delays);
  T_ideal: the same replay with every compute duration replaced by the mean
  of its op type and every communication transfer time by the median of its
  op type. S = T / T_ideal, waste = 1 - 1/S.
- S_x for an op group x (an op type, a dp rank, a stage): start from the
  ideal and put the actual durations back on x only; S_x = T_x / T_ideal.
- S_w of a worker (dp rank d, stage s) = min(S_d, S_s), the authors' cheap
  stand-in for fixing one worker alone (one replay per dp rank and stage,
  not per worker).
- M_W: remove the slowdown of the top 3% workers by S_w (ceil, at least 1)
  from the actual timeline: M_W = (T - T_rem) / (T - T_ideal); M_S the same
  for all workers of the last pipeline stage. Both may exceed 1 or be
  negative (the replay is not additive).
"""

from __future__ import annotations

import math
from dataclasses import field

import numpy as np
import polars as pl

from rankscope.analysis.whatif.graph import WhatIfGraph
from rankscope.analysis.whatif.scenarios import Scenarios, step_times
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.record_class import record

_PP_COMM = {"forward-send": "forward-pp-comm", "forward-recv": "forward-pp-comm",
            "backward-send": "backward-pp-comm", "backward-recv": "backward-pp-comm"}


@record
class MetricsConfig:
    top_worker_percent: float = 3.0
    """M_W fixes the top this-percent workers by S_w (at least one)."""

    def __post_init__(self):
        if not 0 < self.top_worker_percent <= 100:
            raise ConfigError(f"top_worker_percent={self.top_worker_percent!r}; expected a value in (0, 100]")


@record(frozen=False)
class WhatIfMetrics:
    T: float
    T_ideal: float
    S: float
    waste: float
    steps: list[int]
    step_T: list[float]
    step_T_ideal: list[float]
    step_S: list[float]
    by_optype: dict[str, float]
    by_dp_rank: dict[int, float]
    by_stage: dict[int, float]
    worker_S: dict[int, float]
    """S_w per rank."""
    worker_place: dict[int, tuple[int, int]]
    """rank -> (dp rank, stage)."""
    M_W: dict
    M_S: dict
    stage_fix: dict[int, float] = field(default_factory=dict)
    """per stage: share of the slowdown removed by making that stage's compute (no comm, no stalls) ideal."""
    per_step: dict = field(default_factory=dict)
    """{'by_optype'|'by_dp_rank'|'by_stage': {name: [per-step S]}}."""
    heatmap: dict = field(default_factory=dict)
    """{'workers': [rank...], 'steps': [...], 'slowdown': [[S_w per step] per worker]}."""
    worker_order: list[int] = field(default_factory=list)
    """ranks by S_w, highest first; ties (ranks of one (dp rank, stage) cell, e.g. a TP group)
    broken by the rank's own excess compute time, so the slow member of the cell comes first."""


STALL_TYPES = ("gc", "dataloader")
"""Op types that are pure stalls, not work: their ideal is 0. (OSDI'25 traces record a gc op of
length 0 on every rank, so this changes nothing there; where a source records a stall only where it
happened, a mean over the stalls alone would keep it in the ideal.)"""


def ideal_durations(graph: WhatIfGraph) -> np.ndarray:
    """Per-op ideal replay duration: compute -> mean of its op type, communication -> median, stalls -> 0.

    Needs graph.ops columns optype, comm, actual; with size_bytes a transfer's ideal is its size at the
    median rate (bytes/ns) of its op type.
    """
    ops = graph.ops
    typical = pl.col("actual").median().over("optype")
    if "size_bytes" in ops.columns:
        # transfers of one op type but different sizes (gradient buckets): the median *rate* of the
        # op type times the op's own size (a median per size would keep a slow group's own buckets slow)
        sized = pl.col("size_bytes").is_not_null() & (pl.col("size_bytes") > 0)
        rate = (pl.col("actual") / pl.col("size_bytes")).filter(sized).median().over("optype")
        typical = pl.when(sized & rate.is_not_null()).then(rate * pl.col("size_bytes")).otherwise(typical)
    return ops.select(
        pl.when(pl.col("optype").is_in(list(STALL_TYPES))).then(pl.lit(0.0))
        .when(pl.col("comm")).then(typical)
        .otherwise(pl.col("actual").mean().over("optype")).alias("i"))["i"].to_numpy()


def _remove_metric(t_ori: float, t_ideal: float, t_rem: float, t_add: float, what: list) -> dict:
    gap = t_ori - t_ideal
    rem = (t_ori - t_rem) / gap if gap > 0 else 0.0
    add = (t_add - t_ideal) / gap if gap > 0 else 0.0
    return {"rem": rem, "add": add, "t_rem": t_rem, "t_add": t_add, "fixed": what}


@record
class _OpCodes:
    """Where each op and rank sits: the (rank, op group) code of every op, numbered rank-major
    (``rank index * len(og_names) + op group index``), and each rank's dp rank and stage."""

    ranks: np.ndarray
    """the ranks, sorted."""
    og_names: list[str]
    """op groups (op types, with a pipeline direction's sends and recvs as one), sorted."""
    rank_i: np.ndarray
    """per op: its rank's index in ``ranks``."""
    og_i: np.ndarray
    """per op: its op group's index in ``og_names``."""
    labels: np.ndarray
    """per op: its code."""
    r_dp: np.ndarray
    r_st: np.ndarray
    """per rank: dp rank, stage."""
    dps: np.ndarray
    stages: np.ndarray
    """the distinct dp ranks and stages, sorted."""
    code_rank: np.ndarray
    code_og: np.ndarray
    """per code: its rank index and op group index."""


def rank_index(rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct ranks, sorted; each op's index among them). Ranks are small non-negative integers: a
    table over 0..max rank instead of a sort of every op's rank (or a search per op)."""
    if rank.dtype.kind not in "iu" or rank.size == 0 or rank.min() < 0 or rank.max() > 4 * rank.size + 1_000_000:
        ranks = np.unique(rank)
        return ranks, np.searchsorted(ranks, rank)
    present = np.bincount(rank) > 0
    return np.flatnonzero(present).astype(rank.dtype), (np.cumsum(present) - 1)[rank]


def _op_codes(ops: pl.DataFrame) -> _OpCodes:
    """The codes of ``ops`` (columns rank, optype, dp_rank, stage; dp_rank and stage without nulls)."""
    ranks, rank_i = rank_index(ops["rank"].to_numpy())
    # codes by hashing, not sorting: a sort of 2 M op type strings is the slow part of a big job; each op's
    # group index straight from its op type (a dozen distinct) through the op types as an enum's codes, not
    # through a column of group names (a cast to the enum is half the cost of a replace by a dict)
    optypes = ops["optype"].unique().to_list()
    og_of = {o: _PP_COMM.get(o, o) for o in optypes}
    og_names = sorted(set(og_of.values()))
    og_of_code = np.array([og_names.index(og_of[o]) for o in optypes], dtype=np.int64)
    og_i = og_of_code[ops["optype"].cast(pl.Enum(optypes)).to_physical().to_numpy()]
    n_og = len(og_names)
    place = ops.group_by("rank").agg(pl.col("dp_rank").first(), pl.col("stage").first()).sort("rank")
    r_dp = place["dp_rank"].to_numpy()
    r_st = place["stage"].to_numpy()
    return _OpCodes(ranks=ranks, og_names=og_names, rank_i=rank_i, og_i=og_i, labels=rank_i * n_og + og_i,
                    r_dp=r_dp, r_st=r_st, dps=np.unique(r_dp), stages=np.unique(r_st),
                    code_rank=np.repeat(np.arange(len(ranks)), n_og), code_og=np.tile(np.arange(n_og), len(ranks)))


def _first_scenarios(codes: _OpCodes, comm: np.ndarray) -> tuple[Scenarios, list]:
    """The scenarios of the first batched replay and their names, in column order: "actual", "ideal",
    the actual durations put back on the ideal for one ("dp", d), ("stage", s) or ("og", name) at a
    time, ("stage_rem", s) a stage's work made ideal in the actual, and "ms_rem"/"ms_add" the last
    stage made ideal in the actual / put back on the ideal. ``comm``: per op, whether it is communication."""
    rows, remove, names = [], [], []

    def add(sel: np.ndarray, rem: bool, name):
        rows.append(sel)
        remove.append(rem)
        names.append(name)

    n_codes = codes.code_rank.size
    code_dp, code_st = codes.r_dp[codes.code_rank], codes.r_st[codes.code_rank]
    add(np.ones(n_codes, bool), False, "actual")
    add(np.zeros(n_codes, bool), False, "ideal")
    for d in codes.dps:
        add(code_dp == d, False, ("dp", int(d)))
    for s in codes.stages:
        add(code_st == s, False, ("stage", int(s)))
    for j, o in enumerate(codes.og_names):
        add(codes.code_og == j, False, ("og", o))
    # work of a stage: its compute, without communication and stalls (a partition imbalance is compute)
    n_og = len(codes.og_names)
    og_work = (np.bincount(codes.og_i[comm], minlength=n_og) == 0) & ~np.isin(codes.og_names, STALL_TYPES)
    is_work = og_work[codes.code_og]
    for s in codes.stages:
        add((code_st == s) & is_work, True, ("stage_rem", int(s)))
    last = code_st == codes.stages.max()
    add(last, True, "ms_rem")
    add(last, False, "ms_add")
    return Scenarios(codes.labels, np.array(rows), np.array(remove)), names


def _worker_order(worker_S: dict[int, float], codes: _OpCodes, comm: np.ndarray, actual: np.ndarray,
                  ideal: np.ndarray) -> list[int]:
    """Ranks by S_w, highest first. S_w is one number per (dp rank, stage) cell, so the ranks of a
    cell (a TP group) tie; the authors then take the lower rank, which picks the wrong member when
    the slow one is not the first. Ties are broken by the rank's own excess compute time over the
    ideal (actual - ideal of its non-communication ops, ``comm`` false), then by rank."""
    work = ~comm
    # bincount adds in op order, as np.add.at does (the same sums, bit for bit), several times faster
    excess = np.bincount(codes.rank_i[work], weights=(actual - ideal)[work], minlength=len(codes.ranks))
    excess_of = {int(r): float(excess[i]) for i, r in enumerate(codes.ranks)}
    return sorted(worker_S, key=lambda r: (-worker_S[r], -excess_of[r], r))


def _per_step_slowdowns(col: dict, step_Ti: np.ndarray, codes: _OpCodes) -> tuple[dict, list]:
    """Per step S of every op group, dp rank and stage (``col``: step times by scenario name) and the
    worker x step heatmap of S_w: ({'by_optype'|'by_dp_rank'|'by_stage': {name: [S]}}, [[S_w] per rank])."""
    def step_s(n):
        return (col[n] / step_Ti).tolist()

    per = {"by_optype": {o: step_s(("og", o)) for o in codes.og_names},
           "by_dp_rank": {int(d): step_s(("dp", int(d))) for d in codes.dps},
           "by_stage": {int(s): step_s(("stage", int(s))) for s in codes.stages}}
    by_dp, by_stage = per["by_dp_rank"], per["by_stage"]
    heat = [[min(a, b) for a, b in zip(by_dp[int(codes.r_dp[i])], by_stage[int(codes.r_st[i])], strict=True)]
            for i in range(len(codes.ranks))]
    return per, heat


def compute_metrics(graph: WhatIfGraph, config: MetricsConfig | None = None,
                    ideal: np.ndarray | None = None) -> WhatIfMetrics:
    """All OSDI'25 metrics of one graph (two batched replays). ``ideal`` overrides ideal_durations."""
    config = config or MetricsConfig()
    ops = graph.ops.select("rank", "optype", pl.col("dp_rank").fill_null(0), pl.col("stage").fill_null(0))
    comm = graph.ops["comm"].to_numpy()
    actual = graph.actual
    ideal = ideal_durations(graph) if ideal is None else ideal
    codes = _op_codes(ops)
    ranks, r_dp, r_st, stages = codes.ranks, codes.r_dp, codes.r_st, codes.stages
    scenarios, names = _first_scenarios(codes, comm)
    st = step_times(graph, actual, ideal, scenarios)
    col = {n: st[:, i] for i, n in enumerate(names)}
    step_T, step_Ti = col["actual"], col["ideal"]
    T, Ti = float(step_T.mean()), float(step_Ti.mean())

    def ratio(n):
        return float(col[n].mean() / Ti)

    by_dp = {int(d): ratio(("dp", int(d))) for d in codes.dps}
    by_stage = {int(s): ratio(("stage", int(s))) for s in stages}
    by_og = {o: ratio(("og", o)) for o in codes.og_names}
    worker_S = {int(r): min(by_dp[int(r_dp[i])], by_stage[int(r_st[i])]) for i, r in enumerate(ranks)}
    order = _worker_order(worker_S, codes, comm, actual, ideal)
    n_top = max(1, math.ceil(len(ranks) * config.top_worker_percent / 100))
    top = order[:n_top]
    top_sel = np.isin(ranks[codes.code_rank], top)
    st2 = step_times(graph, actual, ideal,
                     Scenarios(codes.labels, np.array([top_sel, top_sel]), np.array([True, False])))
    m_w = _remove_metric(T, Ti, float(st2[:, 0].mean()), float(st2[:, 1].mean()), [int(r) for r in top])
    m_s = _remove_metric(T, Ti, float(col["ms_rem"].mean()), float(col["ms_add"].mean()),
                         [int(r) for r in ranks[r_st == stages.max()]])
    gap = T - Ti
    stage_fix = {int(s): (T - float(col[("stage_rem", int(s))].mean())) / gap if gap > 0 else 0.0 for s in stages}
    per, heat = _per_step_slowdowns(col, step_Ti, codes)
    return WhatIfMetrics(
        T=T, T_ideal=Ti, S=T / Ti if Ti > 0 else 1.0, waste=1 - Ti / T if T > 0 else 0.0,
        steps=[int(s) for s in graph.steps], step_T=step_T.tolist(), step_T_ideal=step_Ti.tolist(),
        step_S=(step_T / step_Ti).tolist(), by_optype=dict(sorted(by_og.items(), key=lambda x: -x[1])),
        by_dp_rank=by_dp, by_stage=by_stage, worker_S=worker_S,
        worker_place={int(r): (int(r_dp[i]), int(r_st[i])) for i, r in enumerate(ranks)},
        M_W=m_w, M_S=m_s, stage_fix=stage_fix, per_step=per,
        heatmap={"workers": [int(r) for r in ranks], "steps": [int(s) for s in graph.steps], "slowdown": heat},
        worker_order=order)
