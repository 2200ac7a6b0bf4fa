"""How finely flow records order anything: each exporter's clock tick and how late its packet samples may be."""

from __future__ import annotations

import numpy as np
import polars as pl


def timestamp_resolution_ns(t_ns: np.ndarray) -> int:
    """One exporter's clock tick: the largest power of ten (ns .. s) that the timestamps' distances
    from the first are multiples of, give or take 2 % (a clock correction shifts all of them alike
    and its drift term stretches them a little; a float on the way may blur the last digits, so a
    coarse tick can hold where a finer one fails)."""
    t = np.asarray(t_ns, dtype=np.int64)[:20000]
    t = (t - t[0]) if len(t) else t
    t = t[t != 0].astype(float)
    res = 1
    for r in (10 ** k for k in range(1, 10)):
        if not len(t):
            break
        q = t / r
        # ticks coarser than the distances themselves say nothing (every distance rounds to 0)
        if np.mean(np.abs(q - np.round(q)) <= 0.02) >= 0.99 and np.mean(np.round(q) >= 1) >= 0.5:
            res = r
    return res


def sample_batching_ns(start_ns: np.ndarray, end_ns: np.ndarray) -> int:
    """How late a packet sample's time may be: 0 unless the records are packet samples (start = end)
    sent in batches that share one time (sFlow datagrams, timed on arrival); then the time since the
    previous batch (when the packet may have been sampled) that 95 % of the samples stay within.

    sFlow samples carry no time of their own. A real agent (pmacct's sfprobe on a gloo job, 1 in 16)
    sends a datagram when it is full or about once a second: half the samples came within 0.3-72 ms of
    the previous datagram, but 5 % more than 53 ms to 1.3 s after it, and those are the samples that
    open a link's traffic after an idle gap, whose order the stage order and the DP/PP lag read. A
    batch keeps the samples' order, but two packets 2 ms apart may arrive a second apart.
    """
    s, e = np.asarray(start_ns, dtype=np.int64), np.asarray(end_ns, dtype=np.int64)
    if len(s) < 2 or (s != e).any():
        return 0
    t, counts = np.unique(s, return_counts=True)
    if len(t) < 2 or len(t) * 2 > len(s):  # most samples timed alone: the time is the sample's own
        return 0
    since = np.repeat(np.diff(t), counts[1:])
    return int(np.quantile(since, 0.95))


MIN_CLOCK_RECORDS = 20
"""an exporter's sample batching is read from at least this many records: a handful of samples that
share a datagram tell little of how late the agent sends them."""


def flow_clock(flows: pl.DataFrame) -> tuple[int, int]:
    """(clock tick, sample batching) of the records (needs exporter, start_ns, end_ns): the finest tick
    among the exporters, and the coarsest spacing of any exporter whose packet samples are timed in
    batches (sample_batching_ns; exporters with at least MIN_CLOCK_RECORDS records, or all when none
    has them; 0 when none is batched).

    The finest tick: records cut where an exporter's timer fires may all fall on its round seconds, and a
    tick read from them alone is no clock. A batching agent's lag is no tick but how late its samples
    are: a link timed by a batched sFlow agent (samples up to a second late) orders nothing however fine
    the IPFIX exporter beside it, so its spacing holds for the whole capture.
    """
    if flows.is_empty():
        return 1, 0
    # only the columns read: each group is a copy, and of every column it would be the records again
    cols = [c for c in ("exporter", "start_ns", "end_ns") if c in flows.columns]
    flows = flows.select(cols)
    groups = [g for _, g in flows.group_by("exporter")] if "exporter" in cols else [flows]
    ticks = [timestamp_resolution_ns(np.r_[g["start_ns"].to_numpy(), g["end_ns"].to_numpy()]) for g in groups]
    read = [g for g in groups if g.height >= MIN_CLOCK_RECORDS] or groups
    batching = max(sample_batching_ns(g["start_ns"].to_numpy(), g["end_ns"].to_numpy()) for g in read)
    return min(ticks), batching


def flow_resolution_ns(flows: pl.DataFrame) -> int:
    """How finely the records' times order anything: the coarser of flow_clock's tick and batching."""
    return max(flow_clock(flows))
