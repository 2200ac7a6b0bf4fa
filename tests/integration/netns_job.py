"""Run the shared DP x PP training job across network namespaces and collect its flows.

:func:`run_netns_job` builds a small fabric: one network namespace per node,
each joined to a Linux bridge by a veth pair, runs ``tests/jobs/train_dp_pp.py``
with ``torchrun --nnodes=N --node_rank=K`` inside each namespace (gloo over the
namespace's veth), runs Debian's ``softflowd`` on the bridge exporting IPFIX to
``rankscope collect flows`` on 127.0.0.1, and tears everything down again
(also when something fails). It returns the store with the collected flows,
the job's own record of the communication calls it issued, and the endpoint
map (address -> rank), so tests of flow-based strategy inference can reuse a
real capture:

    from tests.integration.netns_job import netns_skip_reason, run_netns_job
    res = run_netns_job(tmp_path)         # ~30-60 s on a 2-core machine
    res.store, res.comm, res.endpoints, res.master_port

The bridge is made to flood every frame (``ageing_time 0``), so the bridge
device itself sees all traffic between the namespaces exactly once, and GSO
is capped at 1500 bytes on every veth so softflowd sees wire-sized packets
(it under-counts 64 KiB GSO super-packets).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.integration.netns_fabric import Fabric, free_port, sh, stop_process
from tests.integration.netns_meters import (
    EXPORTERS,
    Meter,
    expire_softflowd,
    ingest_files,
    start_collector,
    start_meter,
    stop_collectors,
)

REPO = Path(__file__).resolve().parents[2]
JOB_SCRIPT = REPO / "tests" / "jobs" / "train_dp_pp.py"
BIN = Path(sys.executable).parent


def netns_skip_reason() -> str | None:
    """Why the namespaced job cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root for ip netns"
    for tool in ("ip", "softflowd"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    if not JOB_SCRIPT.is_file():
        return f"{JOB_SCRIPT} missing"
    if not (BIN / "torchrun").exists():
        return "torchrun not in the virtualenv"
    probe = f"rsprobe{secrets.token_hex(3)}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode:
        return "ip netns add failed (no privilege for network namespaces)"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class NetnsJobResult:
    store: Path
    """trace store holding the collected flows (job ``flow_job``)."""
    flow_job: str
    comm: list[dict]
    """every call the job issued: rank, op, group_ranks, peer, size_bytes, dtype, step."""
    endpoints: dict[str, int]
    """node address -> global rank (one rank per namespace)."""
    master_addr: str
    master_port: int
    ranks: dict[int, dict] = field(default_factory=dict)
    """the job's own rank<r>.json outputs."""
    collector_output: str = ""
    job_seconds: float = 0.0
    softflowd_stats: dict = field(default_factory=dict)
    """softflowd's own figures (softflowctl statistics after expire-all): packets received / dropped by
    libpcap and by the interface, flows and records exported, export packets and failures."""
    mtu: int = 1500
    """MTU of the namespaces' veths (TCP segments on the wire are at most this many IP bytes)."""
    tcp_timestamps: bool = True
    """whether the namespaces' TCP uses timestamps (12 more header bytes per segment)."""


def parse_softflowd_stats(text: str) -> dict:
    """The figures of ``softflowctl statistics`` this test needs, as integers (missing ones absent)."""
    import re

    pats = {
        "packets_processed": r"Packets processed: (\d+)",
        "libpcap_received": r"Packets received by libpcap: (\d+)",
        "libpcap_dropped": r"Packets dropped by libpcap: (\d+)",
        "interface_dropped": r"Packets dropped by interface: (\d+)",
        "ignored": r"Ignored packets: (\d+)",
        "flows_exported": r"Flows exported: (\d+)",
        "records_exported": r"Flows exported: \d+ \((\d+) records\)",
        "export_packets": r"records\) in (\d+) packets",
        "export_failures": r"packets \((\d+) failures\)",
    }
    out = {}
    for k, pat in pats.items():
        m = re.search(pat, text)
        if m:
            out[k] = int(m.group(1))
    return out


def run_netns_job(workdir: Path, nodes: int = 4, steps: int = 4, hidden: int = 256, microbatch_size: int = 32,
                  job_args: tuple[str, ...] = (), timeout_s: float = 240.0,
                  softflowd_buffer_bytes: int = 64 << 20) -> NetnsJobResult:
    """Run the job on ``nodes`` namespaces (one rank each, DP x PP with --pp 2) and collect its flows.

    softflowd gets a ``softflowd_buffer_bytes`` libpcap buffer (``-B``) so that its own capture keeps
    up on a loaded machine; what it still drops is read back from its statistics, apart from ours.
    """
    workdir = Path(workdir)
    store, out, logs = workdir / "store", workdir / "job", workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    master_port = 29500 + secrets.randbelow(2000)
    meter = Meter("softflowd", store, free_port())
    procs: list[subprocess.Popen] = []
    with Fabric(nodes) as fab:
        try:
            start_collector(meter, "127.0.0.1", BIN / "rankscope")
            start_meter(meter, fab.bridge, workdir, logs, ("maxlife=2", "expint=1"),
                        softflowd_buffer_bytes=softflowd_buffer_bytes)
            time.sleep(1.0)  # softflowd opens its capture before the job's first packet
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
            t0 = time.monotonic()
            for k, (ns, inner) in enumerate(zip(fab.namespaces, fab.ns_ends)):
                cmd = ["ip", "netns", "exec", ns, "env", f"GLOO_SOCKET_IFNAME={inner}",
                       str(BIN / "torchrun"), f"--nnodes={nodes}", f"--node_rank={k}", "--nproc_per_node=1",
                       f"--master_addr={fab.addresses[0]}", f"--master_port={master_port}",
                       str(JOB_SCRIPT), "--steps", str(steps), "--hidden", str(hidden), "--pp", "2",
                       "--microbatch-size", str(microbatch_size),
                       "--out", str(out), "--pg-timeout-s", "60", *job_args]
                procs.append(subprocess.Popen(cmd, env=env, stdout=open(logs / f"node{k}.log", "w"),
                                              stderr=subprocess.STDOUT))
            deadline = time.monotonic() + timeout_s
            for k, p in enumerate(procs):
                try:
                    rc = p.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise RuntimeError(f"node {k} did not finish in {timeout_s} s; logs in {logs}") from None
                if rc:
                    raise RuntimeError(f"node {k} exited {rc}: {(logs / f'node{k}.log').read_text()[-2000:]}")
            job_seconds = time.monotonic() - t0
            expire_softflowd([meter.ctl])
            stats = subprocess.run(["softflowctl", "-c", str(meter.ctl), "statistics"], capture_output=True,
                                   text=True, timeout=10).stdout
            (logs / "softflowd.stats").write_text(stats)
            mtu = int(sh("ip", "netns", "exec", fab.namespaces[0], "cat",
                          f"/sys/class/net/{fab.ns_ends[0]}/mtu").stdout)
            tcp_ts = sh("ip", "netns", "exec", fab.namespaces[0], "cat",
                         "/proc/sys/net/ipv4/tcp_timestamps").stdout.strip() != "0"
            stop_collectors([meter])
        finally:
            for p in procs:
                stop_process(p, signal.SIGKILL, 5)
            stop_process(meter.proc)
            stop_process(meter.collector)
    ranks = {}
    for f in sorted(out.glob("rank*.json")):
        r = json.loads(f.read_text())
        ranks[r["rank"]] = r
    comm = [dict(c, rank=r) for r, res in ranks.items() for c in res.get("issued", [])]
    return NetnsJobResult(store=store, flow_job="fabric", comm=comm,
                          endpoints={addr: k for k, addr in enumerate(fab.addresses)},
                          master_addr=fab.addresses[0], master_port=master_port, ranks=ranks,
                          collector_output=meter.output, job_seconds=job_seconds,
                          softflowd_stats=parse_softflowd_stats(stats), mtu=mtu, tcp_timestamps=tcp_ts)


_CACHE: dict[str, NetnsJobResult] = {}


def shared_netns_run(tmp_root: Path) -> NetnsJobResult:
    """One namespaced run per test session, shared by every test that asks (it takes a minute or two)."""
    if "run" not in _CACHE:
        _CACHE["run"] = run_netns_job(Path(tmp_root) / "netns-job")
    return _CACHE["run"]


def expected_directed_bytes(comm: list[dict]) -> dict[tuple[int, int], int]:
    """Payload bytes each rank sends to each other rank, from the job's own comm records.

    send: size to the peer. all_reduce over a group of two (the job's DP
    groups): gloo's ring sends half the buffer in the reduce-scatter and half
    in the all-gather, so each member sends the whole size to the other.
    Larger groups are not modelled (the test runs DP 2).
    """
    out: dict[tuple[int, int], int] = {}
    for c in comm:
        r = c["rank"]
        if c["op"] == "send":
            out[(r, c["peer"])] = out.get((r, c["peer"]), 0) + c["size_bytes"]
        elif c["op"] == "all_reduce":
            members = [m for m in c["group_ranks"] if m != r]
            if len(members) != 1:
                raise ValueError(f"all_reduce over {c['group_ranks']}: only groups of two are modelled")
            out[(r, members[0])] = out.get((r, members[0]), 0) + c["size_bytes"]
    return out


# --- rank placement: several ranks per namespace, any node order, any layout (helper `netns`) ---


@dataclass
class PlacedNetnsJobResult(NetnsJobResult):
    address_ranks: dict[str, list[int]] = field(default_factory=dict)
    """node address -> the global ranks it hosts (``ranks_per_node`` of them)."""
    stage_of_address: dict[str, int] = field(default_factory=dict)
    """node address -> pipeline stage of its ranks, from the job's own outputs."""
    throttled_ns: dict[int, int] = field(default_factory=dict)
    """namespace -> when its NIC was throttled mid-run (``throttle``; Unix epoch ns, after the tc calls)."""
    progress: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """rank -> (step, wall-clock end ns) of each step it ended (with ``throttle`` or ``watch_args``)."""
    watch_events: list[dict] = field(default_factory=list)
    """the events ``rankscope watch`` wrote beside the job (``watch_args``), one dict per window."""
    watch_output: str = ""
    leaf_exporters: dict[str, str] = field(default_factory=dict)
    """with ``second_bridge``: leaf (``"A"``, ``"B"``) -> the management address its meter exports from."""
    rerouted: str | None = None
    """with ``reroute``: the address of the namespace whose traffic enters the fabric at leaf B."""
    stores: dict[str, Path] = field(default_factory=dict)
    """exporter -> the store its collector wrote (``exporter``'s and each of ``also_exporters``')."""
    collector_outputs: dict[str, str] = field(default_factory=dict)


def run_placed_netns_job(workdir: Path, nodes: int, ranks_per_node: int = 1, pp: int = 2, tp: int = 1,
                         node_order: list[int] | None = None, steps: int = 4, hidden: int = 256,
                         microbatch_size: int = 32, step_sleep_ms: float = 0.0,
                         flow_timeouts: tuple[str, ...] = ("maxlife=2", "expint=1"), lazy_connect: bool = False,
                         job_args: tuple[str, ...] = (), timeout_s: float = 240.0,
                         nic_rates: dict[int, str] | None = None, exporter: str = "softflowd",
                         nfpcapd_expire: tuple[int, int] = (2, 1), sflow_sampling: int = 16,
                         exit_sleep_s: float = 0.0, throttle: dict[int, tuple[str, int]] | None = None,
                         watch_args: tuple[str, ...] | None = None, second_bridge: bool = False,
                         reroute: int | None = None, also_exporters: tuple[str, ...] = ()) -> PlacedNetnsJobResult:
    """Like :func:`run_netns_job`, with the placement of ranks chosen by the caller.

    ``ranks_per_node`` processes run in each namespace (they share its address;
    torchrun numbers them node_rank * ranks_per_node + local rank, so with
    ``--tp ranks_per_node`` a TP group sits on one address and its traffic
    never reaches the bridge). ``node_order[k]`` is the node rank of namespace
    k, so address order need not follow rank or stage order. ``flow_timeouts``
    are softflowd's ``-t`` settings; with an idle timeout shorter than
    ``step_sleep_ms`` every step's records start at that step's first packet.
    ``nic_rates[k]`` (a tc rate such as ``"50mbit"``) makes namespace k's NIC slow, both ways.
    ``exporter="nfpcapd"`` meters the bridge with nfdump's own ``nfpcapd`` instead (another flow cache:
    active and inactive expiry ``nfpcapd_expire`` seconds, its files read back with ``nfdump -o json``
    and ingested as a user would), so the inference meets a second exporter's way of cutting records;
    ``"pmacct-sflow"`` runs pmacct's ``pmacctd`` with its sFlow probe (1 packet in ``sflow_sampling``),
    ``"pmacct-ipfix"`` with its IPFIX probe (``flow_timeouts`` as for softflowd), both into the collector.
    ``exit_sleep_s``: the ranks wait this long after their last step before they close their connections
    (as a job that saves a checkpoint at the end does).
    ``throttle[k] = (rate, after_step)`` slows namespace k's NIC mid-run, as ``nic_rates`` does from the start,
    once every rank has ended step ``after_step`` (the job's ``--progress-dir`` lines; the tc calls land in
    the job's pause between steps); ``throttled_ns`` says when. ``watch_args`` runs ``rankscope watch --store
    STORE --job fabric --flows --events FILE *watch_args`` beside the job (an exporter into the collector, not
    nfpcapd, whose files are ingested at the end) and stops it once the collector has written its last part;
    its events come back in ``watch_events``.
    ``second_bridge=True`` builds two leaves (:class:`Fabric`): every node on bridge A, an empty bridge B
    joined to it by an inter-switch link, and one softflowd per leaf metering the frames that enter that
    leaf from its host ports, each in a namespace of its own exporting from its own address (the collector
    then holds two exporters, ``leaf_exporters``). ``reroute=k`` (implies ``second_bridge``) also cables
    namespace k to bridge B and takes its link to bridge A down before the job starts: k keeps its address,
    and everything it sends enters the fabric at leaf B.
    ``also_exporters`` meter the same bridge at the same time, each into a collector and store of its own
    (``stores``, by exporter; ``store`` is ``exporter``'s): one run serves several exporters' tests.
    """
    two_leaves = second_bridge or reroute is not None
    if two_leaves and exporter != "softflowd":
        raise ValueError(f"second_bridge/reroute meter each leaf with softflowd, not {exporter!r}")
    names = (exporter, *also_exporters)
    if [e for e in names if e not in EXPORTERS] or len(set(names)) < len(names):
        raise ValueError(f"exporters {names}: each at most once, of {', '.join(EXPORTERS)}")
    if also_exporters and (two_leaves or watch_args is not None):
        raise ValueError("also_exporters: not with second_bridge, reroute or watch_args")
    workdir = Path(workdir)
    order = list(range(nodes)) if node_order is None else list(node_order)
    if sorted(order) != list(range(nodes)):
        raise ValueError(f"node_order {order} is not a permutation of 0..{nodes - 1}")
    store, out, logs = workdir / "store", workdir / "job", workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    master_port = 29500 + secrets.randbelow(2000)
    meters = [Meter(e, store if i == 0 else workdir / f"store-{e}", free_port(), "" if i == 0 else f"-{e}")
              for i, e in enumerate(names)]
    watcher = None
    procs: list[subprocess.Popen] = []
    throttle = dict(throttle or {})
    progress_dir = workdir / "progress" if throttle or watch_args is not None else None
    if progress_dir is not None:
        job_args = (*job_args, "--progress-dir", str(progress_dir))
    events = workdir / "watch-events.jsonl"
    throttled_ns: dict[int, int] = {}
    leaf_meters: list[subprocess.Popen] = []
    with Fabric(nodes, nic_rates, second_bridge=two_leaves, reroute=reroute) as fab:
        master = fab.addresses[order.index(0)]
        listen = "0.0.0.0" if two_leaves else "127.0.0.1"  # the leaves' meters export over their own links
        try:
            for m in meters:
                start_collector(m, listen, BIN / "rankscope")
            if two_leaves:
                timeouts = [a for t in flow_timeouts for a in ("-t", t)]
                for j, (mns, cap, dst) in enumerate(zip(fab.meter_ns, fab.meter_ifs, fab.collector_addrs)):
                    leaf_meters.append(subprocess.Popen(
                        ["ip", "netns", "exec", mns, "softflowd", "-d", "-i", cap, "-v", "10", "-A", "milli",
                         "-n", f"{dst}:{meters[0].port}", *timeouts, "-c", str(workdir / f"softflowd{j}.ctl"),
                         "-p", str(workdir / f"softflowd{j}.pid")],
                        stdout=open(logs / f"softflowd{j}.log", "w"), stderr=subprocess.STDOUT))
            else:
                for m in meters:
                    start_meter(m, fab.bridge, workdir, logs, flow_timeouts, nfpcapd_expire, sflow_sampling)
            if watch_args is not None:
                store.mkdir(parents=True, exist_ok=True)
                watcher = subprocess.Popen(
                    [str(BIN / "rankscope"), "watch", "--store", str(store), "--job", "fabric", "--flows",
                     "--events", str(events), *watch_args],
                    stdout=open(logs / "watch.log", "w"), stderr=subprocess.STDOUT)
            time.sleep(1.0)  # the exporter opens its capture before the job's first packet
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
            if lazy_connect:
                env["TORCH_GLOO_LAZY_INIT"] = "1"
            t0 = time.monotonic()
            for k, (ns, inner) in enumerate(zip(fab.namespaces, fab.ns_ends)):
                cmd = ["ip", "netns", "exec", ns, "env", f"GLOO_SOCKET_IFNAME={inner}",
                       str(BIN / "torchrun"), f"--nnodes={nodes}", f"--node_rank={order[k]}",
                       f"--nproc_per_node={ranks_per_node}",
                       f"--master_addr={master}", f"--master_port={master_port}",
                       str(JOB_SCRIPT), "--steps", str(steps), "--hidden", str(hidden), "--pp", str(pp),
                       "--tp", str(tp), "--microbatch-size", str(microbatch_size),
                       "--step-sleep-ms", str(step_sleep_ms), "--exit-sleep-s", str(exit_sleep_s),
                       "--out", str(out), "--pg-timeout-s", "60", *job_args]
                procs.append(subprocess.Popen(cmd, env=env, stdout=open(logs / f"node{k}.log", "w"),
                                              stderr=subprocess.STDOUT))
            deadline = time.monotonic() + timeout_s
            if throttle:
                _throttle_when_due(fab, procs, throttle, progress_dir, nodes * ranks_per_node, throttled_ns,
                                   deadline)
            for k, p in enumerate(procs):
                try:
                    rc = p.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise RuntimeError(f"node {k} did not finish in {timeout_s} s; logs in {logs}") from None
                if rc:
                    raise RuntimeError(f"node {k} exited {rc}: {(logs / f'node{k}.log').read_text()[-2000:]}")
            job_seconds = time.monotonic() - t0
            expire_softflowd([workdir / f"softflowd{j}.ctl" for j in range(len(leaf_meters))]
                             or [m.ctl for m in meters if m.ctl is not None])
            for lm in leaf_meters:
                stop_process(lm)
            stop_collectors(meters)
            stop_process(watcher, timeout=60.0)  # its last look at the store takes the collector's last part
            for m in meters:
                ingest_files(m, workdir, BIN / "rankscope")
        finally:
            for p in procs:
                stop_process(p, signal.SIGKILL, 5)
            for p in [*leaf_meters, *(m.proc for m in meters), *(m.collector for m in meters), watcher]:
                stop_process(p)
    ranks = {}
    for f in sorted(out.glob("rank*.json")):
        r = json.loads(f.read_text())
        ranks[r["rank"]] = r
    comm = [dict(c, rank=r) for r, res in ranks.items() for c in res.get("issued", [])]
    address_ranks = {addr: [order[k] * ranks_per_node + i for i in range(ranks_per_node)]
                     for k, addr in enumerate(fab.addresses)}
    stage_of = {addr: ranks[rs[0]]["stage"] for addr, rs in address_ranks.items() if rs[0] in ranks}
    return PlacedNetnsJobResult(store=store, flow_job="fabric", comm=comm,
                                endpoints={addr: rs[0] for addr, rs in address_ranks.items()},
                                master_addr=master, master_port=master_port, ranks=ranks,
                                collector_output=meters[0].output, job_seconds=job_seconds,
                                address_ranks=address_ranks, stage_of_address=stage_of,
                                throttled_ns=throttled_ns,
                                progress=read_progress(progress_dir) if progress_dir is not None else {},
                                watch_events=[json.loads(x) for x in events.read_text().splitlines() if x.strip()]
                                if events.exists() else [],
                                watch_output=(logs / "watch.log").read_text() if watcher is not None else "",
                                leaf_exporters=dict(zip("AB", fab.meter_addrs)),
                                rerouted=fab.addresses[reroute] if reroute is not None else None,
                                stores={m.exporter: m.store for m in meters},
                                collector_outputs={m.exporter: m.output for m in meters})


def read_progress(progress_dir: Path) -> dict[int, list[tuple[int, int]]]:
    """rank -> (step, end ns) of each step it ended, from the job's ``--progress-dir`` files."""
    out = {}
    for f in sorted(Path(progress_dir).glob("rank*.steps")):
        rows = [line.split() for line in f.read_text().splitlines()]
        out[int(f.stem[4:])] = [(int(a), int(b)) for a, b in (r for r in rows if len(r) == 2)]
    return out


def _throttle_when_due(fab: Fabric, procs: list[subprocess.Popen], throttle: dict[int, tuple[str, int]],
                       progress_dir: Path, world: int, throttled_ns: dict[int, int], deadline: float) -> None:
    """Throttle each NIC of ``throttle`` once every rank has ended its step, until all are or the job ends."""
    while len(throttled_ns) < len(throttle) and time.monotonic() < deadline:
        if all(p.poll() is not None for p in procs):
            return
        done = read_progress(progress_dir) if progress_dir.is_dir() else {}
        ended = min((rows[-1][0] for rows in done.values() if rows), default=-1) if len(done) == world else -1
        for k, (rate, after) in throttle.items():
            if k not in throttled_ns and ended >= after:
                fab.slow_down(k, rate)
                throttled_ns[k] = time.time_ns()
        time.sleep(0.05)
