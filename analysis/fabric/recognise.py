"""Job recognition: split the endpoints of a shared fabric into training jobs.

Training jobs exchange heavy, repeated traffic among a fixed set of
endpoints; jobs do not exchange heavy traffic with each other. So after
setting apart control/storage ports and keeping only the heavy pairs (see
:func:`rankscope.analysis.fabric.pair_traffic.heavy_edges`), each connected
component of the pair graph with at least ``min_job_endpoints`` members is one
job. Endpoints left alone (storage servers, hosts that only saw light traffic)
are non-training and are only counted. Names follow the contract: the capture
name when there is one job, else ``<capture>-1``, ``-2``, ... ordered by each
job's lowest endpoint address (numeric for IPv4).
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.pair_traffic import heavy_edges, pair_traffic, undirected_edges


@dataclass
class RecognisedJob:
    name: str
    endpoints: list[str]
    """sorted by address."""
    num_edges: int
    bytes: float


@dataclass
class FabricJobs:
    jobs: list[RecognisedJob]
    quality: dict = field(default_factory=dict)
    """records / bytes set apart as control, storage or noise, and endpoints that are in no job."""

    def job_of(self) -> dict[str, str]:
        return {a: j.name for j in self.jobs for a in j.endpoints}


@functools.lru_cache(maxsize=1 << 16)
def address_key(addr: str):
    """Sort key that orders IPv4/IPv6 numerically and anything else after, by text.

    Cached: sorting member lists asks again for the same few thousand endpoints (110k parses at 4,096 GPUs).
    """
    try:
        ip = ipaddress.ip_address(addr)
        return (ip.version, int(ip), "")
    except ValueError:
        return (9, 0, addr)


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
    groups = [g for _, g in flows.group_by("exporter")] if "exporter" in flows.columns else [flows]
    ticks = [timestamp_resolution_ns(np.r_[g["start_ns"].to_numpy(), g["end_ns"].to_numpy()]) for g in groups]
    read = [g for g in groups if g.height >= MIN_CLOCK_RECORDS] or groups
    batching = max(sample_batching_ns(g["start_ns"].to_numpy(), g["end_ns"].to_numpy()) for g in read)
    return min(ticks), batching


def flow_resolution_ns(flows: pl.DataFrame) -> int:
    """How finely the records' times order anything: the coarser of flow_clock's tick and batching."""
    return max(flow_clock(flows))


def components(nodes: list[str], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Component label of each node for undirected edges given as node indices (scipy csgraph)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(nodes)
    m = coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n))
    return connected_components(m, directed=False)[1]


def activity_series(start: np.ndarray, end: np.ndarray, bytes_: np.ndarray, t0: int, bin_ns: int,
              nbins: int) -> np.ndarray:
    """Bytes per time bin, each record's bytes spread evenly over the bins it spans."""
    sb = np.clip((start - t0) // bin_ns, 0, nbins - 1)
    eb = np.clip((end - t0) // bin_ns, 0, nbins - 1)
    eb = np.maximum(eb, sb)
    rate = bytes_ / (eb - sb + 1)
    d = np.zeros(nbins + 1)
    np.add.at(d, sb, rate)
    np.add.at(d, eb + 1, -rate)
    return np.cumsum(d[:-1])


def rail_correlations(flows: pl.DataFrame, comps: list[int], config: FlowConfig,
                      resolution_ns: int) -> tuple[dict[tuple[int, int], tuple[float, int]], int]:
    """Peak normalised cross-correlation (and its lag in bins) of the binned activity of each pair of
    components, over lags up to ``max_exporter_skew_ns``; returns it with the bin width. Activity is
    seen three ways, bytes spread over each record, the instants records open and close, and the
    instants they open; the best-correlated view counts.

    Needs flows c (component), start_ns, end_ns, est_bytes. The bin is the coarser of
    ``sync_tolerance_ns`` and four timestamp ticks, so millisecond exporters still line up; the lag
    search absorbs each exporter's clock offset.
    """
    out: dict[tuple[int, int], tuple[float, int]] = {}
    if len(comps) < 2 or flows.is_empty():
        return out, 0
    t0, t1 = int(flows["start_ns"].min()), int(flows["end_ns"].max())
    bin_ns = max(int(config.sync_tolerance_ns), 4 * int(resolution_ns), 1)
    while (t1 - t0) // bin_ns > (1 << 18):
        bin_ns *= 2
    nbins = int((t1 - t0) // bin_ns) + 1
    max_lag = int(np.ceil(config.max_exporter_skew_ns / bin_ns))
    size = 1 << int(np.ceil(np.log2(2 * nbins + 1)))
    spec: dict[int, list[np.ndarray]] = {}
    for (c,), g in flows.filter(pl.col("c").is_in(comps)).group_by("c"):
        st, en = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
        # two views of the same timing: bytes spread over each record (bursts), and the instants
        # records open and close (all that is left when records last as long as the capture)
        spread = activity_series(st, en, g["est_bytes"].to_numpy().astype(float), t0, bin_ns, nbins)
        events = np.bincount(np.clip(np.r_[st - t0, en - t0] // bin_ns, 0, nbins - 1), minlength=nbins)
        # the opens alone: a record opens at its first packet, when the rails' lockstep collectives start
        # together, while its close may wait for the exporter's timers or the last rank to finish (rails
        # of one job whose records last the whole job opened in the same tick and closed 16 ms apart)
        opens = np.bincount(np.clip((st - t0) // bin_ns, 0, nbins - 1), minlength=nbins)
        # an instant near a bin edge lands in either bin: give each a neighbour on both sides
        events = np.convolve(events, np.ones(3), mode="same")
        opens = np.convolve(opens, np.ones(3), mode="same")
        views = []
        for x in (spread, events.astype(float), opens.astype(float)):
            x = x - x.mean()
            norm = float(np.sqrt((x * x).sum()))
            views.append(np.fft.rfft(x / norm, size) if norm > 0 else None)
        spec[int(c)] = views
    keys = sorted(spec)
    # lags -max_lag..max_lag in order: a peak at either end is still rising towards a lag past the
    # exporters' largest skew, so it is no alignment (two jobs whose slowly varying activity correlates
    # at every lag); a real clock offset within the bound peaks inside the window
    lags = np.r_[np.arange(size - max_lag, size), np.arange(0, max_lag + 1)]
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            best = (-1.0, 0)
            for va, vb in zip(spec[a], spec[b]):
                if va is None or vb is None:
                    continue
                cc = np.fft.irfft(va * np.conj(vb), size)[lags]
                k = int(np.argmax(cc))
                if 0 < max_lag and k in (0, len(lags) - 1):
                    continue
                if cc[k] > best[0]:
                    best = (float(cc[k]), k - max_lag)
            out[(a, b)] = best
    return out, bin_ns


def merge_components(nodes: list[str], lab: np.ndarray, flows: pl.DataFrame, control: pl.DataFrame,
                     config: FlowConfig) -> np.ndarray:
    """Merge pair-graph components that are one job; returns a job label per node.

    Rail-optimised fabrics keep each tensor-parallel rank's traffic on its own
    rail, so one job shows up as several disconnected copies of its DP x PP
    graph. Two pieces of evidence join them: (1) every rank of a job connects
    to the job's rendezvous store (``rendezvous_ports``), so components whose
    endpoints talk to one rendezvous server are one job; (2) without that,
    copies of one size whose traffic carries the same bytes and whose record
    starts and ends coincide within ``sync_tolerance_ns`` after one clock offset (lockstep).
    Needs flows src_addr, dst_addr, start_ns, est_bytes; control flows src_addr, dst_addr, dst_port.
    """
    ncomp = int(lab.max()) + 1 if len(lab) else 0
    node_lab = dict(zip(nodes, lab.tolist()))
    parent = list(range(ncomp))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    if not control.is_empty():
        rdv = control.filter(pl.col("dst_port").is_in(list(config.rendezvous_ports)))
        # the server may be a rank of the job or a host of its own: join all its clients
        for (server,), g in rdv.group_by("dst_addr"):
            labs = {node_lab[x] for x in [server, *g["src_addr"].to_list()] if x in node_lab}
            labs = sorted(labs)
            for other in labs[1:]:
                if find(other) != find(labs[0]):
                    parent[find(other)] = find(labs[0])
    resolution = flow_resolution_ns(flows)
    # only the traffic inside each copy: a rail's NIC may also talk to storage or control hosts
    f = flows.select("src_addr", "dst_addr", "start_ns", "end_ns", "est_bytes").with_columns(
        c=pl.col("src_addr").replace_strict(node_lab, default=-1, return_dtype=pl.Int64),
        cd=pl.col("dst_addr").replace_strict(node_lab, default=-2, return_dtype=pl.Int64),
    ).filter((pl.col("c") >= 0) & (pl.col("c") == pl.col("cd")))
    volume = {int(c): float(v) for c, v in f.group_by("c").agg(v=pl.col("est_bytes").sum()).iter_rows()}
    size = np.bincount(lab, minlength=ncomp)
    cand = [c for c in range(ncomp) if size[c] >= 2 and c in volume]
    corr, _ = rail_correlations(f, cand, config, resolution)
    for (a, b), (r, _lag) in sorted(corr.items()):
        if size[a] != size[b] or find(a) == find(b):
            continue
        if abs(volume[a] - volume[b]) > 0.25 * max(volume[a], volume[b]):
            continue
        if r >= config.rail_min_correlation:
            parent[find(b)] = find(a)
    return np.array([find(c) for c in lab.tolist()], dtype=np.int64)


def recognise_jobs(flow: pl.DataFrame, capture: str, config: FlowConfig | None = None) -> FabricJobs:
    """Training jobs in one flow capture.

    Needs flow columns src_addr, dst_addr, src_port, dst_port, size_bytes,
    sampling_rate, exporter, start_ns, end_ns. Returns the jobs (named per the
    contract) and data-quality counts of what is not training traffic.
    """
    cfg = config or FlowConfig()
    pt = pair_traffic(flow, cfg)
    edges = undirected_edges(pt.pairs) if not pt.pairs.is_empty() else pt.pairs
    undecided: list[dict] = []
    heavy = heavy_edges(edges, cfg, undecided) if not edges.is_empty() else edges
    nodes = sorted(set(pt.pairs["src"].to_list()) | set(pt.pairs["dst"].to_list()), key=address_key) \
        if not pt.pairs.is_empty() else []
    quality = dict(pt.quality)
    if undecided:
        quality["undecided_job_or_storage"] = undecided
    if not nodes or heavy.is_empty():
        quality.update(non_training_endpoints=len(nodes), light_pair_bytes=float(edges["bytes"].sum())
                       if not edges.is_empty() else 0.0)
        return FabricJobs([], quality)
    idx = {n: i for i, n in enumerate(nodes)}
    ai = np.array([idx[x] for x in heavy["a"].to_list()])
    bi = np.array([idx[x] for x in heavy["b"].to_list()])
    rails = components(nodes, ai, bi)
    lab = merge_components(nodes, rails, pt.training_flows, pt.control_flows, cfg)
    sizes = np.bincount(lab)
    members: dict[int, list[str]] = {}
    for n, c in zip(nodes, lab):
        if sizes[c] >= cfg.min_job_endpoints:
            members.setdefault(int(c), []).append(n)
    groups = _with_evidence(members, lab, rails, nodes, heavy, pt.training_flows, cfg, quality)
    e_lab = lab[ai]
    e_bytes = heavy["bytes"].to_numpy()
    jobs = []
    for i, m in enumerate(groups):
        c = lab[idx[m[0]]]
        name = capture if len(groups) == 1 else f"{capture}-{i + 1}"
        sel = e_lab == c
        jobs.append(RecognisedJob(name, m, int(sel.sum()), float(e_bytes[sel].sum())))
    in_job = {a for j in jobs for a in j.endpoints}
    inside = pl.col("a").is_in(list(in_job)) & pl.col("b").is_in(list(in_job))
    light = edges.filter(~inside)
    quality.update(
        non_training_endpoints=len(nodes) - len(in_job),
        non_training_pairs=int(light.height),
        non_training_bytes=float(light["bytes"].sum()) if light.height else 0.0,
        # heavy links of sets rejected as jobs are outside every job: counting them here went negative
        light_pairs_inside_jobs=int(edges.height - light.height - heavy.filter(inside).height),
    )
    return FabricJobs(jobs, quality)


def _with_evidence(members: dict[int, list[str]], lab: np.ndarray, rails: np.ndarray, nodes: list[str],
                   heavy: pl.DataFrame, flows: pl.DataFrame, cfg: FlowConfig, quality: dict) -> list[list[str]]:
    """The candidate endpoint sets that show a training job's shape; the others are counted as
    non-training (storage, checkpoint, control) in ``quality``."""
    from rankscope.analysis.fabric.job_evidence import job_evidence

    resolution = flow_resolution_ns(flows)
    payload = flows.filter(pl.col("is_data")) if "is_data" in flows.columns else flows
    keep, rejected = [], []
    for m in members.values():
        ms = set(m)
        ev = job_evidence(m, heavy.filter(pl.col("a").is_in(m) & pl.col("b").is_in(m)),
                          payload.filter(pl.col("src_addr").is_in(m) & pl.col("dst_addr").is_in(m)),
                          len({int(r) for x, r in zip(nodes, rails.tolist()) if x in ms}), resolution, cfg)
        if ev["is_job"]:
            keep.append(m)
        else:
            rejected.append({"endpoints": len(m), "first": m[0], **ev})
    if rejected:
        quality["not_training"] = rejected
    return sorted(keep, key=lambda m: address_key(m[0]))


def job_flows(flow: pl.DataFrame, endpoints: list[str]) -> pl.DataFrame:
    """The records of one recognised job: both ends among its endpoints (control ports included)."""
    return flow.filter(pl.col("src_addr").is_in(endpoints) & pl.col("dst_addr").is_in(endpoints))
