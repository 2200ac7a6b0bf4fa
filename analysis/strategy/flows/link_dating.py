"""Which pipeline links' record times date their traffic, and which date their TCP connections.

The stage order read from link times (strategy.flows.stage_order.order_pipelines) takes a link's first record to
start with the first activations and its last record to end with the last gradients. Over TCP a
connection's first record opens with its set-up and its last closes with its teardown, and either may be
far from any data: gloo connects every pair of ranks when the process group starts, and connections
close when the processes exit, in whatever order they exit. Other transports (RoCE over UDP) carry
nothing but data on the flow, so their times are always the traffic's.

A TCP link's times date its traffic when the exporter cut its records at idle gaps, which shows as at
least MIN_STEP_BURSTS bursts of payload records: its records then start and end with the transfers.
Otherwise neither its first nor its last time votes (strategy.flows.stage_order), and its last time is no check
on a cycle's wrap either (fabric.tie_evidence: the record ends round a cycle).

A TCP link that kept its records open still dates its *last* data where the exporter's TCP flags show its
teardown apart (:func:`ends_dated`): when every connection's last payload record carries no FIN or RST and
a FIN or RST record of the same connection starts after it, the exporter closed that payload record before
the teardown (its idle timeout: the processes outlived their last transfer, as a job that saves a
checkpoint at the end does), so the record ends with the last payload packet. Packet samples miss most
FINs, so only unsampled records count; without flags nothing changes.

The first times get no such rule, though a SYN in a record of its own dates the set-up apart just as
well: a real gloo PP4 job that waited 3 s between connecting and its first step (nfpcapd, 1 s idle
timeout) had its stage 2-3 link's payload records open 75 ms before its stage 0-1 link's. gloo's receiver
tells the sender when a receive is posted, so a link's first packets date when its downstream stage
started to wait, not when the first activations came.

Measured: a real pure 4-stage gloo pipeline (tests/data/netns_gloo/pp4_whole_job_records), one record
each way per link for the whole job, whose links' ends lay 1-2 ms apart in the order the processes
exited, had been ordered backwards at "voted clearly". Keeping the first times of such links where no
connection was seen opened ahead of use (NCCL connects point-to-point peers on first send) claimed 6
wrong stage orders at confidence >= 0.9 on dev corpus seeds 1-4 (880 jobs): first records of whole-job
TCP links do not date the first activations in our simulator either (its process groups connect
seconds before the first data, as gloo's do).
"""

from __future__ import annotations

from collections import defaultdict

import polars as pl

from rankscope.analysis.fabric.job_evidence import burst_counts
from rankscope.analysis.fabric.pair_traffic import MIN_BURST_GAP_NS, connection_columns, on_pairs

MIN_STEP_BURSTS = 3
"""a link or DP group whose payload shows fewer bursts than this kept its records open across steps."""


def connection_dated(flows: pl.DataFrame, links: list[tuple[str, str]], resolution_ns: int) -> set[frozenset]:
    """The TCP links (frozensets of their two addresses) whose payload records were not cut at idle gaps
    (fewer than MIN_STEP_BURSTS bursts either way): their first and last times date the connection, not
    the traffic. Links seen only through packet samples are never among them. Needs the job's flows
    src_addr, dst_addr, start_ns, end_ns (protocol, is_data and size_bytes where known: a link is TCP
    when most of its payload bytes, else records, are)."""
    if flows.is_empty() or not links or "protocol" not in flows.columns or not (flows["protocol"] == 6).any():
        return set()
    data = on_pairs(flows.filter(pl.col("is_data")) if "is_data" in flows.columns else flows, links)
    # a TCP link carries most of its payload over TCP: a RoCE link whose pair also holds a control
    # connection (the rendezvous store on one of its ends) is no TCP link
    w = pl.col("size_bytes").cast(pl.Float64) if "size_bytes" in data.columns else pl.lit(1.0)
    by = data.with_columns(_w=w).group_by(pl.min_horizontal("src_addr", "dst_addr").alias("a"),
                                          pl.max_horizontal("src_addr", "dst_addr").alias("b")).agg(
        tcp=pl.col("_w").filter(pl.col("protocol") == 6).sum(), all=pl.col("_w").sum(),
        # packet samples (sFlow: start = end) date their packets, never a connection's life
        samples=(pl.col("start_ns") == pl.col("end_ns")).all())
    tcp = {frozenset((a, b)) for a, b in
           by.filter((pl.col("tcp") * 2 > pl.col("all")) & ~pl.col("samples")).select("a", "b").iter_rows()}
    if not tcp:
        return set()
    most: dict[frozenset, int] = defaultdict(int)
    for a, b, n in burst_counts(data, max(MIN_BURST_GAP_NS, 20 * int(resolution_ns))).iter_rows():
        most[frozenset((a, b))] = max(most[frozenset((a, b))], int(n))
    return {x for x in tcp if most[x] < MIN_STEP_BURSTS}


TEARDOWN_FLAGS = 0x01 | 0x04
"""FIN, RST: a record carrying either holds the connection's close."""
SETUP_FLAGS = 0x02
"""SYN: a record carrying it holds the connection's set-up."""


def ends_dated(flows: pl.DataFrame, undated: set[frozenset]) -> set[frozenset]:
    """The links of ``undated`` whose last payload records end with their last data, not their teardown:
    every payload-carrying TCP connection of the link has flags on its unsampled records, no FIN or RST
    in its last payload record, and a FIN or RST record (either way) that starts after that record ends.
    Needs flows src_addr, dst_addr, src_port, dst_port, protocol, start_ns, end_ns, is_data, tcp_flags
    (sampling_rate where known)."""
    need = {"tcp_flags", "src_port", "dst_port", "is_data"}
    if not undated or not need <= set(flows.columns):
        return set()
    f = on_pairs(flows.filter(pl.col("protocol") == 6), [tuple(x) for x in undated])
    if f.is_empty():
        return set()
    rate = pl.col("sampling_rate").fill_null(1) if "sampling_rate" in flows.columns else pl.lit(1)
    conn = ["a", "b", "a_port", "b_port"]
    # no flags, or flags of sampled packets only: a record without FIN may still have held one
    f = f.with_columns(*connection_columns(), _down=(pl.col("tcp_flags") & TEARDOWN_FLAGS) > 0,
                       _blind=pl.col("tcp_flags").is_null() | (rate > 1))
    # each direction's last payload record
    last = f.filter(pl.col("is_data")).sort("end_ns").group_by(*conn, "src_addr").agg(
        pl.col("end_ns").last().alias("_end"), pl.col("_down").last().alias("_closed"), pl.col("_blind").any())
    downs = f.filter(pl.col("_down")).group_by(conn).agg(pl.col("start_ns").max().alias("_fin"))
    seen = last.join(downs, on=conn, how="left").with_columns(
        _ok=~pl.col("_blind") & ~pl.col("_closed") & (pl.col("_fin") > pl.col("_end")).fill_null(False))
    by = seen.group_by("a", "b").agg(pl.col("_ok").all())
    return {frozenset((a, b)) for a, b, ok in by.iter_rows() if ok} & undated
