"""Achieved GEMM throughput and its regressions, across ranks and against a baseline run.

Throughput is compared per *GEMM key*: (kernel class, m, n, k, batch, dtype);
the transpose/layout and kernel name are attributes of a key, so a rank or a
run that picked another layout or kernel for the same work is compared with
the others and that choice becomes the reason. Within one job, a rank whose TFLOP/s on a key is below the median of
the other ranks by the threshold is flagged; against a baseline run, a key
whose median TFLOP/s over ranks dropped below the threshold is flagged. Each
finding carries a probable reason: a different kernel chosen, a misaligned
dimension, or a rank slow on (nearly) every shape, which is what fewer SMs or
clock/power throttling looks like from the outside.

A measured throughput counts only above a noise floor (:class:`ThroughputConfig`):
enough calls, a mean call long enough that launch jitter and the timer's
resolution (inferred per rank from the durations' granularity: Kineto's
relative traces tick in whole microseconds) are a small part of it, and enough
ranks for a median of the others to mean something. Below it, a ratio of 0.5
is two ticks against one, not a slow kernel.

A rank's ratio also has to clear the run's own spread: each (rank, key) carries the relative
standard error of its mean call (``rel_se``: the calls' coefficient of variation over the square root
of their count), and a rank is slow on a key only when its ratio lies ``noise_z`` standard errors
(its own and the key's typical one, combined) below 1. On a GPU a kernel's calls agree to a few
percent, so this floor is far below the threshold; on CPU processes that share cores the calls of
one shape spread over several times their median, and a 0.6 ratio between two ranks is that spread.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.kernels.alignment import AlignmentConfig, alignment_findings, gemm_rows
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.record_class import record

KEY = ["kernel_class", "m", "n", "k", "batch", "dtype"]
"""Columns that identify a GEMM for throughput comparison."""


@record
class ThroughputConfig:
    """Thresholds of the throughput comparisons."""

    threshold: float = 0.9
    """a ratio (achieved / reference TFLOP/s) below this is flagged."""
    min_ranks: int = 3
    """a key needs this many ranks before ranks are compared with each other: with two, the median of
    "the others" is one rank, and which of the two is the slow one cannot be told."""
    min_calls: int = 3
    """a (rank, key) needs this many calls to count: one or two calls are one warm-up or one preemption."""
    min_call_ns: int = 5_000
    """a (rank, key) whose mean call is shorter does not count: below ~5 us a kernel's measured time is
    mostly launch and clock jitter."""
    min_ticks: int = 50
    """a (rank, key) whose mean call spans fewer ticks of its rank's timer does not count: one tick of
    quantisation is then more than 2% of the call."""
    uniform_fraction: float = 0.6
    """a rank flagged on at least this share of its keys (and on two or more) is called uniformly slow."""
    noise_z: float = 3.0
    """a rank's ratio on a key counts only when it is this many standard errors of the mean call below 1
    (the rank's and the key's typical, combined in quadrature, on a log scale): the run's own spread."""

    def __post_init__(self):
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.min_ranks < 2:
            raise ConfigError(f"min_ranks must be >= 2, got {self.min_ranks}")
        if self.min_calls < 1:
            raise ConfigError(f"min_calls must be >= 1, got {self.min_calls}")
        if self.min_call_ns < 0 or self.min_ticks < 0:
            raise ConfigError(f"min_call_ns and min_ticks must be >= 0, got {self.min_call_ns}/{self.min_ticks}")
        if not 0.0 < self.uniform_fraction <= 1.0:
            raise ConfigError(f"uniform_fraction must be in (0, 1], got {self.uniform_fraction}")
        if self.noise_z < 0:
            raise ConfigError(f"noise_z must be >= 0, got {self.noise_z}")


def rank_throughput(compute_op: pl.DataFrame, min_calls: int | ThroughputConfig = 1) -> pl.DataFrame:
    """Achieved TFLOP/s per (rank, GEMM key), above the noise floor when given a ThroughputConfig.

    Needs compute_op columns ``rank, name, category, start_ns, end_ns, m, n, k, dtype`` (``flops, batch,
    layout`` optional; FLOPs default to 2*m*n*k*batch). Returns ``rank`` + KEY + ``kernel`` (the most used
    kernel name), ``kernel_set`` and ``layout_set`` (the distinct names / layouts, comma-joined),
    ``layout`` (most used), ``num_calls, flops, time_ns, tflops`` and ``rel_se`` (the relative standard error
of the mean call: the calls' coefficient of variation over sqrt(num_calls)).
    """
    return _throughput(compute_op, ["rank", *KEY], min_calls)


def name_throughput(compute_op: pl.DataFrame, min_calls: int | ThroughputConfig = 1) -> pl.DataFrame:
    """Like :func:`rank_throughput`, per (rank, key, kernel name): which kernel of a key lost the time."""
    return _throughput(compute_op, ["rank", *KEY, "kernel"], min_calls)


def timer_resolution_ns(durations_ns: pl.Series) -> int:
    """The tick of the timer that measured these durations: the largest power of ten (1 ns .. 1 ms)
    that divides at least 99% of the non-zero ones (a few rescaled or clock-corrected values may not)."""
    d = durations_ns.drop_nulls()
    d = d.filter(d > 0)
    if d.len() == 0:
        return 1
    for tick in (10**j for j in range(6, 0, -1)):
        if float((d % tick == 0).mean()) >= 0.99:
            return tick
    return 1


def _floor(g: pl.DataFrame, min_calls, cfg: ThroughputConfig | None) -> pl.Expr:
    calls = cfg.min_calls if cfg is not None else int(min_calls)
    keep = (pl.col("num_calls") >= calls) & (pl.col("time_ns") > 0)
    if cfg is None:
        return keep
    ticks = {r: timer_resolution_ns(part["dur_ns"]) for (r,), part in g.partition_by("rank", as_dict=True).items()}
    tick = pl.col("rank").replace_strict(ticks, default=1, return_dtype=pl.Int64)
    mean_call = pl.col("time_ns") / pl.col("num_calls")
    return keep & (mean_call >= cfg.min_call_ns) & (mean_call >= cfg.min_ticks * tick)


def _timed_on_device(compute_op: pl.DataFrame) -> pl.DataFrame:
    """GEMM rows that time a GEMM. On a rank whose records include GPU kernels (``grid`` set), only
    kernel rows do: the span of a CPU-side aten op there is its dispatch, not the matrix multiply."""
    g = gemm_rows(compute_op)
    if g.height == 0 or "grid" not in compute_op.columns:
        return g
    gpu_ranks = compute_op.select("rank", "grid").filter(pl.col("grid").is_not_null())["rank"].unique().to_list()
    return g.filter(~pl.col("rank").is_in(gpu_ranks) | pl.col("grid").is_not_null())


def _throughput(compute_op: pl.DataFrame, by: list[str], min_calls) -> pl.DataFrame:
    cfg = min_calls if isinstance(min_calls, ThroughputConfig) else None
    g = _timed_on_device(compute_op)
    if g.height == 0:
        return _empty_rank_tp()
    g = g.with_columns(pl.col("flops").fill_null(
        2.0 * pl.col("m").cast(pl.Float64) * pl.col("n") * pl.col("k") * pl.col("batch")))
    aggs = [pl.col("layout").mode().sort().first().alias("layout"),
            pl.col("layout").unique().sort().str.join(",").alias("layout_set"),
            pl.len().alias("num_calls"), pl.col("flops").sum().alias("flops"),
            pl.col("dur_ns").sum().alias("time_ns"),
            (pl.col("dur_ns").std().fill_null(0.0) / pl.col("dur_ns").mean() / pl.len().sqrt()).alias("rel_se")]
    if "kernel" not in by:
        aggs += [pl.col("kernel").mode().sort().first().alias("kernel"),
                 pl.col("kernel").unique().sort().str.join(",").alias("kernel_set")]
    out = g.group_by(by).agg(aggs)
    if "kernel" in by:
        out = out.with_columns(pl.col("kernel").alias("kernel_set"))
    out = out.filter(_floor(g, min_calls, cfg))
    return out.with_columns((pl.col("flops") / pl.col("time_ns") / 1e3).alias("tflops")).sort(by)


def leave_one_out_median(group_ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each element, the median of the other elements of its group (NaN for a group of one).

    Vectorised: sort once by (group, value), then index the two middle elements of the group without
    the element itself.
    """
    n_total = len(values)
    if n_total == 0:
        return np.zeros(0)
    order = np.lexsort((values, group_ids))
    g, v = group_ids[order], values[order]
    starts_mask = np.r_[True, g[1:] != g[:-1]]
    starts = np.flatnonzero(starts_mask)
    sizes = np.diff(np.r_[starts, n_total])
    grp_index = np.cumsum(starts_mask) - 1
    s, n = starts[grp_index], sizes[grp_index]
    i = np.arange(n_total) - s
    others = n - 1
    j1 = np.where(others % 2 == 1, (others - 1) // 2, others // 2 - 1)
    j2 = np.where(others % 2 == 1, (others - 1) // 2, others // 2)
    j1, j2 = np.maximum(j1, 0), np.maximum(j2, 0)
    idx1 = np.minimum(s + j1 + (j1 >= i), n_total - 1)
    idx2 = np.minimum(s + j2 + (j2 >= i), n_total - 1)
    med_sorted = np.where(others > 0, (v[idx1] + v[idx2]) / 2.0, np.nan)
    out = np.empty(n_total)
    out[order] = med_sorted
    return out


def cross_rank_findings(rank_tp: pl.DataFrame, config: ThroughputConfig | None = None,
                        names: pl.DataFrame | None = None) -> pl.DataFrame:
    """Ranks whose GEMM throughput on a key is below the other ranks' median by the threshold.

    Needs the frame of :func:`rank_throughput`, and optionally :func:`name_throughput`: then each kernel
    name of a key is compared on its own too (one slow kernel among several of one shape is not diluted)
    and the finding names the kernel with the lowest ratio. Returns one row per (key, reason) with
    ``kernel`` (most common worst kernel), ``kernels``, ``ranks``, ``ratio`` (lowest of those ranks),
    ``tflops`` (theirs, lowest), ``reference_tflops`` (others' median), ``layout``, ``reason`` and
    ``comparison`` = ``ranks``.
    """
    cfg = config or ThroughputConfig()
    if rank_tp.height == 0:
        return _empty_findings()
    df = rank_tp.with_columns(pl.len().over(KEY).alias("_num_ranks")).filter(
        pl.col("_num_ranks") >= cfg.min_ranks)
    if df.height == 0:
        return _empty_findings()
    df = df.with_columns(_loo_ratio(df, KEY)).with_columns(_noise(KEY))
    if names is not None and names.height:
        df = _with_worst_kernel(df, names.with_columns(_loo_ratio(names, [*KEY, "kernel"]))
                                .with_columns(_noise([*KEY, "kernel"])))
    df = df.join(_common_choice(df), on=KEY, how="left")
    df = df.with_columns(((pl.col("ratio") < cfg.threshold)
                          & (-pl.col("ratio").log() > cfg.noise_z * pl.col("_noise"))).alias("_slow"))
    per_rank = df.group_by("rank").agg(pl.col("_slow").sum().alias("_n_slow"), pl.len().alias("_n_keys"))
    df = df.join(per_rank, on="rank").filter(pl.col("_slow"))
    if df.height == 0:
        return _empty_findings()
    uniform = (pl.col("_n_slow") >= 2) & (pl.col("_n_slow") >= cfg.uniform_fraction * pl.col("_n_keys"))
    df = df.with_columns(
        _choice_reason("instead of")
        .when(uniform)
        .then(pl.lit("rank slow on ") + pl.col("_n_slow").cast(pl.String) + pl.lit(" of ")
              + pl.col("_n_keys").cast(pl.String)
              + pl.lit(" GEMM shapes: fewer SMs or clock/power throttling pattern"))
        .otherwise(pl.lit("slower than the other ranks on this shape only (contention or co-located work)"))
        .alias("reason"))
    return _collapse(df, "ranks")


def baseline_findings(rank_tp: pl.DataFrame, base_tp: pl.DataFrame, config: ThroughputConfig | None = None,
                      alignment: pl.DataFrame | None = None, names: pl.DataFrame | None = None,
                      base_names: pl.DataFrame | None = None) -> pl.DataFrame:
    """GEMM keys whose median TFLOP/s over ranks fell below the baseline's by the threshold.

    Needs two frames of :func:`rank_throughput` (this run, baseline), optionally this run's
    :func:`~rankscope.analysis.kernels.alignment.alignment_findings` and both runs' :func:`name_throughput`
    (kernel names both runs ran are compared on their own too). Returns the columns of
    :func:`cross_rank_findings` with ``comparison`` = ``baseline``; ``ranks`` are this run's ranks below
    the threshold against the baseline.
    """
    cfg = config or ThroughputConfig()
    if rank_tp.height == 0 or base_tp.height == 0:
        return _empty_findings()
    base = base_tp.group_by(KEY).agg(pl.col("tflops").median().alias("reference_tflops")).join(
        _common_choice(base_tp), on=KEY)
    df = rank_tp.join(base, on=KEY, how="inner").with_columns(
        (pl.col("tflops") / pl.col("reference_tflops")).alias("ratio"))
    if df.height == 0:
        return _empty_findings()
    if names is not None and base_names is not None and names.height and base_names.height:
        ref = base_names.group_by([*KEY, "kernel"]).agg(pl.col("tflops").median().alias("_nref"))
        df = _with_worst_kernel(df, names.join(ref, on=[*KEY, "kernel"], how="left").with_columns(
            (pl.col("tflops") / pl.col("_nref")).alias("name_ratio")))
    key_ratio = df.group_by(KEY).agg(pl.col("ratio").median().alias("_key_ratio"))
    n_keys, n_slow = key_ratio.height, int((key_ratio["_key_ratio"] < cfg.threshold).sum())
    df = df.join(key_ratio, on=KEY).filter(
        (pl.col("_key_ratio") < cfg.threshold) & (pl.col("ratio") < cfg.threshold))
    if df.height == 0:
        return _empty_findings()
    mis = _misaligned_keys(alignment)
    df = df.join(mis, on=KEY, how="left") if mis is not None else df.with_columns(
        pl.lit(None, dtype=pl.String).alias("_mis_reason"))
    whole_run = n_slow >= 2 and n_slow >= cfg.uniform_fraction * n_keys
    df = df.with_columns(
        _choice_reason("instead of baseline's")
        # A whole run slower on most shapes points at the device, even where a shape is misaligned too.
        .when(pl.lit(whole_run))
        .then(pl.lit(f"slower on {n_slow} of {n_keys} GEMM shapes than the baseline: fewer SMs, lower "
                     "clocks or a different device")
              + pl.when(pl.col("_mis_reason").is_not_null())
              .then(pl.lit("; also misaligned dim: ") + pl.col("_mis_reason")).otherwise(pl.lit("")))
        .when(pl.col("_mis_reason").is_not_null()).then(pl.lit("misaligned dim: ") + pl.col("_mis_reason"))
        .otherwise(pl.lit("slower than the baseline on this shape")).alias("reason"))
    return _collapse(df.drop("_key_ratio"), "baseline")


def _loo_ratio(df: pl.DataFrame, key: list[str]) -> list[pl.Series]:
    """Columns ``reference_tflops`` (median of the other ranks on the same key) and ``ratio``
    (named ``name_ratio`` when the key includes the kernel)."""
    gid = df.select(pl.struct(key).rank("dense"))[:, 0].to_numpy().astype(np.int64)
    ref = leave_one_out_median(gid, df["tflops"].to_numpy())
    ratio = df["tflops"].to_numpy() / ref
    if "kernel" in key:
        return [pl.Series("name_ratio", ratio)]
    return [pl.Series("reference_tflops", ref), pl.Series("ratio", ratio)]


def _noise(key: list[str]) -> pl.Expr:
    """``_noise``: the standard error of a ratio of mean calls, on a log scale (relative errors are small
    or capped): the rank's own and the median of the key's ranks', combined."""
    own = pl.col("rel_se").fill_nan(0.0)
    return (own.pow(2) + own.median().over(key).pow(2)).sqrt().alias("_noise")


def _common_choice(df: pl.DataFrame) -> pl.DataFrame:
    """The kernel set and layout set most ranks chose per key: a rank that differs chose otherwise."""
    return df.group_by(KEY).agg(pl.col("kernel_set").mode().sort().first().alias("_common_kernels"),
                                pl.col("layout_set").mode().sort().first().alias("_common_layouts"))


def _choice_reason(versus: str):
    return (pl.when(pl.col("kernel_set") != pl.col("_common_kernels"))
            .then(pl.lit("different kernel chosen: ") + pl.col("kernel_set") + pl.lit(f" {versus} ")
                  + pl.col("_common_kernels"))
            .when(pl.col("layout_set") != pl.col("_common_layouts"))
            .then(pl.lit("different layout (transpose) chosen: ") + pl.col("layout_set")
                  + pl.lit(f" {versus} ") + pl.col("_common_layouts")))


def _with_worst_kernel(df: pl.DataFrame, names: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, key): ``kernel`` becomes the name with the lowest ``name_ratio`` (a name with no reference,
    run by no other rank or not in the baseline, counts as the worst) and ``ratio`` the lower of the key's
    and that name's ratio."""
    # baseline comparisons carry no floor of their own (two runs, not one run's spread)
    names, df = (x if "_noise" in x.columns else x.with_columns(pl.lit(0.0).alias("_noise")) for x in (names, df))
    worst = (names.with_columns(pl.col("name_ratio").fill_nan(None))
             .sort(pl.col("name_ratio").fill_null(0.0)).group_by(["rank", *KEY])
             .agg(pl.col("kernel").first().alias("_worst"), pl.col("name_ratio").min().alias("_worst_ratio"),
                  pl.col("_noise").first().alias("_worst_noise")))
    # the worst name's ratio is judged against that name's own spread (fewer calls: a wider one)
    use_name = pl.col("_worst_ratio").is_not_null() & (pl.col("_worst_ratio") < pl.col("ratio"))
    return df.join(worst, on=["rank", *KEY], how="left").with_columns(
        pl.col("_worst").fill_null(pl.col("kernel")).alias("kernel"),
        pl.min_horizontal("ratio", "_worst_ratio").alias("ratio"),
        pl.when(use_name).then(pl.max_horizontal("_noise", "_worst_noise")).otherwise(pl.col("_noise"))
        .alias("_noise")).drop("_worst", "_worst_ratio", "_worst_noise")


def class_throughput(compute_op: pl.DataFrame) -> pl.DataFrame:
    """FLOP-weighted TFLOP/s per (kernel class, dtype) over the whole job: ``flops, time_ns, tflops``.

    Needs the columns of :func:`rank_throughput`. Used when two runs share no exact shape (a resized model).
    """
    g = rank_throughput(compute_op)
    if g.height == 0:
        return pl.DataFrame(schema={"kernel_class": pl.String, "dtype": pl.String, "flops": pl.Float64,
                                    "time_ns": pl.Int64, "tflops": pl.Float64})
    return g.group_by(["kernel_class", "dtype"]).agg(pl.col("flops").sum(), pl.col("time_ns").sum()).with_columns(
        (pl.col("flops") / pl.col("time_ns") / 1e3).alias("tflops")).sort(["kernel_class", "dtype"])


def throughput_findings(compute_op: pl.DataFrame, baseline_compute_op: pl.DataFrame | None = None,
                        config: ThroughputConfig | None = None,
                        alignment_config: AlignmentConfig | None = None) -> pl.DataFrame:
    """Cross-rank findings of this run, then baseline findings when a baseline is given (one frame)."""
    cfg = config or ThroughputConfig()
    tp, names = rank_throughput(compute_op, cfg), name_throughput(compute_op, cfg)
    parts = [cross_rank_findings(tp, cfg, names)]
    if baseline_compute_op is not None:
        base = rank_throughput(baseline_compute_op, cfg)
        parts.append(baseline_findings(tp, base, cfg, alignment_findings(compute_op, alignment_config),
                                       names, name_throughput(baseline_compute_op, cfg)))
    return pl.concat(parts, how="vertical_relaxed").sort("ratio")


def _misaligned_keys(alignment: pl.DataFrame | None) -> pl.DataFrame | None:
    if alignment is None or alignment.height == 0:
        return None
    return alignment.sort("severity").group_by(KEY, maintain_order=True).agg(
        pl.col("reason").str.join("; ").alias("_mis_reason"))


def _collapse(df: pl.DataFrame, comparison: str) -> pl.DataFrame:
    """One row per (key, reason) listing the ranks and their worst kernels, with the lowest ratio."""
    # Ranks of one key whose worst kernel names differ (near-equal ratios) stay one finding.
    out = df.group_by([*KEY, "reason"]).agg(
        pl.col("kernel").mode().sort().first(), pl.col("kernel").unique().sort().alias("kernels"),
        pl.col("layout").mode().sort().first(),
        pl.col("rank").unique().sort().alias("ranks"), pl.col("ratio").min(),
        pl.col("tflops").min(), pl.col("reference_tflops").median())
    return out.with_columns(pl.lit(comparison).alias("comparison")).select(_empty_findings().columns).sort("ratio")


def _empty_rank_tp() -> pl.DataFrame:
    return pl.DataFrame(schema={"rank": pl.Int32, "kernel_class": pl.String, "m": pl.Int64, "n": pl.Int64,
                                "k": pl.Int64, "batch": pl.Int64, "dtype": pl.String, "layout": pl.String,
                                "layout_set": pl.String, "kernel": pl.String, "kernel_set": pl.String,
                                "num_calls": pl.UInt32,
                                "flops": pl.Float64, "time_ns": pl.Int64, "rel_se": pl.Float64,
                                "tflops": pl.Float64})


def _empty_findings() -> pl.DataFrame:
    return pl.DataFrame(schema={"kernel_class": pl.String, "m": pl.Int64, "n": pl.Int64, "k": pl.Int64,
                                "batch": pl.Int64, "dtype": pl.String, "layout": pl.String, "kernel": pl.String,
                                "kernels": pl.List(pl.String), "reason": pl.String, "ranks": pl.List(pl.Int32), "ratio": pl.Float64,
                                "tflops": pl.Float64, "reference_tflops": pl.Float64, "comparison": pl.String})
