"""Sequence-length imbalance as a what-if of its own (beyond OSDI'25).

Variable-length sequences make some microbatches (and some DP ranks) heavier
than others; every stage of the pipeline carrying that microbatch is slow in
both its forward and its backward. Two ways to see it:

- with ``batch_meta`` (sequence lengths): fit compute ~ a*s + b*s^2 per stage
  and op type from the trace (least squares), rebalance the step's sequences
  across DP ranks and microbatches greedily (longest first into the least
  loaded bin; with one sequence per microbatch the bins get the mean cost,
  the packed limit), put the model's change on each compute op and replay;
- without lengths: detect it from the per-microbatch correlation of forward
  and backward durations (within each rank and step, so a uniformly slow
  worker does not count; the paper uses Pearson >= 0.9), or, where a few
  descheduled passes on a busy host spoil the correlation, from agreement:
  the microbatch that takes longest in one pass, by a clear margin over that
  pass's median, is also the longest in another pass far more often than
  chance says. Passes are paired across consecutive stages of a pipeline
  (forward with forward, backward with backward: different processes, which
  one descheduling cannot stretch together), else a rank's own forward with
  its backward unless they run back to back (1F1B's last stage). Its share
  comes from replaying with each microbatch's compute at its step's mean,
  each rank keeping its own long-run speed.

Share = (T - T_balanced) / (T - T_ideal), like M_W and M_S.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from rankscope.analysis.model.sort_key import packed_sort_key, sort_by_columns
from rankscope.analysis.whatif.graph import BWD, FWD, WhatIfGraph
from rankscope.analysis.whatif.scenarios import Scenarios, step_times
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.record_class import record


@record
class SequenceConfig:
    min_pearson: float = 0.9
    """forward/backward per-microbatch correlation that counts as sequence imbalance (paper: 0.9)."""
    min_r2: float = 0.5
    """with lengths: the a*s + b*s^2 fit must explain this much of the compute variance."""
    max_agreement_p: float = 1e-3
    """without lengths: chance probability (binomial tail) below which heaviest-microbatch agreement counts."""
    min_heavy_ratio: float = 1.2
    """without lengths: the agreeing heaviest microbatch must take this times its pass's median, in both passes."""

    def __post_init__(self):
        if not -1 <= self.min_pearson <= 1:
            raise ConfigError(f"min_pearson={self.min_pearson!r}; expected a value in [-1, 1]")
        if not 0 <= self.min_r2 <= 1:
            raise ConfigError(f"min_r2={self.min_r2!r}; expected a value in [0, 1]")


def _compute_ops(graph: WhatIfGraph, actual: np.ndarray) -> pl.DataFrame:
    # optype as a two-value enum: every grouping here keys on it, and hashing a byte per op instead of
    # its string took a third off the section at 1,024 workers
    # selected before filtered: a filter copies every column it carries (the graph's 14 at 1.9 M ops)
    return graph.ops.select(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"), "rank", pl.col("dp_rank").fill_null(0),
        pl.col("stage").fill_null(0), "step", "microbatch", pl.col("optype").cast(pl.Enum([FWD, BWD]), strict=False),
        pl.Series("a", actual), "start_ns").filter(pl.col("optype").is_not_null() & pl.col("microbatch").is_not_null())


def per_microbatch(cops: pl.DataFrame) -> pl.DataFrame:
    """One row per (rank, step, microbatch, optype): a (summed), pipe and stage (its pipeline: dp_rank, else
    the rank; stage, else 0), start_ns (the first start) when cops has it. Both tests of the section read it."""
    pipe = pl.col("dp_rank") if "dp_rank" in cops.columns else pl.col("rank")
    stage = pl.col("stage") if "stage" in cops.columns else pl.lit(0)
    start = [pl.col("start_ns")] if "start_ns" in cops.columns else []
    if _one_op_each(cops, ["rank", "step", "microbatch", "optype"]):
        # each group is one op, which is then its own sum, first and min: the group-by's index lists held
        # 3x the result at once (AR tiled 16x: +84 MiB over 0.7 M ops, the straggler section's peak)
        return cops.select("rank", "step", "microbatch", "optype", "a", pipe.alias("pipe"), stage.alias("stage"),
                           *start)
    return cops.group_by("rank", "step", "microbatch", "optype").agg(
        pl.col("a").sum(), pipe.first().alias("pipe"), stage.first().alias("stage"), *(c.min() for c in start))


def _one_op_each(df: pl.DataFrame, key: list[str]) -> bool:
    """Whether no two rows of ``df`` share their values of the columns ``key`` (integers, or categories read
    as their codes); False as well when those columns cannot be packed into one int64 (nulls, wide ranges)."""
    codes = df.select(pl.col(c).to_physical() if isinstance(df.schema[c], (pl.Enum, pl.Categorical)) else c
                      for c in key)
    packed = packed_sort_key(codes, key)
    if packed is None:
        return False
    # stable: nearly sorted already (ops come by rank, then step), which a merge sort takes in a few runs
    k = np.sort(codes.select(packed.alias("k"))["k"].to_numpy(), kind="stable")
    return not bool((k[1:] == k[:-1]).any())


def fwd_bwd_pearson(cops: pl.DataFrame, per_mb: pl.DataFrame | None = None) -> float:
    """Pearson r of forward vs backward duration per microbatch, centred per (rank, step).

    Needs columns rank, step, microbatch, optype, a. NaN when there are too few pairs. ``per_mb``:
    :func:`per_microbatch` of ``cops`` when the caller has it.
    """
    key = ["rank", "step", "microbatch"]
    per_mb = per_microbatch(cops) if per_mb is None else per_mb
    # selected before filtered: a filter copies every column it carries
    f = per_mb.select(*key, "optype", pl.col("a").alias(FWD)).filter(pl.col("optype") == FWD).drop("optype")
    b = per_mb.select(*key, "optype", pl.col("a").alias(BWD)).filter(pl.col("optype") == BWD).drop("optype")
    # sorted so the sums reach corrcoef in one order: reports are reproducible to the last digit
    w = sort_by_columns(f.join(b, on=key, how="inner"), key).with_columns(
        (pl.col(FWD) - pl.col(FWD).mean().over("rank", "step")).alias("x"),
        (pl.col(BWD) - pl.col(BWD).mean().over("rank", "step")).alias("y"))
    if w.height < 3:
        return float("nan")
    x, y = w["x"].to_numpy(), w["y"].to_numpy()
    if x.std() == 0 or y.std() == 0:
        return 0.0
    return float(np.corrcoef(x, y)[0, 1])


def heaviest_agreement(cops: pl.DataFrame, min_ratio: float, per_mb: pl.DataFrame | None = None) -> dict:
    """Whether the microbatch that takes longest in one pass is also the longest in another, more often
    than chance: a long sequence is heavy in every pass of every stage it goes through.

    Needs columns rank, step, microbatch, optype, a; dp_rank and stage (one pipeline per rank without
    them) and start_ns optional. Each (rank, step, pass) is one observation: its heaviest microbatch,
    standing out when it takes at least ``min_ratio`` times the median. Observations are paired so
    that no two pairs share one (so the pairs are independent whatever each one's odds):

    - in each pipeline and step, consecutive stages (one rank per stage) pair their forwards and
      their backwards: different processes, so one descheduling cannot stretch both;
    - a rank left over (an odd stage, TP peers) pairs its own forward and backward, unless its
      heaviest forward is directly followed by its own backward (the last stage of 1F1B), where one
      descheduling stretches both.

    A pair agrees when both stand out on the same microbatch. The chance of that is sum_k q_k^2, q
    the share of standing-out observations on microbatch k over the whole job: a microbatch index
    that is always heavy (a step's first pass warming up) raises the chance, so position is not
    taken for length. Returns {pairs (both standing out), agree, chance, p_value (binomial tail),
    left_out_back_to_back}.
    """
    timed = "start_ns" in cops.columns
    per_mb = per_microbatch(cops) if per_mb is None else per_mb
    obs = per_mb.group_by("rank", "step", "optype").agg(
        pl.len().alias("m"), pl.col("microbatch").sort_by("a", "microbatch").last().alias("heavy"),
        (pl.col("a").max() / pl.col("a").median()).alias("ratio"), pl.first("pipe"), pl.first("stage"),
    ).filter(pl.col("m") >= 3).with_columns((pl.col("ratio") >= min_ratio).alias("out"))
    # one rank per stage of a pipeline carries the cross-stage pairs; consecutive stages pair up (the
    # inner join leaves an odd last stage to pair with itself below)
    reps = (obs.group_by("pipe", "step", "stage").agg(pl.col("rank").min()).sort("pipe", "step", "stage")
            .with_columns((pl.int_range(pl.len()).over("pipe", "step")).alias("pos")))
    cols = ["heavy", "out"]
    first = reps.filter(pl.col("pos") % 2 == 0).select("pipe", "step", "pos", pl.col("rank").alias("r1"))
    second = reps.filter(pl.col("pos") % 2 == 1).select("pipe", "step", (pl.col("pos") - 1).alias("pos"),
                                                       pl.col("rank").alias("r2"))
    couples = first.join(second, on=["pipe", "step", "pos"])
    o = obs.select("rank", "step", "optype", *cols)
    across = (couples.join(o.rename({c: c + "1" for c in cols}), left_on=["r1", "step"], right_on=["rank", "step"])
              .join(o.rename({c: c + "2" for c in cols}), left_on=["r2", "step", "optype"],
                    right_on=["rank", "step", "optype"])
              .select(*(c + s for s in "12" for c in cols)))
    used = pl.concat([couples.select(pl.col("r1").alias("rank"), "step"),
                      couples.select(pl.col("r2").alias("rank"), "step")])
    own = obs.join(used, on=["rank", "step"], how="anti")
    f = own.filter(pl.col("optype") == FWD).select("rank", "step", *cols)
    b = own.filter(pl.col("optype") == BWD).select("rank", "step", *(pl.col(c).alias(c + "2") for c in cols))
    within = f.join(b, on=["rank", "step"])
    adjacent = 0
    if timed:
        # where a microbatch's backward directly follows its own forward (the last stage of 1F1B), one
        # descheduling of the rank stretches both: their agreement is no independent evidence
        n0 = within.height
        within = within.join(_back_to_back(per_mb), left_on=["rank", "step", "heavy"],
                             right_on=["rank", "step", "microbatch"], how="anti")
        adjacent = n0 - within.height
    within = within.rename({c: c + "1" for c in cols}).select(*(c + s for s in "12" for c in cols))
    pairs = pl.concat([across, within]).filter(pl.col("out1") & pl.col("out2"))
    agree = int(pairs.filter(pl.col("heavy1") == pl.col("heavy2")).height)
    # the chance is pooled over the job: a per-series estimate from a few steps would be mostly noise
    # sorted so the squares sum in one order: reports are reproducible to the last digit
    q = obs.filter(pl.col("out"))["heavy"].value_counts(normalize=True).sort("heavy")["proportion"].to_numpy()
    chance = float((q ** 2).sum()) if q.size else None
    p = _binomial_tail(agree, pairs.height, chance) if agree and chance < 1 else 1.0
    return {"pairs": int(pairs.height), "agree": agree, "chance": chance, "p_value": p,
            "left_out_back_to_back": adjacent}


def _back_to_back(units: pl.DataFrame) -> pl.DataFrame:
    """(rank, step, microbatch) whose backward is the rank's next pass after its forward. ``units``: one row
    per (rank, step, microbatch, optype) with its first start_ns."""
    units = units.select("rank", "step", "microbatch", "optype", "start_ns")
    # one packed int64 key where the columns allow: a sort on three columns was most of this function
    units = sort_by_columns(units, ["rank", "step", "start_ns"])
    # sorted by rank and step: the next row is the rank's next pass when it has the same rank and step
    # (a shift over windows regrouped every row)
    same = (pl.col("rank") == pl.col("rank").shift(-1)) & (pl.col("step") == pl.col("step").shift(-1))
    nxt = units.with_columns(pl.when(same).then(pl.col("microbatch").shift(-1)).alias("next_mb"),
                             pl.when(same).then(pl.col("optype").shift(-1)).alias("next_type"))
    return nxt.filter((pl.col("optype") == FWD) & (pl.col("next_type") == BWD)
                      & (pl.col("next_mb") == pl.col("microbatch"))).select("rank", "step", "microbatch")


def _binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): scipy's one-sided binomtest p-value.

    scipy.stats costs ~0.4 s to import, most of a small trace's analysis. When the Chernoff bound
    exp(-n KL(k/n || p)) lies below half the smallest double, the tail rounds to 0.0 in any exact
    evaluation (and scipy returns 0.0), so it is answered without the import.
    """
    q = k / n
    if 0 < p < q < 1:
        kl = q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))
        if n * kl > _UNDERFLOW_EXPONENT:
            return 0.0
    from scipy.stats import binomtest

    return float(binomtest(k, n, p, alternative="greater").pvalue)


# -ln(2.4e-324), with a margin: beyond it the tail is below half the smallest subnormal double
_UNDERFLOW_EXPONENT = 760.0


def _balanced_without_lengths(cops: pl.DataFrame) -> pl.DataFrame:
    # each rank keeps its long-run speed f_r; the step's microbatches all get the step's mean work
    return cops.with_columns(
        (pl.col("a").mean().over("rank", "optype") / pl.col("a").mean().over("stage", "optype")).alias("f")
    ).with_columns((pl.col("a") / pl.col("f")).alias("norm")).with_columns(
        (pl.col("f") * pl.col("norm").mean().over("stage", "step", "optype")).alias("new"))


def _balanced_with_lengths(cops: pl.DataFrame, batch_meta: pl.DataFrame) -> tuple[pl.DataFrame, dict]:
    bm = batch_meta.group_by("rank", "step", "microbatch").agg(
        pl.col("seq_len").alias("seqs"), pl.col("seq_len").sum().alias("tokens"),
        (pl.col("seq_len").cast(pl.Float64) ** 2).sum().alias("sq"))
    # lengths named on one rank of a dp rank apply to its whole pipeline
    dp_of = cops.group_by("rank").agg(pl.col("dp_rank").first())
    bm = bm.join(dp_of, on="rank", how="inner").unique(["dp_rank", "step", "microbatch"], keep="first")
    c = cops.join(bm.select("dp_rank", "step", "microbatch", "tokens", "sq", "seqs"),
                  on=["dp_rank", "step", "microbatch"], how="inner")
    if c.height == 0:
        return cops.with_columns(pl.col("a").alias("new")), {"matched": 0}
    fits, parts = {}, []
    for (stage, optype), g in c.group_by("stage", "optype"):
        X = np.column_stack([g["tokens"].to_numpy().astype(np.float64), g["sq"].to_numpy()])
        a, b, r2 = _fit_cols(X, g["a"].to_numpy())
        fits[f"{stage}/{optype}"] = {"a_per_token": a, "b_per_token2": b, "r2": r2}
        parts.append(g.with_columns((a * pl.col("tokens") + b * pl.col("sq")).alias("model"),
                                    pl.lit(a).alias("ca"), pl.lit(b).alias("cb")))
    c = pl.concat(parts)
    # per step: greedy (longest first, least loaded bin) over the sequences of all (dp rank, microbatch)
    bins = c.unique(["dp_rank", "step", "microbatch"]).select("dp_rank", "step", "microbatch", "seqs")
    new_tok = []
    for (step,), g in bins.group_by("step"):
        keys = list(zip(g["dp_rank"].to_list(), g["microbatch"].to_list(), strict=True))
        seqs = sorted((x for lst in g["seqs"].to_list() for x in lst), reverse=True)
        n = len(keys)
        if len(seqs) <= n:
            # one sequence per bin cannot be moved usefully: the packed limit, every bin the mean
            tot = float(sum(seqs)) / n
            sq = float(sum(x * x for x in seqs)) / n
            new_tok += [(d, step, m, tot, sq) for d, m in keys]
            continue
        load = np.zeros(n)
        tok = np.zeros(n)
        sqs = np.zeros(n)
        for x in seqs:
            j = int(np.argmin(load))
            load[j] += x + x * x / max(seqs[0], 1)
            tok[j] += x
            sqs[j] += x * x
        new_tok += [(d, step, m, float(tok[j]), float(sqs[j])) for j, (d, m) in enumerate(keys)]
    nt = pl.DataFrame(new_tok, schema={"dp_rank": pl.Int32, "step": pl.Int64, "microbatch": pl.Int32,
                                       "new_tokens": pl.Float64, "new_sq": pl.Float64}, orient="row")
    c = c.join(nt, on=["dp_rank", "step", "microbatch"], how="left").with_columns(
        (pl.col("a") - pl.col("model") + pl.col("ca") * pl.col("new_tokens") + pl.col("cb") * pl.col("new_sq"))
        .clip(lower_bound=0).alias("new"))
    return c, {"matched": c.height, "fits": fits}


def _fit_cols(X: np.ndarray, d: np.ndarray) -> tuple[float, float, float]:
    """Least-squares d ~ X @ (a, b) with a, b >= 0 (else the better single term); returns (a, b, r2)."""
    coef, *_ = np.linalg.lstsq(X, d, rcond=None)
    if coef.min() < 0:
        best = None
        for j in (0, 1):
            x = X[:, j]
            cj = max(0.0, float(x @ d / (x @ x))) if x @ x > 0 else 0.0
            err = float(np.sum((d - cj * x) ** 2))
            if best is None or err < best[0]:
                best = (err, j, cj)
        coef = np.zeros(2)
        coef[best[1]] = best[2]
    pred = X @ coef
    ss = float(np.sum((d - d.mean()) ** 2))
    r2 = 1 - float(np.sum((d - pred) ** 2)) / ss if ss > 0 else 0.0
    return float(coef[0]), float(coef[1]), r2


def sequence_whatif(graph: WhatIfGraph, actual: np.ndarray, T: float, T_ideal: float,
                    batch_meta: pl.DataFrame | None = None, config: SequenceConfig | None = None) -> dict:
    """Share of the slowdown explained by sequence-length imbalance (see :func:`balanced_sequences`)."""
    return balanced_sequences(graph, actual, T, T_ideal, batch_meta, config)[0]


def balanced_sequences(graph: WhatIfGraph, actual: np.ndarray, T: float, T_ideal: float,
                       batch_meta: pl.DataFrame | None = None,
                       config: SequenceConfig | None = None) -> tuple[dict, np.ndarray | None]:
    """Share of the slowdown explained by sequence-length imbalance.

    Needs graph.ops with forward/backward compute (optype forward-compute /
    backward-compute, microbatch set); batch_meta (rank, step, microbatch,
    seq_len) when the job wrote it. Returns ({share, detected, method,
    pearson, t_balanced, ...}, per-op durations of the balanced job or None).
    """
    config = config or SequenceConfig()
    cops = _compute_ops(graph, actual)
    if cops.height == 0:
        return {"share": 0.0, "detected": False, "method": None, "evaluated": False}, None
    per_mb = per_microbatch(cops)
    r = fwd_bwd_pearson(cops, per_mb)
    out = {"pearson": r}
    if batch_meta is not None and batch_meta.height:
        bal, info = _balanced_with_lengths(cops, batch_meta)
        fits = info.get("fits", {})
        r2 = float(np.mean([f["r2"] for f in fits.values()])) if fits else 0.0
        ratios = [f["b_per_token2"] / f["a_per_token"] for f in fits.values() if f["a_per_token"] > 0]
        # the cost model's shape, b/a (1/token): what attention adds per token of length, all fits agreeing
        out.update(method="lengths", fit=fits, matched_ops=info["matched"], mean_r2=r2,
                   b_over_a=float(np.median(ratios)) if ratios else None)
        detected = info["matched"] > 0 and r2 >= config.min_r2
    else:
        bal = _balanced_without_lengths(cops)
        agreement = heaviest_agreement(cops, config.min_heavy_ratio, per_mb)
        out.update(method="correlation", agreement=agreement)
        by_agreement = agreement["p_value"] < config.max_agreement_p
        detected = bool(np.isfinite(r) and r >= config.min_pearson) or by_agreement
    new = actual.copy()
    new[bal["row"].to_numpy()] = bal["new"].to_numpy()
    # the section's frames go before the balanced job's replay, which is its peak (AR tiled 16x: ~120 MB
    # of compute ops per microbatch and their balanced durations)
    del cops, per_mb, bal
    sc = Scenarios(np.zeros(len(actual), dtype=np.int64), np.array([[True]]), np.array([False]))
    t_bal = float(step_times(graph, new, new, sc)[:, 0].mean())
    gap = T - T_ideal
    raw = (T - t_bal) / gap if gap > 0 else 0.0
    out.update(t_balanced=t_bal, raw_share=float(raw), detected=detected, share=float(raw) if detected else 0.0,
               evaluated=True)
    return out, new
