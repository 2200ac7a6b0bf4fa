"""Job recognition: split the endpoints of a shared fabric into training jobs.

Training jobs exchange heavy, repeated traffic among a fixed set of
endpoints; jobs do not exchange heavy traffic with each other. So after
setting apart control/storage ports and keeping only the heavy pairs (see
:func:`rankscope.analysis.fabric.heavy_links.heavy_edges`), each connected
component of the pair graph with at least ``min_job_endpoints`` members is one
job. Endpoints left alone (storage servers, hosts that only saw light traffic)
are non-training and are only counted. Names follow the contract: the capture
name when there is one job, else ``<capture>-1``, ``-2``, ... ordered by each
job's lowest endpoint address (numeric for IPv4).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field

import numpy as np
import polars as pl

from rankscope.analysis.fabric.clock import flow_resolution_ns
from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.heavy_links import heavy_edges
from rankscope.analysis.fabric.job_evidence import job_evidence
from rankscope.analysis.fabric.pair_graph import address_key, components
from rankscope.analysis.fabric.pair_traffic import pair_traffic, undirected_edges
from rankscope.analysis.fabric.rails import merge_components
from rankscope.collectors.record_class import record


@record(frozen=False)
class RecognisedJob:
    name: str
    endpoints: list[str]
    """sorted by address."""
    num_edges: int
    bytes: float


@record(frozen=False)
class FabricJobs:
    jobs: list[RecognisedJob]
    quality: dict = field(default_factory=dict)
    """records / bytes set apart as control, storage or noise, and endpoints that are in no job."""

    def job_of(self) -> dict[str, str]:
        return {a: j.name for j in self.jobs for a in j.endpoints}


def recognise_jobs(flow: pl.DataFrame, capture: str, config: FlowConfig | None = None) -> FabricJobs:
    """Training jobs in one flow capture.

    Needs flow columns src_addr, dst_addr, src_port, dst_port, size_bytes,
    sampling_rate, exporter, start_ns, end_ns. Returns the jobs (named per the
    contract) and data-quality counts of what is not training traffic.
    """
    cfg = config or FlowConfig()
    pt = pair_traffic(flow, cfg)
    return recognise_pairs(
        pt.pairs, pt.quality, capture, cfg, pt.training_flows,
        lambda: flow_resolution_ns(pt.training_flows),
        lambda nodes, rails, resolution: merge_components(nodes, rails, pt.training_flows, pt.control_flows, cfg,
                                                          resolution))


def recognise_pairs(pairs: pl.DataFrame, pair_quality: dict, capture: str, cfg: FlowConfig,
                    payload: pl.DataFrame, resolution: Callable[[], int],
                    merge: Callable[[list[str], np.ndarray, int], np.ndarray],
                    pair_bursts: Callable[[int], pl.DataFrame] | None = None) -> FabricJobs:
    """:func:`recognise_jobs` from a capture's pair table on: the part that needs no raw record, so that a
    capture too big for one process can be reduced to its pairs elsewhere (analysis.runner.capture_split)
    and recognised here by the same code.

    ``pairs`` and ``pair_quality``: as :func:`pair_traffic` returns them; ``payload``: records (or bursts
    standing for them) with src_addr, dst_addr, start_ns, end_ns (and is_data, else all are payload), whose
    bursts job evidence counts; ``resolution()``: the capture's clock (fabric.clock.flow_resolution_ns);
    ``merge(nodes, rails, resolution)``: the job label per node (fabric.rails.merge_components);
    ``pair_bursts(resolution)``, when given, stands for ``payload`` (then unread): the burst count of every
    directed pair with payload (fabric.job_evidence.burst_counts at burst_gap_ns), asked for only when
    some endpoint set is a candidate job.
    """
    edges = undirected_edges(pairs) if not pairs.is_empty() else pairs
    undecided: list[dict] = []
    heavy = heavy_edges(edges, cfg, undecided) if not edges.is_empty() else edges
    nodes = sorted(set(pairs["src"].to_list()) | set(pairs["dst"].to_list()), key=address_key) \
        if not pairs.is_empty() else []
    quality = dict(pair_quality)
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
    # one clock reading for the whole capture: rails and job evidence both order its records by it
    res = resolution()
    lab = merge(nodes, rails, res)
    sizes = np.bincount(lab)
    members: dict[int, list[str]] = {}
    for n, c in zip(nodes, lab):
        if sizes[c] >= cfg.min_job_endpoints:
            members.setdefault(int(c), []).append(n)
    counts = pair_bursts(res) if pair_bursts is not None and members else None
    groups = _with_evidence(members, rails, nodes, heavy, payload, res, cfg, quality, counts)
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


def _with_evidence(members: dict[int, list[str]], rails: np.ndarray, nodes: list[str], heavy: pl.DataFrame,
                   flows: pl.DataFrame | None, resolution: int, cfg: FlowConfig, quality: dict,
                   bursts: pl.DataFrame | None = None) -> list[list[str]]:
    """The candidate endpoint sets that show a training job's shape; the others are counted as
    non-training (storage, checkpoint, control) in ``quality``. ``bursts``: per-pair burst counts that
    stand for ``flows`` (see :func:`recognise_pairs`)."""
    if bursts is None:
        payload = flows.filter(pl.col("is_data")) if "is_data" in flows.columns else flows
    keep, rejected = [], []
    for m in members.values():
        ms = set(m)
        inside = pl.col("src_addr").is_in(m) & pl.col("dst_addr").is_in(m)
        ev = job_evidence(m, heavy.filter(pl.col("a").is_in(m) & pl.col("b").is_in(m)),
                          None if bursts is not None else payload.filter(inside),
                          len({int(r) for x, r in zip(nodes, rails.tolist()) if x in ms}), resolution, cfg,
                          bursts.filter(inside) if bursts is not None else None)
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
