"""Non-training traffic as a shared production fabric carries it, on arbitrary ports.

Where :mod:`sim.network.background` uses the well-known ports (NFS 2049, c10d 29500)
from GPU-0 NICs only, this models what a cluster's other tenants and services
put on the same rails, so that nothing can be classified by port or address
block:

- **storage reads**: a parallel file system's servers (hosts of their own on
  the rails, after the jobs) serve each job host's data loader over 1-4 TCP
  streams per host, on a port drawn per file system, in bursts whose phase
  drifts against the step;
- **checkpoints**: at one or two steps every host writes its shard over 4-8
  parallel streams from several NICs to the object store's port;
- **replication**: storage servers copy each write to the next two servers
  (chain replication), in chunks with their own period, over TCP or RoCE
  (UDP 4791, like NVMe-oF/RDMA), so it forms a heavy, periodic, connected set;
- **monitoring**: a collector scrapes every host every 10-15 s (small);
- **rendezvous/heartbeats**: each host to its job's master on a job-chosen port.

TCP streams get their ACK flows back. Returns transfers (the columns of
sim.network.traffic.job_transfers) and truth.json ``background`` entries.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.datasets.sim.network.flow_export import HEADER_BYTES, ROCE_PORT
from rankscope.datasets.sim.network.transport import TCP_HEADER_BYTES
from rankscope.datasets.sim.realism import exporter_name
from rankscope.datasets.sim.topology import nic_address


def _ip(addr: str) -> int:
    a, b, c, d = (int(x) for x in addr.split("."))
    return (a << 24) + (b << 16) + (c << 8) + d


class _Rows:
    def __init__(self, hosts_per_pod: int):
        self.rows: list[tuple] = []
        self.conn = 1 << 44
        self.hpp = hosts_per_pod

    def exporter(self, addr: str) -> str:
        _, rail, hi, lo = (int(x) for x in addr.split("."))
        return exporter_name(rail, hi * 250 + lo - 1, self.hpp)

    def stream(self, src, dst, t0, nbytes, gbps, sport, dport, tcp=True):
        """One transfer (plus its ACKs on TCP), ``nbytes`` at ``gbps``."""
        self.conn += 1
        t1 = t0 + nbytes / (gbps / 8.0)
        hdr = TCP_HEADER_BYTES if tcp else HEADER_BYTES
        proto = 6 if tcp else 17
        self.rows.append((_ip(src), _ip(dst), self.conn, int(t0), int(t1), int(nbytes), None, hdr, sport, dport,
                          proto, self.exporter(src)))
        if tcp:
            acks = max(int(nbytes // 8948 // 2), 1)
            self.rows.append((_ip(dst), _ip(src), self.conn, int(t0 + 8e3), int(t1 + 8e3), 0, acks, hdr, dport,
                              sport, proto, self.exporter(dst)))

    def frame(self) -> pl.DataFrame:
        cols = ("src_addr", "dst_addr", "conn", "t0", "t1", "bytes", "pkts", "hdr", "sport", "dport", "protocol",
                "exporter")
        data = {c: [r[i] for r in self.rows] for i, c in enumerate(cols)}
        df = pl.DataFrame(data, schema={c: (pl.String if c == "exporter" else pl.Int64) for c in cols})
        return df.with_columns(qps=pl.lit(1, pl.Int64))


def _port(rng) -> int:
    return int(rng.integers(1024, 65536))


def wild_background(results, epoch_ns: int, rng: np.random.Generator, *, first_free_host: int,
                    hosts_per_pod: int = 0, servers: int | None = None) -> tuple[pl.DataFrame, list[dict]]:
    """Storage, checkpoint, replication, monitoring and rendezvous traffic of the jobs in ``results``."""
    out = _Rows(hosts_per_pod)
    n_srv = int(servers or rng.integers(3, 7))
    srv_hosts = first_free_host + np.arange(n_srv)
    storage = [nic_address(int(h), int(i % 2)) for i, h in enumerate(srv_hosts)]
    monitor = nic_address(int(first_free_host + n_srv), 0)
    fs_port, obj_port, repl_port, scrape_port = (_port(rng) for _ in range(4))
    repl_tcp = bool(rng.random() < 0.5)
    truth: list[dict] = []
    t_end = 0.0
    for r in results:
        t = r.truth
        if not t["step_times_ns"]:
            continue
        host_nics = {h: sorted({t["endpoints"][str(k)] for k in ranks}) for h, ranks in t["hosts"].items()}
        master = t["endpoints"]["0"]
        start = t["start_ns"] - epoch_ns
        step_end = start + np.cumsum(t["step_times_ns"])
        step_start = np.r_[start, step_end[:-1]]
        period = float(np.median(t["step_times_ns"]))
        t_end = max(t_end, float(step_end[-1]))
        rdzv_port = _port(rng)
        clients = []
        for nics in host_nics.values():
            nic = nics[int(rng.integers(len(nics)))]
            clients.append(nic)
            srv = storage[int(rng.integers(n_srv))]
            streams = int(rng.integers(1, 5))
            drift = rng.uniform(0.2, 1.5)
            per = rng.lognormal(np.log(32 * 2**20), 0.6)
            for k, s in enumerate(step_start):
                t0 = s + (k * drift * period / 3) % period
                for _ in range(streams):
                    out.stream(srv, nic, t0 + rng.uniform(0, 2e5), per / streams, rng.uniform(10, 50),
                               fs_port, 40000 + int(rng.integers(20000)))
            if nic != master:
                sport = 40000 + int(rng.integers(20000))
                out.stream(nic, master, start + rng.uniform(0, 1e6), 4096, 1.0, sport, rdzv_port)
                for s in step_start[1:]:
                    out.stream(nic, master, s + rng.uniform(0, period), 300, 1.0, sport, rdzv_port)
        ck_steps = sorted(set(rng.integers(0, len(step_end), size=int(rng.integers(1, 3))).tolist()))
        shard = rng.lognormal(np.log(1.5 * 2**30), 0.4)
        for k in ck_steps:
            for nics in host_nics.values():
                par = int(rng.integers(4, 9))
                for j in range(par):
                    out.stream(nics[j % len(nics)], storage[int(rng.integers(n_srv))],
                               step_end[k] + rng.uniform(0, 5e6), shard / par, rng.uniform(20, 80),
                               40000 + int(rng.integers(20000)), obj_port)
        truth += [
            {"kind": "storage", "job": t.get("job", r.config.job), "clients": sorted(set(clients)),
             "servers": storage, "protocol": 6, "port": fs_port},
            {"kind": "checkpoint", "job": r.config.job, "clients": sorted({a for v in host_nics.values() for a in v}),
             "servers": storage, "protocol": 6, "port": obj_port, "after_steps": ck_steps},
            {"kind": "rendezvous", "job": r.config.job, "server": master, "protocol": 6, "port": rdzv_port,
             "clients": sorted(set(clients) - {master})},
        ]
    # chain replication between the storage servers, on its own period
    chunk, every = rng.lognormal(np.log(64 * 2**20), 0.5), rng.uniform(0.05, 0.5) * 1e9
    t = rng.uniform(0, every)
    while t < t_end:
        for i in range(n_srv):
            for hop in (1, 2):
                out.stream(storage[i], storage[(i + hop) % n_srv], t + rng.uniform(0, 1e6), chunk / 2,
                           rng.uniform(25, 100), repl_port if repl_tcp else 49152 + i, repl_port if repl_tcp
                           else ROCE_PORT, tcp=repl_tcp)
        t += every * rng.uniform(0.8, 1.2)
    all_hosts = sorted({a for r in results for a in r.truth["endpoints"].values()})
    scrape = rng.uniform(10, 15) * 1e9
    t = rng.uniform(0, scrape)
    while t < t_end:
        for a in all_hosts[:: max(1, len(all_hosts) // 256)]:
            out.stream(monitor, a, t + rng.uniform(0, 1e7), 600, 1.0, 40000 + int(rng.integers(20000)), scrape_port)
            out.stream(a, monitor, t + rng.uniform(1e7, 2e7), 60_000, 1.0, scrape_port, 41000)
        t += scrape
    truth += [{"kind": "replication", "servers": storage, "protocol": 6 if repl_tcp else 17,
               "port": repl_port if repl_tcp else ROCE_PORT},
              {"kind": "monitoring", "server": monitor, "protocol": 6, "port": scrape_port}]
    if not out.rows:
        return pl.DataFrame(), truth
    return out.frame(), truth
