"""Job recognition: split the endpoints of a shared fabric into training jobs.

Training jobs exchange heavy, repeated traffic among a fixed set of
endpoints; jobs do not exchange heavy traffic with each other. So after
setting apart control/storage ports and keeping only the heavy pairs (see
:func:`rankscope.analysis.flow_features.heavy_edges`), each connected
component of the pair graph (rails in lockstep merged) with at least
``min_job_endpoints`` members is a candidate, and a job only with positive
evidence of training: rail copies, periodic bursts, or a DP x PP grid
(storage replication is heavy too, and shows none). Endpoints left alone (storage servers, hosts that only saw light traffic)
are non-training and are only counted. Names follow the contract: the capture
name when there is one job, else ``<capture>-1``, ``-2``, ... ordered by each
job's lowest endpoint address (numeric for IPv4).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from rankscope.analysis.flow_config import FlowConfig
from rankscope.analysis.flow_features import heavy_edges, pair_traffic, undirected_edges


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


def address_key(addr: str):
    """Sort key that orders IPv4/IPv6 numerically and anything else after, by text."""
    try:
        ip = ipaddress.ip_address(addr)
        return (ip.version, int(ip), "")
    except ValueError:
        return (9, 0, addr)


def components(nodes: list[str], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Component label of each node for undirected edges given as node indices (scipy csgraph)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(nodes)
    m = coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n))
    return connected_components(m, directed=False)[1]


def _nearest(ta: np.ndarray, tb: np.ndarray) -> np.ndarray:
    """Signed difference from each time in ta to the nearest time in tb (tb sorted)."""
    j = np.clip(np.searchsorted(tb, ta), 1, max(len(tb) - 1, 1))
    lo, hi = tb[j - 1], tb[np.minimum(j, len(tb) - 1)]
    return np.where(np.abs(ta - lo) <= np.abs(ta - hi), ta - lo, ta - hi)


def timestamp_resolution_ns(times: np.ndarray) -> int:
    """The coarsest power-of-ten tick (1 us .. 1 s) that nearly all times (or durations) fall on:
    exporters that write flowStartMilliseconds give 1 ms, nfdump CSV 1 s, our simulator 1 us (finer
    ticks are not told apart: clock alignment works in float64, exact to ~256 ns at epoch times)."""
    t = np.asarray(times, dtype=np.int64)
    t = t[t != 0]
    if t.size == 0:
        return 1000
    for tick in (10**k for k in range(9, 3, -1)):
        r = t % tick
        if np.mean(np.minimum(r, tick - r) <= max(tick // 100, 1024)) >= 0.99:
            return tick
    return 1000


def _lockstep(sa, sb, ea, eb, config: FlowConfig, resolution_ns: int = 1) -> bool:
    """Two traffic graphs run in lockstep: after one clock offset (their exporters may disagree by up
    to ``max_exporter_skew_ns``), most record starts and ends coincide within the sync tolerance:
    ``sync_tolerance_ns``, widened to two ticks of the timestamps (two records of one instant can sit
    a tick apart on either side of it)."""
    if len(sa) < 2 or len(sb) < 2:
        return False
    off = float(np.median(_nearest(sa, sb)))
    if abs(off) > config.max_exporter_skew_ns:
        return False
    tol = max(config.sync_tolerance_ns, 2 * resolution_ns)
    rs = np.abs(_nearest(sa - off, sb))
    re = np.abs(_nearest(ea - off, eb))
    return bool(np.mean(rs <= tol) > 0.5 and np.mean(re <= tol) > 0.5)


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
    f = flows.select("src_addr", "start_ns", "end_ns", "est_bytes").with_columns(
        c=pl.col("src_addr").replace_strict(node_lab, default=-1, return_dtype=pl.Int64)).filter(pl.col("c") >= 0)
    groups = {int(c): g for (c,), g in f.group_by("c")}
    starts = {c: np.sort(g["start_ns"].to_numpy()) for c, g in groups.items()}
    ends = {c: np.sort(g["end_ns"].to_numpy()) for c, g in groups.items()}
    volume = {c: float(g["est_bytes"].sum()) for c, g in groups.items()}
    size = np.bincount(lab, minlength=ncomp)
    # durations keep the exporter's tick after clock alignment shifted the times themselves
    resolution = timestamp_resolution_ns((f["end_ns"] - f["start_ns"]).to_numpy()) if f.height else 1
    by_size: dict[int, list[int]] = {}
    for c in range(ncomp):
        if size[c] >= 2 and c in starts:
            by_size.setdefault(int(size[c]), []).append(c)
    for comps in by_size.values():
        for i, a in enumerate(comps):
            for b in comps[i + 1:]:
                if find(a) == find(b) or abs(volume[a] - volume[b]) > 0.25 * max(volume[a], volume[b]):
                    continue
                if _lockstep(starts[a], starts[b], ends[a], ends[b], config, resolution):
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
    heavy = heavy_edges(edges, cfg) if not edges.is_empty() else edges
    nodes = sorted(set(pt.pairs["src"].to_list()) | set(pt.pairs["dst"].to_list()), key=address_key) \
        if not pt.pairs.is_empty() else []
    quality = dict(pt.quality)
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
    not_jobs = []
    for c, m in list(members.items()):
        why = _not_training(m, heavy, int(len(set(rails[lab == c].tolist()))), pt.training_flows)
        if why:
            not_jobs.append({"endpoints": len(m), "first": m[0], "why": why})
            del members[c]
    groups = sorted(members.values(), key=lambda m: address_key(m[0]))
    e_lab = lab[ai]
    e_bytes = heavy["bytes"].to_numpy()
    jobs = []
    for i, m in enumerate(groups):
        c = lab[idx[m[0]]]
        name = capture if len(groups) == 1 else f"{capture}-{i + 1}"
        sel = e_lab == c
        jobs.append(RecognisedJob(name, m, int(sel.sum()), float(e_bytes[sel].sum())))
    in_job = {a for j in jobs for a in j.endpoints}
    light = edges.filter(~(pl.col("a").is_in(list(in_job)) & pl.col("b").is_in(list(in_job))))
    if not_jobs:
        quality["heavy_groups_not_training"] = not_jobs
    quality.update(
        non_training_endpoints=len(nodes) - len(in_job),
        non_training_pairs=int(light.height),
        non_training_bytes=float(light["bytes"].sum()) if light.height else 0.0,
        light_pairs_inside_jobs=int(edges.height - heavy.height - light.height),
    )
    return FabricJobs(jobs, quality)


def burst_starts(flows: pl.DataFrame) -> pl.DataFrame:
    """The records that start a burst of their 5-tuple (key, start_ns), key an integer per 5-tuple.

    A burst starts after an idle gap; a record that follows its predecessor closely is the same
    burst cut by the exporter's active timeout, and its start carries no step phase (a 1 s active
    timeout alone would make any long transfer look periodic).
    """
    if flows.is_empty():
        return pl.DataFrame(schema={"key": pl.UInt32, "start_ns": pl.Int64})
    key = pl.concat_str(["src_addr", "dst_addr", "src_port", "dst_port"], separator="|", ignore_nulls=True)
    f = flows.select("src_addr", "dst_addr", "src_port", "dst_port", "start_ns", "end_ns").with_columns(
        key=key.cast(pl.Categorical).to_physical()).sort(["key", "start_ns"])
    gap = pl.col("start_ns") - pl.col("end_ns").shift(1).over("key")
    f = f.with_columns(gap=gap).with_columns(big=pl.col("gap").max().over("key"))
    return f.filter(pl.col("gap").is_null() | (pl.col("gap") > 0.2 * pl.col("big"))).select("key", "start_ns")


def _not_training(members: list[str], heavy: pl.DataFrame, copies: int, flows: pl.DataFrame) -> str | None:
    """Why a connected set of heavy pairs is not a training job, or None when it is one.

    Heavy traffic alone is not enough (storage replication and checkpoint copies are heavy too):
    a training job shows positive evidence, at least one of: copies on several rails running in
    lockstep, traffic that repeats with one period (the step), or links that form a DP x PP grid.
    """
    if copies >= 2:
        return None
    from rankscope.analysis.flow_groups import fit_grid
    from rankscope.analysis.timelines import step_period

    f = flows.filter(pl.col("src_addr").is_in(members) & pl.col("dst_addr").is_in(members))
    bursts = burst_starts(f)
    if bursts.height >= 3 and step_period(bursts["key"].to_numpy(), bursts["start_ns"].to_numpy()) is not None:
        return None
    e = heavy.filter(pl.col("a").is_in(members) & pl.col("b").is_in(members))
    if fit_grid(members, e).valid:
        return None
    return "no positive evidence of training: one rail, no periodic traffic, links form no DP x PP grid"


def job_flows(flow: pl.DataFrame, endpoints: list[str]) -> pl.DataFrame:
    """The records of one recognised job: both ends among its endpoints (control ports included)."""
    return flow.filter(pl.col("src_addr").is_in(endpoints) & pl.col("dst_addr").is_in(endpoints))
