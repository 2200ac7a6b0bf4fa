"""Put every rank (or exporter) on one clock.

Ranks: a collective ends together on all its members (the last arrival
releases everyone), so the spread of one call's end times across members is
clock error plus a little noise. Each clock domain (the host when the records
name one, else the rank) gets ``offset + drift * t``, fitted by alternating
least squares over all calls: estimate each call's true end as the mean of
its members' corrected ends (least squares), refit each domain's line to its residuals,
repeat. The mean correction of each set of linked clocks is pinned to zero, so
the aligned clock stays near the recorded ones.

Exporters: the same flow (5-tuple) seen by two switches started at the same
moment, so the median difference of matched start times is the offset of one
exporter against the reference (the one that saw the most records).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.collectors.errors import ConfigError
from rankscope.collectors.record_class import record
from rankscope.collectors.schema import P2P_OPS


@record
class ClockConfig:
    iterations: int = 8
    """alternating least-squares rounds (each is a few vectorised passes)."""
    min_calls: int = 3
    """a domain with fewer shared calls keeps a zero correction."""
    fit_drift: bool = True
    """fit a linear drift as well as an offset."""

    def __post_init__(self):
        if self.iterations < 1:
            raise ConfigError(f"ClockConfig.iterations must be >= 1, got {self.iterations}")
        if self.min_calls < 1:
            raise ConfigError(f"ClockConfig.min_calls must be >= 1, got {self.min_calls}")


def _empty_offsets() -> pl.DataFrame:
    return pl.DataFrame(schema={"rank": pl.Int64, "domain": pl.Utf8, "offset_ns": pl.Float64,
                                "drift": pl.Float64, "ref_ns": pl.Int64, "num_calls": pl.Int64})


def _domain_components(dom_idx: np.ndarray, call_idx: np.ndarray, nd: int, ncall: int) -> np.ndarray:
    """Which clock domains are linked through shared calls (bipartite graph, scipy csgraph)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    m = coo_matrix((np.ones(len(dom_idx)), (dom_idx, nd + call_idx)), shape=(nd + ncall, nd + ncall))
    return connected_components(m, directed=False)[1][:nd]


def rank_clock_offsets(comm_op: pl.DataFrame, config: ClockConfig | None = None) -> pl.DataFrame:
    """Per-rank clock correction from completed collectives.

    Needs comm_op columns rank, op, group_ranks, seq (or step), end_ns, state; host if present.
    Returns rank, domain, offset_ns, drift, ref_ns, num_calls: the corrected
    time of a record at local time t is ``t - (offset_ns + drift * (t - ref_ns))``.
    """
    cfg = config or ClockConfig()
    if comm_op.is_empty():
        return _empty_offsets()
    has_host = "host" in comm_op.columns and comm_op["host"].null_count() < comm_op.height
    # only the columns read: a filter gathers every column it carries (the member lists the most)
    cols = [c for c in ("rank", "op", "group_ranks", "seq", "end_ns", "host") if c in comm_op.columns]
    df = comm_op.select(cols).filter(~pl.col("op").is_in(P2P_OPS) & pl.col("end_ns").is_not_null()
                                     & pl.col("group_ranks").is_not_null())
    dom = pl.col("host").fill_null(pl.col("rank").cast(pl.Utf8)) if has_host else pl.col("rank").cast(pl.Utf8)
    ranks = comm_op.select(pl.col("rank").cast(pl.Int64), domain=dom).unique("rank").sort("rank")
    if df.is_empty():
        return ranks.with_columns(offset_ns=pl.lit(0.0), drift=pl.lit(0.0), ref_ns=pl.lit(0, pl.Int64),
                                  num_calls=pl.lit(0, pl.Int64))
    seqcol = "seq" if df["seq"].null_count() < df.height else None
    # the sorted member list itself, not its spelling: one call per (members, op, seq) either way
    key = [pl.col("group_ranks").cast(pl.List(pl.Int64)).list.sort(), pl.col("op")]
    if seqcol:
        key.append(pl.col("seq"))
    else:
        # without a sequence number the n-th call of an op in a group is the same call on every member
        key.append(pl.col("end_ns").rank("ordinal").over(["rank", "group_ranks", "op"]))
    df = df.with_columns(domain=dom, call=pl.struct(key).hash(), t=pl.col("end_ns"))
    df = df.filter(pl.len().over("call") >= 2)
    if df.is_empty():
        return ranks.with_columns(offset_ns=pl.lit(0.0), drift=pl.lit(0.0), ref_ns=pl.lit(0, pl.Int64),
                                  num_calls=pl.lit(0, pl.Int64))
    doms, dom_idx = np.unique(df["domain"].to_numpy(), return_inverse=True)
    _, call_idx = np.unique(df["call"].to_numpy(), return_inverse=True)
    t_raw = df["t"].to_numpy().astype(np.int64)
    ref = int(np.median(t_raw))
    x = (t_raw - ref).astype(np.float64)
    nd = len(doms)
    off = np.zeros(nd)
    drift = np.zeros(nd)
    counts = np.bincount(dom_idx, minlength=nd)
    ncall = int(call_idx.max()) + 1
    per_call = np.bincount(call_idx, minlength=ncall)
    comp = _domain_components(dom_idx, call_idx, nd, ncall)
    for _ in range(cfg.iterations):
        corr = x - (off[dom_idx] + drift[dom_idx] * x)
        truth = np.bincount(call_idx, corr, ncall) / per_call  # least squares: the mean corrected end
        resid = x - truth[call_idx]  # = offset + drift * x for a clean clock
        if cfg.fit_drift:
            sx = np.bincount(dom_idx, x, nd)
            sy = np.bincount(dom_idx, resid, nd)
            sxx = np.bincount(dom_idx, x * x, nd)
            sxy = np.bincount(dom_idx, x * resid, nd)
            n = np.maximum(counts, 1)
            var = sxx - sx * sx / n
            ok = var > 1e-9 * np.maximum(sxx, 1.0)
            b = np.where(ok, (sxy - sx * sy / n) / np.where(ok, var, 1), 0.0)
            a = (sy - b * sx) / n
        else:
            a = np.bincount(dom_idx, resid, nd) / np.maximum(counts, 1)
            b = np.zeros(nd)
        weak = counts < cfg.min_calls
        a[weak] = 0.0
        b[weak] = 0.0
        # only differences between linked clocks are observable: pin each linked set's mean to zero
        for arr in (a, b):
            m = np.bincount(comp, arr * ~weak, comp.max() + 1) / np.maximum(
                np.bincount(comp, ~weak, comp.max() + 1), 1)
            arr -= np.where(weak, 0.0, m[comp])
        off, drift = a, b
    fit = pl.DataFrame({"domain": doms.astype(str), "offset_ns": off, "drift": drift,
                        "num_calls": counts.astype(np.int64)})
    return (ranks.join(fit, on="domain", how="left")
            .with_columns(pl.col("offset_ns").fill_null(0.0), pl.col("drift").fill_null(0.0),
                          pl.col("num_calls").fill_null(0), ref_ns=pl.lit(ref, pl.Int64))
            .select("rank", "domain", "offset_ns", "drift", "ref_ns", "num_calls"))


def apply_rank_offsets(df: pl.DataFrame, offsets: pl.DataFrame,
                       time_cols: tuple[str, ...] = ("start_ns", "end_ns")) -> pl.DataFrame:
    """Shift the time columns of any per-rank frame onto the aligned clock (rank column required)."""
    if df.is_empty() or offsets.is_empty():
        return df
    cols = [c for c in time_cols if c in df.columns]
    # join only the rank and time columns: a join gathers every column it carries, and comm_op's
    # member lists are most of a big job's memory
    j = df.select("rank", *cols).join(
        offsets.select(pl.col("rank").cast(df.schema["rank"]), "offset_ns", "drift", "ref_ns"),
        on="rank", how="left", maintain_order="left")
    fixes = []
    for c in cols:
        corr = pl.col("offset_ns").fill_null(0.0) + pl.col("drift").fill_null(0.0) * (
            pl.col(c) - pl.col("ref_ns").fill_null(0))
        fixes.append((pl.col(c) - corr).round(0).cast(pl.Int64).alias(c))
    return df.with_columns(j.select(fixes))


def exporter_clock_offsets(flow: pl.DataFrame) -> pl.DataFrame:
    """Per-exporter offset from flows seen by several exporters.

    Needs flow columns exporter, src_addr, dst_addr, src_port, dst_port, protocol, start_ns.
    Returns exporter, offset_ns (subtract it), num_matched. The reference
    exporter (most records) and exporters with nothing in common get 0.
    """
    if flow.is_empty():
        return pl.DataFrame(schema={"exporter": pl.Utf8, "offset_ns": pl.Float64, "num_matched": pl.Int64})
    exps = flow.group_by("exporter").len().sort(["len", "exporter"], descending=[True, False])
    ref = exps["exporter"][0]
    key = ["src_addr", "dst_addr", "src_port", "dst_port", "protocol"]
    # the n-th record of a 5-tuple on one exporter matches the n-th on another
    # lazy: eagerly, the ranks, the join and the medians each held a copy of the records (~0.25 GiB at
    # 1.6M records)
    f = flow.lazy().select(*key, "exporter", "start_ns").with_columns(
        nth=pl.col("start_ns").rank("ordinal").over([*key, "exporter"]))
    base = f.filter(pl.col("exporter") == ref).drop("exporter").rename({"start_ns": "ref_start"})
    m = (f.filter(pl.col("exporter") != ref).join(base, on=[*key, "nth"], how="inner")
         .group_by("exporter").agg(offset_ns=(pl.col("start_ns") - pl.col("ref_start")).median().cast(pl.Float64),
                                   num_matched=pl.len().cast(pl.Int64))).collect()
    return (exps.select("exporter").join(m, on="exporter", how="left")
            .with_columns(pl.col("offset_ns").fill_null(0.0), pl.col("num_matched").fill_null(0)))


def exporter_clocks(offsets: pl.DataFrame) -> dict[str, str]:
    """Exporter -> the clock its times are on after :func:`apply_exporter_offsets`: the reference's (the
    first row) for it and every exporter matched to it, its own for an exporter that shares no flow
    with the reference (its offset is unknown, so its times compare only with its own)."""
    if offsets.is_empty():
        return {}
    ref = str(offsets["exporter"][0])
    return {str(e): (ref if e == ref or n > 0 else str(e))
            for e, n in zip(offsets["exporter"].to_list(), offsets["num_matched"].to_list())}


def apply_exporter_offsets(flow: pl.DataFrame, offsets: pl.DataFrame) -> pl.DataFrame:
    """Shift flow start/end onto the reference exporter's clock."""
    if flow.is_empty() or offsets.is_empty():
        return flow
    # looked up, not joined: a join copies every column, while this shares all but the two times with
    # ``flow`` (the job model holds both; a 1.6M-record job's copy cost ~0.2 GiB). A frame whose columns
    # are cut into chunks of different lengths is made contiguous here all the same (one copy, as before)
    o = pl.col("exporter").replace_strict(offsets["exporter"], offsets["offset_ns"].cast(pl.Float64),
                                          default=None, return_dtype=pl.Float64).fill_null(0.0)
    return flow.with_columns((pl.col("start_ns") - o).round(0).cast(pl.Int64),
                             (pl.col("end_ns") - o).round(0).cast(pl.Int64))
