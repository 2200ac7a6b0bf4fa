"""Per-partition features of a flow capture that merge into exactly what job recognition reads of the whole.

Why: a fabric's capture (hundreds of millions of records in many files) does not fit one process, yet
job recognition (fabric.recognise) reads raw records in only four places, and each reads a reduction
that merges across any split of the records:

- the pair table (fabric.pair_traffic): sums, minima, maxima and counts per (src, dst, exporter); and per
  connection (5-tuple and exporter) its bytes and first payload start, from which the "major connection"
  test is redone on the merged sums (a connection's share of its pair needs both totals);
- the capture's clock (fabric.clock): per exporter its first 20,000 start and end times in store order,
  and for packet samples (start = end) how many samples share each time;
- rendezvous clients (fabric.rails): the distinct (client, server) pairs on rendezvous ports;
- bursts (fabric.job_evidence): per directed pair, runs of payload records apart by idle gaps of at most
  BURST_HULL_GAP_NS, kept as (first start, last end) hulls. Job evidence's gap is never under that, and
  the records' intervals widened by a gap g >= it cover the same time as the hulls' widened by g, so the
  bursts counted on the hulls equal those counted on the records. Job evidence needs nothing of them but
  the number of bursts per directed pair at its gap (fabric.job_evidence.burst_gap_ns, known once the
  clock is merged), so the split runner does not merge them in the driver: each partition splits its
  hulls by pair into buckets (:func:`pair_buckets`), and a reduce task per bucket counts its pairs'
  bursts across all partitions (:func:`bucket_burst_counts`); the driver holds one row per pair.

Byte sums are of integer values (sizes times sampling rates) held in float64, so they do not depend on
the order of the additions below 2**53 bytes. The rails' activity series need time bins that are known
only once the pairs are merged: a second pass over the partitions (:func:`rail_series`).

Pure: frames in, frames out; the runner (capture_split) reads the partitions and runs the passes.
"""

from __future__ import annotations

from dataclasses import field

import numpy as np
import polars as pl

from rankscope.analysis.fabric.clock import MIN_CLOCK_RECORDS, timestamp_resolution_ns
from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.job_evidence import burst_counts
from rankscope.analysis.fabric.pair_traffic import (
    MAJOR_CONNECTION_SHARE,
    PAIR_COLUMNS,
    burst_index,
    busiest_exporter,
    pair_traffic,
)
from rankscope.collectors.record_class import record

BURST_HULL_GAP_NS = 1_000_000
"""bursts are kept as hulls of records apart by at most this gap: job evidence's burst gap is
max(20 ticks, 1 ms), never finer, so the hulls count the same bursts as the records."""

CLOCK_HEAD = 20_000
"""fabric.clock.timestamp_resolution_ns reads an exporter's first 20,000 times: a partition keeps no more."""

CONN = ["src_addr", "dst_addr", "src_port", "dst_port", "protocol", "exporter"]
PAIR_EXP = ["src_addr", "dst_addr", "exporter"]
COUNTS = ("records", "control_records", "control_bytes", "self_loop_records", "sampled_records")


@record(frozen=False)
class ExporterClock:
    """One exporter's times in store order, as far as fabric.clock reads them."""

    num_records: int
    starts: np.ndarray
    """the first CLOCK_HEAD start_ns."""
    ends: np.ndarray
    """the first CLOCK_HEAD end_ns."""
    samples_only: bool
    """every record is a packet sample (start = end): only then do its batches count."""
    times: np.ndarray | None = None
    """distinct start times of a samples-only exporter, sorted; None otherwise."""
    counts: np.ndarray | None = None
    """records at each of ``times``."""


@record(frozen=False)
class FlowPartial:
    """What one partition (or several, merged) of a capture contributes to job recognition."""

    conns: pl.DataFrame
    """CONN keys, bytes (sampling-scaled), data_start (first payload record's start)."""
    pair_exp: pl.DataFrame
    """PAIR_EXP keys, bytes, num_records, first_ns, last_ns, data_bytes, last_data_ns, data_samples."""
    bursts: pl.DataFrame
    """src_addr, dst_addr, start_ns, end_ns: payload hulls (see module doc); empty in the partials the
    split runner merges, whose hulls went to :func:`pair_buckets` instead."""
    rendezvous: pl.DataFrame
    """src_addr, dst_addr: distinct clients and servers on rendezvous ports."""
    counts: dict = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    control_ports_seen: set = field(default_factory=set)
    exporters: set = field(default_factory=set)
    """every exporter value of the records, None included (pair_traffic counts n_unique)."""
    clocks: dict = field(default_factory=dict)
    """exporter -> ExporterClock, of the kept (training) records, in store order of first appearance."""


def _hulls(payload: pl.DataFrame) -> pl.DataFrame:
    """Runs of records per directed pair apart by at most BURST_HULL_GAP_NS, each as (first start, last end)."""
    f = payload.select("src_addr", "dst_addr", "start_ns", "end_ns").sort(["src_addr", "dst_addr", "start_ns"])
    f = f.with_columns(_b=burst_index(BURST_HULL_GAP_NS))
    return (f.group_by(["src_addr", "dst_addr", "_b"])
            .agg(start_ns=pl.col("start_ns").min(), end_ns=pl.col("end_ns").max()).drop("_b"))


def _clocks(keep: pl.DataFrame) -> dict:
    out = {}
    for (exp,), g in keep.group_by("exporter", maintain_order=True):
        s, e = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
        same = bool((s == e).all())
        t, c = np.unique(s, return_counts=True) if same else (None, None)
        out[exp] = ExporterClock(g.height, s[:CLOCK_HEAD].copy(), e[:CLOCK_HEAD].copy(), same, t, c)
    return out


def flow_partial(flow: pl.DataFrame, config: FlowConfig | None = None) -> FlowPartial:
    """The partial features of one partition of a capture's flow records (columns as pair_traffic needs).

    The records are classified by fabric.pair_traffic itself (control, loops, payload), so a partition
    sets apart exactly what the whole capture would."""
    cfg = config or FlowConfig()
    if flow.is_empty():
        return empty_partial()
    pt = pair_traffic(flow, cfg)
    keep, q = pt.training_flows, pt.quality
    sampled = pl.col("sampling_rate").fill_null(1) > 1
    conns = keep.group_by(CONN).agg(bytes=pl.col("est_bytes").sum(),
                                    data_start=pl.col("start_ns").filter(pl.col("is_data")).min())
    pair_exp = keep.group_by(PAIR_EXP).agg(
        bytes=pl.col("est_bytes").sum(), num_records=pl.len().cast(pl.Int64),
        first_ns=pl.col("start_ns").min(), last_ns=pl.col("end_ns").max(),
        data_bytes=pl.col("est_bytes").filter(pl.col("is_data")).sum(),
        last_data_ns=pl.col("end_ns").filter(pl.col("is_data")).max(),
        data_samples=pl.col("num_packets").fill_null(1).filter(pl.col("is_data") & sampled).sum().cast(pl.Int64))
    ctl = pt.control_flows
    rdv = ctl.filter(pl.col("dst_port").is_in(list(cfg.rendezvous_ports))).select("src_addr", "dst_addr").unique() \
        if ctl.height else _empty_rendezvous()
    return FlowPartial(
        conns=conns, pair_exp=pair_exp, bursts=_hulls(keep.filter(pl.col("is_data"))), rendezvous=rdv,
        counts={k: q[k] for k in COUNTS}, control_ports_seen=set(q["control_ports_seen"]),
        exporters=set(flow["exporter"].unique().to_list()), clocks=_clocks(keep))


def _empty_rendezvous() -> pl.DataFrame:
    return pl.DataFrame(schema={"src_addr": pl.Utf8, "dst_addr": pl.Utf8})


def empty_partial() -> FlowPartial:
    """The partial of no records."""
    s = pl.Utf8
    return FlowPartial(
        conns=pl.DataFrame(schema={"src_addr": s, "dst_addr": s, "src_port": pl.Int32, "dst_port": pl.Int32,
                                   "protocol": pl.Int32, "exporter": s, "bytes": pl.Float64, "data_start": pl.Int64}),
        pair_exp=pl.DataFrame(schema={"src_addr": s, "dst_addr": s, "exporter": s, "bytes": pl.Float64,
                                      "num_records": pl.Int64, "first_ns": pl.Int64, "last_ns": pl.Int64,
                                      "data_bytes": pl.Float64, "last_data_ns": pl.Int64, "data_samples": pl.Int64}),
        bursts=pl.DataFrame(schema={"src_addr": s, "dst_addr": s, "start_ns": pl.Int64, "end_ns": pl.Int64}),
        rendezvous=_empty_rendezvous())


def _merge_clock(a: ExporterClock, b: ExporterClock) -> ExporterClock:
    same = a.samples_only and b.samples_only
    t = c = None
    if same:
        t, inv = np.unique(np.r_[a.times, b.times], return_inverse=True)
        c = np.bincount(inv, weights=np.r_[a.counts, b.counts], minlength=len(t)).astype(np.int64)
    return ExporterClock(a.num_records + b.num_records, np.r_[a.starts, b.starts][:CLOCK_HEAD],
                         np.r_[a.ends, b.ends][:CLOCK_HEAD], same, t, c)


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    return pl.concat([f for f in frames if f.height] or frames[:1], how="vertical_relaxed")


def merge_partials(parts: list[FlowPartial]) -> FlowPartial:
    """One partial of the partitions ``parts``, given in store order (the clock keeps the first times)."""
    if not parts:
        return empty_partial()
    conns = _concat([p.conns for p in parts]).group_by(CONN).agg(pl.col("bytes").sum(), pl.col("data_start").min())
    pair_exp = _concat([p.pair_exp for p in parts]).group_by(PAIR_EXP).agg(
        pl.col("bytes").sum(), pl.col("num_records").sum(), pl.col("first_ns").min(), pl.col("last_ns").max(),
        pl.col("data_bytes").sum(), pl.col("last_data_ns").max(), pl.col("data_samples").sum())
    bursts = _concat([p.bursts for p in parts])
    clocks: dict = {}
    for p in parts:
        for exp, ck in p.clocks.items():
            clocks[exp] = _merge_clock(clocks[exp], ck) if exp in clocks else ck
    return FlowPartial(
        conns=conns, pair_exp=pair_exp, bursts=_hulls(bursts) if bursts.height else bursts,
        rendezvous=_concat([p.rendezvous for p in parts]).unique(),
        counts={k: sum(p.counts[k] for p in parts) for k in COUNTS},
        control_ports_seen=set().union(*(p.control_ports_seen for p in parts)),
        exporters=set().union(*(p.exporters for p in parts)), clocks=clocks)


def pair_buckets(bursts: pl.DataFrame, num_buckets: int) -> list[pl.DataFrame]:
    """``bursts`` (a partition's hulls) split by directed pair into ``num_buckets`` frames: a pair goes to
    the same bucket from every partition and every process (polars' hash with a fixed seed, stable within
    one polars version, which a Ray cluster's processes share)."""
    if num_buckets <= 1:
        return [bursts]
    key = pl.concat_str(["src_addr", "dst_addr"], separator=" ").hash(seed=0) % num_buckets
    by = bursts.with_columns(_k=key).partition_by("_k", as_dict=True, include_key=False)
    empty = bursts.head(0)
    return [by.get((k,), empty) for k in range(num_buckets)]


def bucket_burst_counts(gap_ns: int, *buckets: pl.DataFrame) -> pl.DataFrame:
    """One bucket's burst counts per directed pair (fabric.job_evidence.burst_counts at ``gap_ns``), from
    that bucket's share of every partition's hulls: a pair's hulls from several partitions (one burst may
    straddle them) are merged by time under the same gap rule, so the counts are those of the whole
    capture's payload records. Returns src_addr, dst_addr, bursts."""
    return burst_counts(_concat(list(buckets)), gap_ns) if buckets else burst_counts(empty_partial().bursts, gap_ns)


def pair_table(p: FlowPartial) -> pl.DataFrame:
    """fabric.pair_traffic's pair table, from the merged partial of the whole capture."""
    pair = ["src_addr", "dst_addr"]
    conn = CONN[:-1]
    c = p.conns.with_columns(_major=pl.col("bytes").sum().over(conn).fill_null(0.0)
                             >= MAJOR_CONNECTION_SHARE * pl.col("bytes").sum().over(pair))
    first = c.group_by(PAIR_EXP).agg(first_data_ns=pl.coalesce(pl.col("data_start").filter(pl.col("_major")).min(),
                                                               pl.col("data_start").min()))
    per_exp = p.pair_exp.join(first, on=PAIR_EXP, how="left", nulls_equal=True)
    pairs = busiest_exporter(per_exp).rename({"src_addr": "src", "dst_addr": "dst"}).sort(["src", "dst"])
    return pairs.select(*PAIR_COLUMNS)


def pair_quality(p: FlowPartial) -> dict:
    """fabric.pair_traffic's quality counts, from the merged partial of the whole capture."""
    if not p.counts["records"]:
        return {"records": 0}
    q = {k: int(p.counts[k]) for k in COUNTS}
    q["control_bytes"] = float(p.counts["control_bytes"])
    q["control_ports_seen"] = sorted(p.control_ports_seen)
    q["exporters"] = len(p.exporters)
    order = ["records", "control_records", "control_bytes", "control_ports_seen", "self_loop_records",
             "sampled_records", "exporters"]
    return {k: q[k] for k in order}


def _batching_ns(ck: ExporterClock) -> int:
    """fabric.clock.sample_batching_ns from an exporter's merged clock."""
    if ck.num_records < 2 or not ck.samples_only:
        return 0
    t, counts = ck.times, ck.counts
    if len(t) < 2 or len(t) * 2 > ck.num_records:
        return 0
    return int(np.quantile(np.repeat(np.diff(t), counts[1:]), 0.95))


def capture_resolution(p: FlowPartial) -> int:
    """fabric.clock.flow_resolution_ns of the capture's kept records, from its merged partial."""
    if not p.clocks:
        return 1
    clocks = list(p.clocks.values())
    ticks = [timestamp_resolution_ns(np.r_[ck.starts, ck.ends]) for ck in clocks]
    read = [ck for ck in clocks if ck.num_records >= MIN_CLOCK_RECORDS] or clocks
    return max(min(ticks), max(_batching_ns(ck) for ck in read))
