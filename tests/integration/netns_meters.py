"""The flow exporters that meter a namespaced job's bridge, each into a collector and store of its own.

Several exporters may meter one run at once (tests/integration/netns_job.py ``also_exporters``): each
sees every frame of the bridge, so they cut the same traffic into records their own way, and one job
serves every exporter's test instead of one job each.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.integration.netns_fabric import sh, stop_process

EXPORTERS = ("softflowd", "nfpcapd", "pmacct-sflow", "pmacct-ipfix")


@dataclass
class Meter:
    """One exporter on the bridge, its collector (``rankscope collect flows`` on ``port``) and store."""

    exporter: str
    store: Path
    port: int
    tag: str = ""
    """suffix of its files in the run's directory ('' for the run's first exporter)."""
    collector: subprocess.Popen | None = None
    proc: subprocess.Popen | None = None
    ctl: Path | None = None
    nfdir: Path | None = None
    output: str = ""
    """what its collector (and, for nfpcapd, the ingest of its files) printed."""


def start_collector(m: Meter, listen: str, binary: Path) -> None:
    """The meter's collector, listening before the meter starts."""
    m.collector = subprocess.Popen(
        [str(binary), "collect", "flows", "--listen", f"{listen}:{m.port}", "--store", str(m.store),
         "--job", "fabric", "--roll-seconds", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = m.collector.stdout.readline()
    if "listening" not in first:
        raise RuntimeError(f"collector did not start: {first}{m.collector.stdout.read()}")
    m.output = first


def start_meter(m: Meter, bridge: str, workdir: Path, logs: Path, flow_timeouts: tuple[str, ...],
                nfpcapd_expire: tuple[int, int] = (2, 1), sflow_sampling: int = 16,
                softflowd_buffer_bytes: int | None = None) -> None:
    """Start ``m``'s exporter on ``bridge``, exporting to its collector (nfpcapd: into files, ingested later).
    ``flow_timeouts`` are softflowd's ``-t`` settings (pmacct's IPFIX probe takes the same);
    ``softflowd_buffer_bytes``: softflowd's libpcap buffer (``-B``), its default when None."""
    log = open(logs / f"{m.exporter}{m.tag}.log", "w")
    if m.exporter == "nfpcapd":
        m.nfdir = workdir / f"nfcapd{m.tag}"
        m.nfdir.mkdir(exist_ok=True)
        # nfpcapd opens its capture without promiscuous mode: the bridge must take every frame
        sh("ip", "link", "set", bridge, "promisc", "on")
        m.proc = subprocess.Popen(["nfpcapd", "-i", bridge, "-w", str(m.nfdir), "-t", "3600",
                                   "-e", f"{nfpcapd_expire[0]},{nfpcapd_expire[1]}"], stdout=log,
                                  stderr=subprocess.STDOUT)
    elif m.exporter.startswith("pmacct-"):
        sh("ip", "link", "set", bridge, "promisc", "on")
        if m.exporter == "pmacct-sflow":
            plugin = (f"plugins: sfprobe\nsfprobe_receiver: 127.0.0.1:{m.port}\n"
                      f"sfprobe_agentip: 127.0.0.1\nsampling_rate: {sflow_sampling}\nsfprobe_agentsubid: 1\n")
        else:  # pmacct's NetFlow/IPFIX probe, with softflowd's timeouts
            plugin = (f"plugins: nfprobe\nnfprobe_receiver: 127.0.0.1:{m.port}\nnfprobe_version: 10\n"
                      f"nfprobe_timeouts: {':'.join(flow_timeouts)}\n"
                      "aggregate: src_host, dst_host, src_port, dst_port, proto, tos\n")
        conf = workdir / f"pmacctd{m.tag}.conf"
        conf.write_text(f"daemonize: false\npcap_interface: {bridge}\n{plugin}")
        m.proc = subprocess.Popen(["pmacctd", "-f", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    else:
        m.ctl = workdir / f"softflowd{m.tag}.ctl"
        timeouts = [a for t in flow_timeouts for a in ("-t", t)]
        m.proc = subprocess.Popen(
            ["softflowd", "-d", "-i", bridge, "-v", "10", "-A", "milli", "-n", f"127.0.0.1:{m.port}", *timeouts,
             "-c", str(m.ctl), "-p", str(workdir / f"softflowd{m.tag}.pid"),
             *(["-B", str(softflowd_buffer_bytes)] if softflowd_buffer_bytes else [])],
            stdout=log, stderr=subprocess.STDOUT)


def expire_softflowd(ctls: list[Path]) -> None:
    """Make each softflowd export every flow it still holds, and give the records time to arrive."""
    for c in ctls:
        subprocess.run(["softflowctl", "-c", str(c), "expire-all"], capture_output=True, timeout=10)
    if ctls:
        time.sleep(1.5)


def stop_collectors(meters: list[Meter]) -> None:
    """Stop the meters (nfpcapd writes every flow it still holds as it exits), then their collectors."""
    for m in meters:
        stop_process(m.proc)
    time.sleep(0.5)
    for m in meters:
        stop_process(m.collector)
        if m.collector is not None and m.collector.stdout is not None:
            m.output += m.collector.stdout.read()


def ingest_files(m: Meter, workdir: Path, binary: Path) -> None:
    """nfpcapd's files read back with ``nfdump -o json`` and ingested, as a user would."""
    if m.nfdir is None:
        return
    dump = workdir / f"flows{m.tag}.nfdump.json"
    with open(dump, "w") as fh:
        subprocess.run(["nfdump", "-R", str(m.nfdir), "-o", "json"], stdout=fh, check=True, timeout=60)
    done = sh(str(binary), "ingest", str(dump), "--store", str(m.store), "--job", "fabric", check=False)
    m.output += done.stdout + done.stderr
    if done.returncode:
        raise RuntimeError(f"ingest of {dump} failed: {done.stdout}{done.stderr}")
