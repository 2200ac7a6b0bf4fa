"""Network transfers of one simulated job (the input of the flow exporter model).

Turns completed comm ops into per-peer transfers (see :mod:`sim.network.flow_export` for
the decomposition) and keeps those between hosts, with their NIC addresses,
connection ids (one per process group), first RoCE source port and the leaf
exporter that sees them.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.datasets.sim.job_config import SimConfig
from rankscope.datasets.sim.network.faults import dp_rings
from rankscope.datasets.sim.network.flow_export import ROCE_PORT, collective_transfers
from rankscope.datasets.sim.network.transport import rank_exporters, source_port
from rankscope.datasets.sim.op_graph import Graph, Templates
from rankscope.datasets.sim.stage_ops import OP, STREAMS
from rankscope.datasets.sim.topology import Topology


def first_payload(ready: np.ndarray, i: np.ndarray, t: dict, g: Graph, world: int, transport: str,
                  algorithm: str) -> np.ndarray:
    """When each ring or all-to-all transfer's first payload goes out (``ready``: when each op was
    launched; the collective as a whole runs from its last member's launch).

    A member's first chunk is its own data, so its link to the next member opens as soon as both
    ends can take part, not when the last member of the group arrives: over RoCE the sender writes
    only into a buffer the receiver has posted (NCCL's clear-to-send), so at the later of the two
    launches; over TCP into the kernel's socket buffer at once, at its own launch. A late member thus
    opens its two ring links late (one over TCP) while its peers' links open on time. Tree
    transfers wait for the subtree below and keep the group's start."""
    src_op = i[t["i"]]
    tree = (t["op"] == OP["all_reduce"]) & (algorithm in ("tree", "double_tree"))
    own = ready[src_op]
    if transport == "tcp":
        return np.where(tree, t["t0"], own)
    key = g.sync[i].astype(np.int64) * world + g.rank[i]
    order = np.argsort(key, kind="stable")
    want = g.sync[src_op].astype(np.int64) * world + t["dst"]
    pos = np.clip(np.searchsorted(key[order], want), 0, order.size - 1)
    peer = i[order[pos]]
    found = key[order[pos]] == want
    both = np.where(found, np.maximum(own, ready[peer]), t["t0"])
    return np.where(tree, t["t0"], np.minimum(both, t["t0"]))


def job_transfers(cfg: SimConfig, topo: Topology, g: Graph, T: Templates, start: np.ndarray, end: np.ndarray,
                  job_index: int, epoch_ns: int, rng: np.random.Generator | None = None,
                  ready: np.ndarray | None = None) -> pl.DataFrame:
    """Inter-host transfers of the job's completed comm ops; times in int ns after ``epoch_ns``.

    Also returns the rank ids (``srank``, ``drank``) for the transport model. With
    ``realism.rail_jitter_us`` every transfer starts an exponential delay late and each rail runs
    at its own speed (``rng`` draws both; the rail speeds from the job seed so chunks agree).
    With ``ready`` (each op's launch), ring and all-to-all transfers open at their first payload
    (:func:`first_payload`) instead of the collective's start."""
    done = (T.kind[g.tmpl] == 1) & np.isfinite(end) & (T.role[g.tmpl] != 2)
    ops = T.op_code[g.tmpl]
    strm = T.stream[g.tmpl]
    parts = []
    sizes = {"dp": cfg.dp, "tp": cfg.tp, "ep": cfg.ep, "cp": cfg.cp, "dpx": cfg.dp * cfg.ep}
    for code, axis in enumerate(STREAMS):
        if axis not in sizes:
            continue
        i = np.flatnonzero(done & (strm == code))
        if not i.size:
            continue
        algo = "double_tree" if cfg.algorithm == "tree" and cfg.realism.double_tree else cfg.algorithm
        rings = dp_rings(cfg, topo) if axis == "dp" else {}
        row = g.group_row[i]
        if rings:  # misgrouped: a rank moved to another DP group's ring (sim.network.faults)
            row = np.array(row, copy=True)
            for r, ring in rings.items():
                row[np.isin(g.rank[i], ring)] = r
        plain = ~np.isin(row, list(rings))
        subsets = [(i[plain], row[plain], topo.coord[axis], topo.groups[axis], sizes[axis])]
        for r, ring in rings.items():
            pos = np.zeros(topo.world, dtype=np.int64)
            pos[ring] = np.arange(len(ring))
            sel = row == r
            subsets.append((i[sel], row[sel], pos, np.array([ring] * (int(r) + 1)), len(ring)))
        for ii, rr, pos, members, size in subsets:
            if not ii.size or size < 2:
                continue
            t = collective_transfers(ops[ii], g.rank[ii], pos[g.rank[ii]], np.full(ii.size, size), members[rr],
                                     g.size_bytes[ii], start[ii], end[ii], algo)
            t["conn"] = code * (1 << 24) + rr[t["i"]]
            if ready is not None:
                t["op"] = ops[ii][t["i"]]
                t["t0"] = first_payload(ready, ii, t, g, topo.world, cfg.realism.transport, cfg.algorithm)
            parts.append(t)
    i = np.flatnonzero(done & (T.role[g.tmpl] == 1))
    if i.size:
        parts.append({"src": g.rank[i], "dst": g.peer[i], "bytes": g.size_bytes[i], "t0": start[i], "t1": end[i],
                      "conn": STREAMS.index("pp") * (1 << 24) + g.group_row[i]})
    if not parts:
        return pl.DataFrame()
    src = np.concatenate([p["src"] for p in parts]).astype(np.int64)
    dst = np.concatenate([p["dst"] for p in parts]).astype(np.int64)
    keep = topo.host[src] != topo.host[dst]
    src, dst = src[keep], dst[keep]
    conn = np.concatenate([p["conn"] for p in parts])[keep] + job_index * (1 << 32)
    shift = cfg.start_ns - epoch_ns
    t0 = shift + np.rint(np.concatenate([p["t0"] for p in parts])[keep]).astype(np.int64)
    t1 = shift + np.rint(np.concatenate([p["t1"] for p in parts])[keep]).astype(np.int64)
    jitter = cfg.realism.rail_jitter_us * 1e3
    if jitter > 0:
        rng = rng or np.random.default_rng([cfg.seed, 43])
        speed = 1.0 + np.random.default_rng([cfg.seed, 47]).normal(0, 0.03, int(topo.rail.max()) + 1)
        delay = np.rint(rng.exponential(jitter, src.size)).astype(np.int64)
        dur = np.rint((t1 - t0) * np.clip(speed[topo.rail[src]], 0.8, 1.2)).astype(np.int64)
        t0 = t0 + delay
        t1 = t0 + np.maximum(dur, 0)
    return pl.DataFrame({
        "src_addr": topo.addr_int[src], "dst_addr": topo.addr_int[dst], "conn": conn, "t0": t0, "t1": t1,
        "bytes": np.concatenate([p["bytes"] for p in parts])[keep].astype(np.int64),
        "qps": np.full(src.size, cfg.qps), "sport": source_port(src, dst, conn, cfg.qps),
        "dport": np.full(src.size, ROCE_PORT), "protocol": np.full(src.size, 17),
        "exporter": rank_exporters(cfg, topo).gather(src), "srank": src, "drank": dst})
