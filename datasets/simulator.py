"""The job simulator with ground truth: the front door of ``rankscope.datasets``.

    from rankscope.datasets.simulator import SimConfig, Fault, simulate, simulate_fabric, write_store
    res = simulate(SimConfig(dp=4, pp=2, faults=(Fault("slow-worker", {"rank": 5, "factor": 1.5}),)))
    res.tables   # {kind: pyarrow.Table} in the record-kind schemas
    res.truth    # this job's entry of truth.json
    fab = simulate_fabric([cfg1, cfg2], background=True)   # several jobs on one fabric + storage noise
    write_store(res_or_fab, "out")                          # the trace store + out/truth.json

Timing comes from replaying the job's dependency graph with
:func:`rankscope.analysis.replay.engine.replay` (the engine the what-if analysis
uses): per-rank compute chains, asynchronous send/recv pairs that start
together, collectives that start when their last member arrives.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import field
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from rankscope.analysis.replay.engine import replay
from rankscope.collectors.errors import ConfigError, UsageError
from rankscope.collectors.record_class import record
from rankscope.collectors.schema import empty
from rankscope.collectors.store import ManifestEntry, Store
from rankscope.datasets.sim.job_config import Fault, SimConfig, parse_fault
from rankscope.datasets.sim.network.faults import check_network_fault
from rankscope.datasets.sim.network.flow_export import flow_records
from rankscope.datasets.sim.network.traffic import job_transfers
from rankscope.datasets.sim.network.transport import apply_transport, rank_exporters
from rankscope.datasets.sim.op_graph import (
    build_graph,
    build_templates,
    ops_per_step,
    sequence_lengths,
)
from rankscope.datasets.sim.realism import Realism, exporter_offsets, strip_layout, truncate_times
from rankscope.datasets.sim.records import (
    batch_table,
    comm_table,
    compute_table,
    endpoint_table,
    step_table,
)
from rankscope.datasets.sim.topology import build_topology, rail_exporter
from rankscope.datasets.truth import job_truth

__all__ = ["Fault", "Realism", "SimConfig", "SimResult", "FabricResult", "fabric_seed", "parse_fault", "simulate",
           "simulate_fabric",
           "write_store"]


@record(frozen=False)
class SimResult:
    """One simulated job."""

    config: SimConfig
    tables: dict[str, pa.Table]
    """record kind -> table; ``flow`` is present when ``config.flows`` (job column = the capture name)."""
    truth: dict
    """this job's entry of truth.json."""
    transfers: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    """inter-host transfers behind the flow records (int ns after the job's start_ns)."""

    def truth_file(self) -> dict:
        return {"capture": self.config.capture, "jobs": {self.config.job: self.truth}, "background": []}


@record(frozen=False)
class FabricResult:
    """Several jobs on one fabric, flows of all of them (plus background traffic) under one capture."""

    jobs: list[SimResult]
    flow: pa.Table
    truth: dict
    """the whole truth.json."""

    @property
    def tables(self) -> dict[str, pa.Table]:
        out = {}
        for r in self.jobs:
            for kind, t in r.tables.items():
                if kind != "flow":
                    out[kind] = pa.concat_tables([out[kind], t]) if kind in out else t
        out["flow"] = self.flow
        return out


def _clock_offsets(cfg: SimConfig, hosts: list[str], rng: np.random.Generator,
                   exporters: list[str]) -> tuple[dict, dict]:
    host_off = {h: 0 for h in hosts}
    exp_off = {}
    for f in cfg.faults_of("clock-skew"):
        p = cfg.fault_params(f)
        if p["host"] >= 0:
            if p["host"] >= len(hosts):
                raise UsageError(f"clock-skew host={p['host']}: job {cfg.job!r} has hosts 0..{len(hosts) - 1}")
            host_off[hosts[p["host"]]] = int(round(p["offset_ms"] * 1e6))
        else:
            for h in hosts:
                host_off[h] = int(round(rng.uniform(-p["max_ms"], p["max_ms"]) * 1e6))
        if p["exporter_max_ms"] > 0:
            names = ([rail_exporter(g) for g in range(cfg.gpus_per_host)] if not cfg.realism.hosts_per_pod
                     else exporters)
            for e in names:
                exp_off[e] = int(round(rng.uniform(-1, 1) * p["exporter_max_ms"] * 1e6))
    return host_off, exp_off


CHUNK_OPS = 1_500_000
"""Ops replayed at once: a job is simulated in chunks of whole steps to bound memory."""


def _check_network_faults(cfg: SimConfig) -> None:
    """Faults that need the job's topology (a NIC's backup rail, a DP group to join) are checked here, not in
    SimConfig: the topology is built from the config."""
    for f in cfg.faults:
        if f.kind in ("dead-link", "misgrouped"):
            p = cfg.fault_params(f)
            ok, what = check_network_fault(cfg, f.kind, p)
            if not ok:
                raise ConfigError(f"fault {f.kind} in job {cfg.job!r}: {what} (params {p})")


def _simulate_job(cfg: SimConfig, job_index: int = 0, epoch_ns: int | None = None) -> SimResult:
    _check_network_faults(cfg)
    topo = build_topology(cfg)
    rng = np.random.default_rng(cfg.seed)
    T = build_templates(cfg)
    seq_table = sequence_lengths(cfg, rng)
    hosts = [topo.host_name(int(h)) for h in np.unique(topo.host)]
    exporters = list(dict.fromkeys(rank_exporters(cfg, topo).to_list()))
    host_off, exp_off = _clock_offsets(cfg, hosts, np.random.default_rng([cfg.seed, 11]), exporters)
    if cfg.realism.exporter_offset_ms > 0 and epoch_ns is None:
        exp_off = _add(exp_off, exporter_offsets(exporters, cfg.realism.exporter_offset_ms, cfg.seed))
    traffic_rng = np.random.default_rng([cfg.seed, 43])
    base = cfg.start_ns + np.array([host_off[topo.host_name(int(h))] for h in topo.host], dtype=np.int64)
    per_chunk = max(1, CHUNK_OPS // ops_per_step(T, topo))
    parts: dict[str, list[pa.Table]] = {k: [] for k in ("comm_op", "compute_op", "step_mark", "batch_meta")}
    transfers, step_end, t_first = [], np.full(cfg.steps, np.nan), None
    tail_end = np.zeros(topo.world)
    want_transfers = cfg.flows or epoch_ns is not None
    for step0 in range(0, cfg.steps, per_chunk):
        g = build_graph(cfg, topo, rng, T, seq_table, step0, min(per_chunk, cfg.steps - step0))
        n = len(g.duration)
        # Later chunks start where the previous one ended: one zero-length anchor op per rank.
        anchors = step0 > 0
        rep = replay(np.r_[g.duration, np.zeros(topo.world)] if anchors else g.duration,
                     np.r_[g.src, n + g.entry_rank] if anchors else g.src,
                     np.r_[g.dst, g.entry_dst] if anchors else g.dst,
                     launch_delay=np.r_[g.delay, np.zeros(topo.world)] if anchors else g.delay,
                     sync_group=np.r_[g.sync, -np.ones(topo.world, dtype=np.int64)] if anchors else g.sync,
                     release=np.r_[np.zeros(n), tail_end] if anchors else None)
        ready, start, end = rep.ready[:n], rep.start[:n], rep.end[:n]
        tail_end = end[g.tail_op]
        if t_first is None:
            t_first = float(np.min(ready[np.isfinite(ready)])) if np.isfinite(ready).any() else 0.0
        steps, chunk_end = step_table(cfg, g, ready, end, base)
        step_end = np.fmax(step_end, chunk_end)
        parts["comm_op"].append(comm_table(cfg, topo, g, T, ready, end, base))
        parts["compute_op"].append(compute_table(cfg, topo, g, T, start, end, base))
        parts["step_mark"].append(steps)
        parts["batch_meta"].append(batch_table(cfg, topo, g, T, ready))
        if want_transfers:
            transfers.append(job_transfers(cfg, topo, g, T, start, end, job_index,
                                           cfg.start_ns if epoch_ns is None else epoch_ns, traffic_rng, ready))
        del g, rep, ready, start, end
    tables = {k: pa.concat_tables(v) for k, v in parts.items()}
    tables["endpoint_map"] = endpoint_table(cfg, topo)
    if cfg.realism.kineto_records:
        tables = strip_layout(tables)
    step_end = np.where(np.isnan(step_end), np.inf, step_end)
    truth = job_truth(cfg, topo, T, step_end, t_first or 0.0, host_off, exp_off)
    transfers = pl.concat([t for t in transfers if t.height], how="vertical_relaxed") if any(
        t.height for t in transfers) else pl.DataFrame()
    transfers = apply_transport(transfers, cfg, topo)
    if cfg.flows and epoch_ns is None:
        tables["flow"] = _flows(transfers, cfg, cfg.start_ns, exp_off, rng)
    return SimResult(cfg, tables, truth, transfers)


def _add(a: dict, b: dict) -> dict:
    return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}


def _flows(transfers: pl.DataFrame, cfg: SimConfig, epoch_ns: int, exp_off: dict, rng) -> pa.Table:
    if transfers.height == 0:
        return empty("flow")
    flow = flow_records(transfers, capture=cfg.capture, epoch_ns=epoch_ns, active_timeout_s=cfg.active_timeout_s,
                        idle_timeout_s=cfg.idle_timeout_s, sampling=cfg.sampling, mtu=cfg.realism.mtu or cfg.mtu,
                        exporter_offsets=exp_off, rng=rng)
    return truncate_times(flow, cfg.realism.timestamp_ns)


def simulate(cfg: SimConfig) -> SimResult:
    """Simulate one job; flow records (if ``cfg.flows``) go under ``cfg.capture``."""
    if not isinstance(cfg, SimConfig):
        raise UsageError(f"simulate() takes a SimConfig, got {type(cfg).__name__}")
    return _simulate_job(cfg)


def fabric_seed(configs: list[SimConfig]) -> int:
    """The fabric's random stream (background, sampling, exporter clocks) keyed by its jobs' seeds,
    so that two corpora with different job seeds never share it."""
    return int(np.random.SeedSequence([c.seed for c in configs] + [len(configs)]).generate_state(1)[0])


def simulate_fabric(configs: list[SimConfig], *, background: bool = True, capture: str = "fabric",
                    seed: int | None = None, realism: Realism | None = None) -> FabricResult:
    """Several jobs on one rail-optimised fabric, placed on consecutive hosts.

    Jobs are simulated independently (no contention between them), their
    transfers are exported together under ``capture``; ``background`` adds
    storage reads, checkpoint writes and rendezvous chatter (truth
    ``background``). Job names must differ. ``seed`` (default: from the jobs'
    seeds, see :func:`fabric_seed`) drives the fabric's own randomness.
    ``realism`` holds the fabric-wide options (timestamp resolution, exporter
    clock offsets, wild background; default: the first job's); transport,
    pods, rail jitter and ranks per address stay each job's own.
    """
    from rankscope.datasets.sim.network.background import background_transfers
    from rankscope.datasets.sim.network.noise import wild_background

    names = [c.job for c in configs]
    if not configs or len(set(names)) != len(names):
        raise UsageError(f"simulate_fabric needs one or more jobs with distinct names, got {names}")
    seed = fabric_seed(configs) if seed is None else seed
    fab = realism or configs[0].realism
    placed, host = [], 0
    for c in configs:
        placed.append(dataclasses.replace(c, host_offset=host, capture=capture, flows=True))
        host += -(-c.world_size // c.gpus_per_host)
    epoch = min(c.start_ns for c in placed)
    results = [_simulate_job(c, i, epoch) for i, c in enumerate(placed)]
    transfers = [r.transfers for r in results if r.transfers.height]
    bg_truth: list[dict] = []
    if background:
        make = wild_background if fab.wild_background else background_transfers
        kw = {"first_free_host": host, "hosts_per_pod": fab.hosts_per_pod} if fab.wild_background else {}
        bg, bg_truth = make(results, epoch, np.random.default_rng([seed, 23]), **kw)
        if bg.height:
            transfers.append(bg)
    exp_off: dict = {}
    for r in results:
        exp_off.update(r.truth["exporter_offsets_ns"])
    if fab.exporter_offset_ms > 0 and transfers:
        present = pl.concat([t.select("exporter") for t in transfers])["exporter"].unique().to_list()
        exp_off = _add(exp_off, exporter_offsets(present, fab.exporter_offset_ms, seed))
        for r in results:
            r.truth["exporter_offsets_ns"] = {e: exp_off.get(e, 0) for e in r.truth["exporters"]}
    rng = np.random.default_rng([seed, 29])
    first = placed[0]
    flow = (flow_records(pl.concat(transfers, how="diagonal_relaxed"), capture=capture, epoch_ns=epoch,
                         active_timeout_s=first.active_timeout_s, idle_timeout_s=first.idle_timeout_s,
                         sampling=first.sampling, mtu=first.mtu, exporter_offsets=exp_off, rng=rng)
            if transfers else empty("flow"))
    flow = truncate_times(flow, fab.timestamp_ns)
    truth = {"capture": capture, "jobs": {r.config.job: r.truth for r in results}, "background": bg_truth,
             "fabric": {"seed": seed, "timestamp_ns": fab.timestamp_ns, "exporter_offsets_ns": exp_off}}
    return FabricResult(results, flow, truth)


def write_store(res: SimResult | FabricResult, out_dir: str | os.PathLike) -> Path:
    """Write the record tables into a trace store at ``out_dir`` and ``out_dir/truth.json``.

    Each job goes in one transaction, as an ingest does: nothing of it is visible before its manifest entry,
    a failure (a full disk) leaves nothing of that job, and a retry replaces a job an earlier try committed."""
    import pyarrow.compute as pc

    out = Path(out_dir)
    store = Store(out)
    truth = res.truth_file() if isinstance(res, SimResult) else res.truth
    counts: dict[str, dict[str, int]] = {}
    for kind, table in res.tables.items():
        if table.num_rows:
            for job, n in pl.from_arrow(table.select(["job"]))["job"].value_counts().iter_rows():
                counts.setdefault(job, {})[kind] = counts.get(job, {}).get(kind, 0) + n
    for job, recs in counts.items():
        key = Store.manifest_key(f"simulator:{json.dumps(truth['jobs'].get(job, {}).get('seed'))}:{job}", job)
        with store.transaction(key, replace=True) as tx:  # a retry replaces what an earlier try committed
            for kind in recs:
                table = res.tables[kind]
                tx.write(kind, table.filter(pc.equal(table.column("job"), job)) if len(counts) > 1 else table)
            tx.commit(ManifestEntry(key=key, source="rankscope simulate", format="simulator", job=job,
                                    records=recs))
    out.mkdir(parents=True, exist_ok=True)
    _atomic_text(out / "truth.json", json.dumps(truth, indent=1))
    return out


def _atomic_text(path: Path, text: str) -> None:
    """Write to a temporary name beside ``path`` and rename: a full disk never leaves half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
