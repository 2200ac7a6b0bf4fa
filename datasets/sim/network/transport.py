"""Transports on the wire: what a rank-to-rank transfer looks like to a switch besides its data.

Input: the job's data transfers with their rank ids (``srank``, ``drank``).
Output: the same transfers with transport ports, per-packet header sizes and
optional destination QPs, plus the traffic a real transport adds:

- RoCE (reliable connected QPs): the responder acknowledges every
  ``ack_every`` data packets (ACK: BTH + AETH, no payload beyond the 4-byte
  AETH) on the same QP, and NCCL's receiver writes a clear-to-send entry
  (``CTS_BYTES``) into the sender's FIFO for every ``CTS_CHUNK`` bytes. The
  first CTS leaves before the data does, so the reverse flow starts first.
  NCCL's network connections are one-way (a send comm at one end, a recv
  comm at the other, each with its own QPs), so the ACKs and CTS of A -> B
  leave B from other QPs than B's own data to A: another UDP source port and
  another destination QP, a flow record of their own.
- TCP: one connection per rank pair and group; the lower rank listens (a
  listening port per rank and group, unique on its address), the other
  connects from an ephemeral port. Both directions share the 5-tuple, the
  receiver sends a delayed ACK per two segments, and a SYN / SYN-ACK / ACK
  handshake opens both directions together when the process groups are set
  up, ``connect_lead_s`` before the first data (a record of its own when the
  exporter's idle timeout is shorter than that). With ``tcp_mesh`` (gloo)
  every pair of a group connects, not only the pairs that carry data. With
  ``close_lag_s`` the processes exit that long after the last data, each
  EXIT_SPREAD_NS apart on average in no set order, and each connection closes
  (FIN, FIN/ACK, ACK) when the first of its ends exits: a flow record kept
  open by a long idle timeout then ends at the teardown, not the last data.

All column-wise; ports and QP numbers come from integer hashes so the same
job always gets the same ones.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.datasets.sim.job_config import SimConfig
from rankscope.datasets.sim.network.flow_export import (
    ACK,
    FIN,
    HEADER_BYTES,
    PSH,
    ROCE_PORT,
    SYN,
)
from rankscope.datasets.sim.realism import exporter_name
from rankscope.datasets.sim.stage_ops import STREAMS
from rankscope.datasets.sim.topology import Topology

TCP_HEADER_BYTES = 52
"""IPv4 20 + TCP 20 + timestamp option 12."""
ACK_PAYLOAD = 4
"""RoCE ACK: the AETH after the BTH (the rest is in HEADER_BYTES)."""
CTS_BYTES = 64
"""NCCL IB: one send-FIFO entry written by the receiver per chunk (RDMA write with RETH)."""
CTS_CHUNK = 512 * 1024
CTS_LEAD_NS = 3_000
"""the receiver posts the CTS this long before the sender's data arrives."""
RTT_NS = 8_000
EXIT_SPREAD_NS = 2_000_000
"""mean gap (exponential) between one process's exit and the next at the end of a job."""
LISTEN_BASE, EPHEMERAL_BASE, EPHEMERAL_SPAN = 20_000, 40_000, 20_000
ACK_SIDE = 1 << 48
"""hash input for the QP pair that a one-way connection's ACKs and CTS travel on (the responder's source
port, the requester's QP number), kept apart from the QPs of the reverse connection (connection ids stay
below it)."""


def _hash(*cols: np.ndarray) -> np.ndarray:
    h = np.zeros(len(cols[0]), dtype=np.uint64)
    for i, c in enumerate(cols):
        h = (h * np.uint64(1_000_003) + c.astype(np.uint64) * np.uint64(2654435761 + 2 * i)) % np.uint64(1 << 61)
    return h


def rank_exporters(cfg: SimConfig, topo: Topology) -> pl.Series:
    """Exporter (leaf) of each rank's NIC port (a dead link's NIC: the leaf of its backup port's rail)."""
    hpp = cfg.realism.hosts_per_pod
    rails = np.array(topo.rail, copy=True)
    for f in cfg.faults_of("dead-link"):
        from rankscope.datasets.sim.network.faults import backup_rail

        p = cfg.fault_params(f)
        rails[topo.addr_int == topo.addr_int[p["rank"]]] = backup_rail(cfg, topo, p)
    return pl.Series([exporter_name(int(r), int(h), hpp) for r, h in zip(rails, topo.host)], dtype=pl.String)


def qp_base(rank: np.ndarray, conn: np.ndarray, topo: Topology, qps: int) -> np.ndarray:
    """First destination QP number of ``rank``'s side of a connection: each process of an address
    allocates from its own block, so a QP number tells the ranks of one address apart."""
    slot = topo.slot[rank] if topo.slot is not None else np.zeros_like(rank)
    block, first = 0x4000, 0x100  # QPNs below 0x100 are reserved; every rank keeps inside its own block
    within = (_hash(conn, rank) % np.uint64((block - first) // qps - 1)).astype(np.int64) * qps
    return slot * block + first + within


def listen_port(rank: np.ndarray, conn: np.ndarray, topo: Topology, share: int) -> np.ndarray:
    slot = topo.slot[rank] if topo.slot is not None else np.zeros_like(rank)
    return LISTEN_BASE + (_hash(conn, rank) % np.uint64(2000)).astype(np.int64) * share + slot


def _roce(tr: pl.DataFrame, cfg: SimConfig, topo: Topology, exporters: pl.Series) -> pl.DataFrame:
    r = cfg.realism
    mtu = r.mtu or cfg.mtu
    tr = tr.with_columns(hdr=pl.lit(HEADER_BYTES, pl.Int64))
    s, d, c = (tr[k].to_numpy() for k in ("srank", "drank", "conn"))
    if r.dst_qp:
        tr = tr.with_columns(qpn=pl.Series(qp_base(d, c, topo, cfg.qps)))
    if not r.reverse:
        return tr

    nbytes = tr["bytes"].to_numpy()
    data_pkts = -(-nbytes // mtu)
    acks = -(-data_pkts // r.ack_every)
    cts = -(-nbytes // CTS_CHUNK)
    rev = pl.DataFrame({
        "src_addr": topo.addr_int[d], "dst_addr": topo.addr_int[s], "conn": c,
        "t0": np.maximum(tr["t0"].to_numpy() - CTS_LEAD_NS, 0), "t1": tr["t1"].to_numpy() + RTT_NS // 2,
        "bytes": acks * ACK_PAYLOAD + cts * CTS_BYTES, "pkts": acks + cts, "qps": tr["qps"].to_numpy(),
        # the responder's QPs of this one-way connection: not those of its own data to the sender
        "sport": source_port(d, s, c | ACK_SIDE, cfg.qps), "dport": np.full(len(s), ROCE_PORT),
        "protocol": np.full(len(s), 17), "exporter": exporters.gather(d), "hdr": np.full(len(s), HEADER_BYTES),
        "srank": d, "drank": s})
    if r.dst_qp:
        rev = rev.with_columns(qpn=pl.Series(qp_base(s, c | ACK_SIDE, topo, cfg.qps)))
    return pl.concat([tr, rev], how="diagonal_relaxed")


def _tcp(tr: pl.DataFrame, cfg: SimConfig, topo: Topology, exporters: pl.Series) -> pl.DataFrame:
    r = cfg.realism
    mtu = r.mtu or cfg.mtu
    s, d, c = (tr[k].to_numpy() for k in ("srank", "drank", "conn"))
    lo, hi = np.minimum(s, d), np.maximum(s, d)
    lport = listen_port(lo, c, topo, r.ranks_per_address)
    eport = EPHEMERAL_BASE + (_hash(lo, hi, c) % np.uint64(EPHEMERAL_SPAN)).astype(np.int64)
    sport, dport = np.where(s == lo, lport, eport), np.where(s == lo, eport, lport)
    t0, t1, nbytes = tr["t0"].to_numpy(), tr["t1"].to_numpy(), tr["bytes"].to_numpy()
    n = len(s)
    common = {"conn": c, "qps": np.ones(n, dtype=np.int64), "protocol": np.full(n, 6),
              "hdr": np.full(n, TCP_HEADER_BYTES)}
    data = pl.DataFrame({"src_addr": topo.addr_int[s], "dst_addr": topo.addr_int[d], "t0": t0, "t1": t1,
                         "bytes": nbytes, "sport": sport, "dport": dport, "exporter": exporters.gather(s),
                         "srank": s, "drank": d, "tcp_flags": np.full(n, PSH | ACK), **common})
    acks = pl.DataFrame({"src_addr": topo.addr_int[d], "dst_addr": topo.addr_int[s], "t0": t0 + RTT_NS // 2,
                         "t1": t1 + RTT_NS // 2, "bytes": np.zeros(n, dtype=np.int64),
                         "pkts": np.maximum(-(-nbytes // mtu) // 2, 1), "sport": dport, "dport": sport,
                         "exporter": exporters.gather(d), "srank": d, "drank": s, "tcp_flags": np.full(n, ACK),
                         **common})
    # one handshake per connection, just before its first data, both directions together
    first = data.group_by("srank", "drank", "conn").agg(pl.col("t0").min(), pl.col("sport").first(),
                                                        pl.col("dport").first())
    first = first.with_columns(lo=pl.min_horizontal("srank", "drank"), hi=pl.max_horizontal("srank", "drank"))
    # a full sort key: group_by's row order varies from run to run, and each row below draws its own
    # handshake delay in this order (the same job must always get the same records)
    order = ["t0", "lo", "hi", "conn"]
    first = first.sort(*order).unique(["lo", "hi", "conn"], keep="first", maintain_order=True)
    if r.tcp_mesh:
        first = pl.concat([first.select("lo", "hi", "conn", "t0"), _mesh(first, topo)]).sort(*order).unique(
            ["lo", "hi", "conn"], keep="first", maintain_order=True)
    lo_, hi_, cc = (first[k].to_numpy() for k in ("lo", "hi", "conn"))
    lp = listen_port(lo_, cc, topo, r.ranks_per_address)
    ep = EPHEMERAL_BASE + (_hash(lo_, hi_, cc) % np.uint64(EPHEMERAL_SPAN)).astype(np.int64)
    # process groups connect at set-up, seconds before the first data; each connection a little apart
    m = len(lo_)
    rng = np.random.default_rng([cfg.seed, 53])
    init = int(first["t0"].min()) - int(r.connect_lead_s * 1e9 * rng.uniform(0.5, 1.5))
    t_syn = init + np.rint(rng.exponential(2e6, m)).astype(np.int64)
    hs_common = {"conn": cc, "qps": np.ones(m, dtype=np.int64), "protocol": np.full(m, 6),
                 "bytes": np.zeros(m, dtype=np.int64), "hdr": np.full(m, TCP_HEADER_BYTES + 8)}
    syn = pl.DataFrame({"src_addr": topo.addr_int[hi_], "dst_addr": topo.addr_int[lo_], "t0": t_syn,
                        "t1": t_syn + RTT_NS, "pkts": np.full(m, 2), "sport": ep, "dport": lp,
                        "exporter": exporters.gather(hi_), "srank": hi_, "drank": lo_,
                        "tcp_flags": np.full(m, SYN | ACK), **hs_common})
    synack = pl.DataFrame({"src_addr": topo.addr_int[lo_], "dst_addr": topo.addr_int[hi_],
                           "t0": t_syn + RTT_NS // 2, "t1": t_syn + RTT_NS // 2, "pkts": np.ones(m, dtype=np.int64),
                           "sport": lp, "dport": ep, "exporter": exporters.gather(lo_), "srank": lo_,
                           "drank": hi_, "tcp_flags": np.full(m, SYN | ACK), **hs_common})
    parts = [data, acks, syn, synack]
    if r.close_lag_s > 0:
        parts += _teardown(int(tr["t1"].max()), lo_, hi_, lp, ep, cfg, topo, exporters, hs_common)
    return pl.concat(parts, how="diagonal_relaxed")


def _teardown(t_last: int, lo: np.ndarray, hi: np.ndarray, lport: np.ndarray, eport: np.ndarray, cfg: SimConfig,
              topo: Topology, exporters: pl.Series, common: dict) -> list[pl.DataFrame]:
    """FIN records of every connection (lo listens on lport, hi connects from eport), closed by whichever
    end's process exits first."""
    rng = np.random.default_rng([cfg.seed, 59])
    ranks = len(topo.addr_int)
    exit_ns = t_last + int(cfg.realism.close_lag_s * 1e9) + np.rint(rng.exponential(EXIT_SPREAD_NS, ranks)).astype(
        np.int64)
    lo_first = exit_ns[lo] <= exit_ns[hi]
    closer, peer = np.where(lo_first, lo, hi), np.where(lo_first, hi, lo)
    cport, pport = np.where(lo_first, lport, eport), np.where(lo_first, eport, lport)
    t = np.minimum(exit_ns[lo], exit_ns[hi])
    m = len(lo)
    fin = pl.DataFrame({"src_addr": topo.addr_int[closer], "dst_addr": topo.addr_int[peer], "t0": t,
                        "t1": t + RTT_NS, "pkts": np.full(m, 2), "sport": cport, "dport": pport,
                        "exporter": exporters.gather(closer), "srank": closer, "drank": peer,
                        "tcp_flags": np.full(m, FIN | ACK), **common})
    finack = pl.DataFrame({"src_addr": topo.addr_int[peer], "dst_addr": topo.addr_int[closer], "t0": t + RTT_NS // 2,
                           "t1": t + RTT_NS // 2, "pkts": np.ones(m, dtype=np.int64), "sport": pport, "dport": cport,
                           "exporter": exporters.gather(peer), "srank": peer, "drank": closer,
                           "tcp_flags": np.full(m, FIN | ACK), **common})
    return [fin, finack]


def _mesh(first: pl.DataFrame, topo: Topology) -> pl.DataFrame:
    """Every pair of every group that carried data, on different addresses (gloo connects a full mesh)."""
    rows = []
    for conn, t0 in first.group_by("conn").agg(pl.col("t0").min()).iter_rows():
        code, row = (conn % (1 << 32)) >> 24, conn % (1 << 24)
        members = topo.groups[STREAMS[code]][row]
        i, j = np.triu_indices(len(members), 1)
        a, b = members[i], members[j]
        keep = topo.addr_int[a] != topo.addr_int[b]
        rows.append(pl.DataFrame({"lo": np.minimum(a, b)[keep], "hi": np.maximum(a, b)[keep],
                                  "conn": np.full(int(keep.sum()), conn), "t0": np.full(int(keep.sum()), t0)}))
    return pl.concat(rows) if rows else first.select("lo", "hi", "conn", "t0").clear()


def apply_transport(tr: pl.DataFrame, cfg: SimConfig, topo: Topology) -> pl.DataFrame:
    """The job's data transfers (with ``srank``/``drank``) as its transport puts them on the wire."""
    if tr.height == 0:
        return tr
    exporters = rank_exporters(cfg, topo)
    out = (_tcp if cfg.realism.transport == "tcp" else _roce)(tr, cfg, topo, exporters)
    # packets at this job's own MTU (jobs on one fabric may differ)
    mtu = cfg.realism.mtu or cfg.mtu
    if "pkts" not in out.columns:
        out = out.with_columns(pkts=pl.lit(None, pl.Int64))
    return out.with_columns(pkts=pl.col("pkts").fill_null((pl.col("bytes") + mtu - 1) // mtu))


def source_port(src: np.ndarray, dst: np.ndarray, conn: np.ndarray, qps: int) -> np.ndarray:
    """First RoCEv2 UDP source port of a connection (NCCL picks them per QP for ECMP entropy)."""
    h = (src.astype(np.uint64) * np.uint64(2654435761) + dst.astype(np.uint64) * np.uint64(40503)
         + conn.astype(np.uint64) * np.uint64(97)) % np.uint64(16384 - qps)
    return (49152 + h).astype(np.int64)
