"""Non-training traffic on a shared fabric: storage reads, checkpoint writes, rendezvous chatter.

Every job's hosts talk TCP from their GPU-0 NIC: the c10d rendezvous store
on the job's rank-0 NIC (port 29500, a few KB at start-up and a heartbeat per
step), NFS reads of training data from a storage server every step (port
2049, ``read_mb`` per host), and one checkpoint write (``ckpt_mb`` per host)
after the middle step. Storage servers sit behind their own leaf
(``10.255.100.1/0``); hosts' traffic is exported by the rail-0 leaf.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.datasets.sim.topology import STORAGE_EXPORTER, rail_exporter

STORAGE_SERVERS = ("10.200.0.1", "10.200.0.2")
NFS_PORT, RDZV_PORT = 2049, 29500


def _ip(addr: str) -> int:
    a, b, c, d = (int(x) for x in addr.split("."))
    return (a << 24) + (b << 16) + (c << 8) + d


def background_transfers(results, epoch_ns: int, rng: np.random.Generator, *, read_mb: float = 64.0,
                         ckpt_mb: float = 2048.0, storage_gbps: float = 100.0) -> tuple[pl.DataFrame, list[dict]]:
    """Transfers (same columns as sim.network.traffic.job_transfers) and their truth.json ``background`` entries."""
    rows = {k: [] for k in ("src_addr", "dst_addr", "conn", "t0", "t1", "bytes", "sport", "dport", "exporter")}
    truth = []
    bps = storage_gbps / 8.0  # bytes per ns

    def add(src, dst, t0, nbytes, sport, dport, exporter, conn):
        rows["src_addr"].append(_ip(src))
        rows["dst_addr"].append(_ip(dst))
        rows["conn"].append(conn)
        rows["t0"].append(int(t0))
        rows["t1"].append(int(t0 + nbytes / bps))
        rows["bytes"].append(int(nbytes))
        rows["sport"].append(sport)
        rows["dport"].append(dport)
        rows["exporter"].append(exporter)

    conn = 1 << 40
    for r in results:
        t = r.truth
        if not t["step_times_ns"]:
            continue
        hosts = sorted(t["hosts"])
        nic0 = {h: t["endpoints"][str(t["hosts"][h][0])] for h in hosts}
        master = t["endpoints"]["0"]
        t_start = t["start_ns"] - epoch_ns
        step_end = t_start + np.cumsum(t["step_times_ns"])
        step_start = np.r_[t_start, step_end[:-1]]
        server = {h: STORAGE_SERVERS[i % len(STORAGE_SERVERS)] for i, h in enumerate(hosts)}
        for i, h in enumerate(hosts):
            port = 40000 + i % 20000
            conn += 1
            if nic0[h] != master:
                add(nic0[h], master, t_start + rng.uniform(0, 1e6), 4096, port, RDZV_PORT,
                    rail_exporter(0), conn)
                for s in step_start[1:]:
                    add(nic0[h], master, s + rng.uniform(0, 1e5), 256, port, RDZV_PORT, rail_exporter(0), conn)
            conn += 1
            for s in step_start:
                add(server[h], nic0[h], s + rng.uniform(0, 2e6), read_mb * 2**20, NFS_PORT, port + 1,
                    STORAGE_EXPORTER, conn)
            conn += 1
            mid = step_end[len(step_end) // 2]
            add(nic0[h], server[h], mid + rng.uniform(0, 1e6), ckpt_mb * 2**20, port + 2, NFS_PORT,
                rail_exporter(0), conn)
        job = r.config.job
        truth += [
            {"kind": "rendezvous", "job": job, "clients": [nic0[h] for h in hosts if nic0[h] != master],
             "server": master, "protocol": 6, "port": RDZV_PORT},
            {"kind": "storage", "job": job, "clients": [nic0[h] for h in hosts], "servers": list(STORAGE_SERVERS),
             "protocol": 6, "port": NFS_PORT, "bytes_per_host_per_step": int(read_mb * 2**20)},
            {"kind": "checkpoint", "job": job, "clients": [nic0[h] for h in hosts],
             "servers": list(STORAGE_SERVERS), "protocol": 6, "port": NFS_PORT,
             "after_step": int(len(step_end) // 2), "bytes_per_host": int(ckpt_mb * 2**20)},
        ]
    n = len(rows["t0"])
    df = pl.DataFrame({**rows, "qps": [1] * n, "protocol": [6] * n},
                      schema_overrides={"src_addr": pl.Int64, "dst_addr": pl.Int64, "conn": pl.Int64,
                                        "t0": pl.Int64, "t1": pl.Int64, "bytes": pl.Int64, "sport": pl.Int64,
                                        "dport": pl.Int64})
    return df, truth
