"""Switch flow records of the simulated traffic, as a leaf switch's exporter would emit them.

Collectives become per-peer transfers the way NCCL runs them: ring all_reduce
sends ``2(n-1)/n * size`` to the next member, ring reduce_scatter
``(n-1)/n * size``, ring all_gather ``(n-1) * shard``, all_to_all ``size/n``
to every other member, tree all_reduce (NCCL's double binary tree) half of
``size`` up to the parent and down to each child in each of its two trees,
send ``size`` to its peer. Only transfers between hosts reach a switch
(NVLink traffic never does). Each transfer is spread evenly over its
queue pairs (one UDP source port each, RoCEv2 destination port 4791) and
over the time its collective ran.

Export: per 5-tuple, a record starts at its first packet and is closed after
the active timeout (the next record starts at the next packet) or when the
flow idles longer than the idle timeout. Octets count at the IP layer:
payload plus ``HEADER_BYTES`` per packet of ``mtu`` payload bytes. With
1-in-N sampling each packet is kept with probability 1/N and the exported
``size_bytes``/``num_packets`` count only the kept ones. Everything is
column-wise; the only Python loop runs once per active-timeout window.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from rankscope.datasets.sim.records import to_kind
from rankscope.datasets.sim.stage_ops import OP

HEADER_BYTES = 44
"""IPv4 20 + UDP 8 + InfiniBand BTH 12 + ICRC 4 bytes per RoCEv2 packet."""
ROCE_PORT = 4791
FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10
"""TCP flag bits (tcpControlBits): each transfer carries the flags its packets have, OR-ed."""


def ring_bytes(op: np.ndarray, size: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Bytes one member sends to its ring neighbour for one ring collective (``op``: codes of OP)."""
    nn = np.maximum(n, 1)
    return np.select([op == OP["all_reduce"], op == OP["reduce_scatter"], op == OP["all_gather"]],
                     [2 * (nn - 1) * size // nn, (nn - 1) * size // nn, (nn - 1) * size], 0)


def int_to_addr(x: pl.Expr) -> pl.Expr:
    return pl.concat_str([((x // (1 << s)) % 256).cast(pl.String) for s in (24, 16, 8, 0)], separator=".")


def collective_transfers(op, rank, pos, n, members, size, t0, t1, algorithm: str) -> dict[str, np.ndarray]:
    """Per-peer transfers of completed collectives (one row per sending member).

    ``op``: codes of OP; ``members``: (rows, n) group members of each op's group in ring order;
    ``pos``: each op's own position in it. Returns src, dst, bytes, t0, t1, op index.
    """
    out = {"src": [], "dst": [], "bytes": [], "i": []}

    def emit(i, dst, nbytes):
        out["src"].append(rank[i])
        out["dst"].append(dst)
        out["bytes"].append(nbytes)
        out["i"].append(i)

    ring = np.isin(op, [OP["reduce_scatter"], OP["all_gather"]]) | ((op == OP["all_reduce"]) & (algorithm == "ring"))
    i = np.flatnonzero(ring & (n > 1))
    emit(i, members[i, (pos[i] + 1) % n[i]], ring_bytes(op[i], size[i], n[i]))
    a2a = np.flatnonzero((op == OP["all_to_all"]) & (n > 1))
    if a2a.size:
        j = np.arange(1, int(n[a2a].max()))
        ii, jj = np.repeat(a2a, n[a2a] - 1), np.concatenate([j[: k - 1] for k in n[a2a]])
        emit(ii, members[ii, (pos[ii] + jj) % n[ii]], size[ii] // n[ii])
    if algorithm in ("tree", "double_tree"):
        tr = np.flatnonzero((op == OP["all_reduce"]) & (n > 1))
        # NCCL's double binary tree (its only tree algorithm; "double_tree" is an alias): the second
        # tree mirrors the first (a leaf of one is inner in the other), each carries half the buffer
        trees = ((False, size // 2), (True, size - size // 2))
        for mirrored, tsize in trees:
            tpos = n - 1 - pos if mirrored else pos
            up = tr[tpos[tr] > 0]
            parent = (tpos[up] - 1) // 2
            emit(up, members[up, n[up] - 1 - parent if mirrored else parent], tsize[up])
            for child in (1, 2):
                dn = tr[2 * tpos[tr] + child < n[tr]]
                kid = 2 * tpos[dn] + child
                emit(dn, members[dn, n[dn] - 1 - kid if mirrored else kid], tsize[dn])
    res = {k: np.concatenate(v) if v else np.zeros(0, dtype=np.int64) for k, v in out.items()}
    res["t0"], res["t1"] = t0[res["i"]], t1[res["i"]]
    return res


def _windows(key: np.ndarray, a: np.ndarray, b: np.ndarray, active: int, idle: int, big: int):
    """Flow-record windows per key from busy intervals; inputs int64 ns sorted by (key, a).

    ``big`` exceeds every time + active, so ``key * big + t`` sorts by key then time.
    Returns (window key, window start, window last-packet time), sorted by (key, start).
    """
    if key.size and int(key.max()) * big > (1 << 62):
        raise OverflowError("capture too long for the flow window encoding")
    comp_end = np.maximum.accumulate(key * big + b) - key * big
    first = np.r_[True, key[1:] != key[:-1]]
    new_iv = first | (a > np.r_[0, comp_end[:-1]])
    iv_start = a[new_iv]
    iv_key = key[new_iv]
    last_idx = np.r_[np.flatnonzero(new_iv)[1:] - 1, len(a) - 1]
    iv_end = comp_end[last_idx]
    iv_first = np.r_[True, iv_key[1:] != iv_key[:-1]]
    new_sess = iv_first | (iv_start - np.r_[0, iv_end[:-1]] > idle)
    sess = np.cumsum(new_sess) - 1
    ends_c = sess * big + iv_end
    starts_c = sess * big + iv_start
    sess_last = np.r_[np.flatnonzero(new_sess)[1:] - 1, len(iv_start) - 1]
    sid = np.arange(int(sess[-1]) + 1) if len(sess) else np.zeros(0, dtype=np.int64)
    cur = iv_start[new_sess].copy()
    ws, wl, wk = [], [], []
    skey = iv_key[new_sess]
    while sid.size:
        nxt = cur + active
        # last packet before the timeout: end of the last interval starting before it, capped at it
        j = np.searchsorted(starts_c, sid * big + nxt, side="left") - 1
        ws.append(cur)
        wl.append(np.minimum(iv_end[j], nxt))
        wk.append(skey)
        k = np.searchsorted(ends_c, sid * big + nxt, side="right")
        alive = k <= sess_last[sid]
        k = np.minimum(k, len(iv_start) - 1)
        sid, skey = sid[alive], skey[alive]
        cur = np.maximum(nxt[alive], iv_start[k[alive]])
    wk, ws, wl = np.concatenate(wk), np.concatenate(ws), np.concatenate(wl)
    o = np.lexsort((ws, wk))
    return wk[o], ws[o], wl[o]


def _overlaps(key, a, b, wkey, wstart, big):
    """(transfer, window) pairs, one per window each transfer overlaps: (tid, win, windows per transfer)."""
    wc = wkey * big + wstart
    lo = np.searchsorted(wc, key * big + a, side="right") - 1
    hi = np.maximum(np.searchsorted(wc, key * big + b, side="left") - 1, lo)
    cnt = hi - lo + 1
    tid = np.repeat(np.arange(len(a)), cnt)
    win = np.repeat(lo, cnt) + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    return tid, win, cnt


def _spread(key, a, b, total, wkey, wstart, big):
    """Split each transfer's integer total over the windows it overlaps, in proportion to time."""
    tid, win, _ = _overlaps(key, a, b, wkey, wstart, big)
    nxt = np.where(win + 1 < len(wstart), wstart[np.minimum(win + 1, len(wstart) - 1)], np.iinfo(np.int64).max)
    upper = np.minimum(b[tid], nxt)
    span = np.maximum(b[tid] - a[tid], 1)
    frac = np.clip((upper - a[tid]) / span, 0.0, 1.0)
    last = np.r_[tid[1:] != tid[:-1], True]
    pieces = []
    for tot in total:
        cum = np.where(last, tot[tid], np.floor(tot[tid] * frac).astype(np.int64))
        prev = np.r_[0, cum[:-1]]
        prev[np.r_[True, tid[1:] != tid[:-1]]] = 0
        pieces.append(np.bincount(win, weights=cum - prev, minlength=len(wstart)).astype(np.int64))
    return pieces


def _window_flags(key, a, b, flags, packets, wkey, wstart, big, sampling: int) -> np.ndarray:
    """TCP flags per window: OR over the transfers it holds packets of, as the exporter ORs the flags of the
    packets it meets. Under 1-in-N sampling a transfer's flags count only if one of its packets in the
    window was sampled: a FIN (two packets) is seldom in a sampled record, so a record without FIN says
    nothing of the connection's end there."""
    tid, win, cnt = _overlaps(key, a, b, wkey, wstart, big)
    seen = np.ones(len(tid), dtype=bool)
    if sampling > 1:
        # its own stream, seeded by the transfers: the records' packet draws stay as they were
        rng = np.random.default_rng([len(a), int(b.sum() % (1 << 32)), 61])
        per_window = packets[tid] / cnt[tid]
        seen = rng.random(len(tid)) < 1.0 - (1.0 - 1.0 / sampling) ** per_window
    out = np.zeros(len(wstart), dtype=np.int64)
    np.bitwise_or.at(out, win[seen], flags[tid][seen])
    return out


def flow_records(tr: pl.DataFrame, *, capture: str, epoch_ns: int, active_timeout_s: float,
                 idle_timeout_s: float, sampling: int, mtu: int, exporter_offsets: dict[str, int],
                 rng: np.random.Generator) -> pa.Table:
    """Transfers -> flow records.

    Needs columns: src_addr, dst_addr (int), conn (int connection id), t0, t1 (int ns after epoch_ns),
    bytes, qps, sport (first source port), dport, protocol, exporter (str). Optional (sim.network.transport):
    pkts (packets when not ``ceil(bytes / mtu)``, e.g. ACKs without payload), hdr (header bytes per
    packet, default HEADER_BYTES), qpn (first destination QP: records get ``dst_qp``), tcp_flags (the flags
    of the transfer's packets, OR-ed: TCP records get ``tcp_flags``).
    Returns a flow table in the record-kind schema, job = ``capture``.
    """
    for col, default in (("pkts", None), ("hdr", HEADER_BYTES), ("qpn", None), ("tcp_flags", None)):
        if col not in tr.columns:
            tr = tr.with_columns(pl.lit(default, pl.Int64).alias(col))
    # TCP transfers without their own flags (background traffic) are mid-connection segments: PSH, ACK
    tr = tr.with_columns(pkts=pl.col("pkts").fill_null((pl.col("bytes") + mtu - 1) // mtu).cast(pl.Int64),
                         hdr=pl.col("hdr").fill_null(HEADER_BYTES),
                         tcp_flags=pl.when(pl.col("protocol") == 6).then(pl.col("tcp_flags").fill_null(PSH | ACK)))
    tr = tr.filter((pl.col("bytes") > 0) | (pl.col("pkts") > 0))
    if tr.height == 0:
        return to_kind(pl.DataFrame(), "flow")
    tr = tr.with_columns(key=pl.struct("src_addr", "dst_addr", "conn", "sport", "dport").rank("dense")
                         .cast(pl.Int64) - 1)
    tr = tr.sort("key", "t0")
    # traffic before the epoch (TCP connects at init): move the epoch back rather than go negative
    early = min(int(tr["t0"].min()), 0)
    if early:
        tr = tr.with_columns(pl.col("t0") - early, pl.col("t1") - early)
        epoch_ns += early
    key, a, b = (tr[c].to_numpy().astype(np.int64) for c in ("key", "t0", "t1"))
    b = np.maximum(a, b)
    packets = tr["pkts"].to_numpy()
    active = int(active_timeout_s * 1e9)
    big = int(b.max()) + active + 2
    wkey, ws, wl = _windows(key, a, b, active, int(idle_timeout_s * 1e9), big)
    payload, pkts = _spread(key, a, b, [tr["bytes"].to_numpy(), packets], wkey, ws, big)
    tcp = tr["tcp_flags"].is_not_null().to_numpy()
    wflags = _window_flags(key[tcp], a[tcp], b[tcp], tr["tcp_flags"].to_numpy()[tcp].astype(np.int64),
                           packets[tcp], wkey, ws, big, sampling)
    # records of connections that are no TCP (RoCE, UDP) carry no flags; every TCP packet but a SYN carries ACK
    tcp_key = np.zeros(int(key.max()) + 1, dtype=bool)
    tcp_key[key[tcp]] = True
    wflags = np.where(tcp_key[wkey], wflags | ACK, -1)
    info = tr.group_by("key").agg(pl.all().first()).sort("key")
    q = info["qps"].to_numpy()[wkey]
    rows = np.repeat(np.arange(len(wkey)), q)
    qp = np.arange(len(rows)) - np.repeat(np.cumsum(q) - q, q)
    qq = q[rows]
    pay = payload[rows] // qq + (qp < payload[rows] % qq)
    pk = pkts[rows] // qq + (qp < pkts[rows] % qq)
    wire = pay + pk * info["hdr"].to_numpy()[wkey][rows]
    if sampling > 1:
        kept = rng.binomial(pk, 1.0 / sampling)
        size = np.rint(kept * (wire / np.maximum(pk, 1))).astype(np.int64)
    else:
        kept, size = pk, wire
    keep = kept > 0
    k = wkey[rows]
    df = info[k[keep]].select("src_addr", "dst_addr", "dport", "protocol", "exporter", "sport", "qpn").with_columns(
        src_port=(pl.col("sport") + pl.Series(qp[keep])).cast(pl.Int32),
        dst_qp=pl.col("qpn") + pl.Series(qp[keep]),
        size_bytes=pl.Series(size[keep]), num_packets=pl.Series(kept[keep]),
        start_ns=pl.Series(ws[rows][keep]), end_ns=pl.Series(wl[rows][keep]),
        tcp_flags=pl.Series(wflags[rows][keep]))
    df = df.with_columns(tcp_flags=pl.when(pl.col("tcp_flags") >= 0).then(pl.col("tcp_flags")).cast(pl.Int32))
    off = pl.col("exporter").replace_strict(exporter_offsets, default=0, return_dtype=pl.Int64)
    df = df.with_columns(
        job=pl.lit(capture), source=pl.lit("simulator"), sampling_rate=pl.lit(sampling, pl.Int64),
        src_addr=int_to_addr(pl.col("src_addr")), dst_addr=int_to_addr(pl.col("dst_addr")),
        est_size_bytes=pl.col("size_bytes") * sampling, est_num_packets=pl.col("num_packets") * sampling,
        dst_port=pl.col("dport").cast(pl.Int32), start_ns=pl.col("start_ns") + epoch_ns + off,
        end_ns=pl.col("end_ns") + epoch_ns + off).sort("start_ns")
    return to_kind(df, "flow")
