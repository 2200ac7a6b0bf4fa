"""IPFIX decode throughput: rankscope's column-wise decoder vs the `netflow` PyPI package vs nfdump's nfcapd.

Same bytes for all three: IPFIX messages of one fixed template (softflowd's
IPv4 layout plus start/end milliseconds), 30 records per message. Figures are
records per second per core: rankscope and `netflow` run single-threaded in
this process (CPU time), nfcapd's is its own CPU time (utime+stime from
/proc) for receiving the same messages over loopback UDP, decoding and
writing them (so it includes its socket and file work). Both in-process
decoders get the same messages and the median of the same number of passes.
Target: >= 1,000,000 records/s/core for rankscope.

Then whole processes, same run: ``rankscope ingest`` of an RFC 5655 IPFIX file
of 366k records (12,200 messages) into a fresh store against a script that
parses the same file with the `netflow` package (installed into a bench-only
venv), median wall of 3 and peak RSS of each process. Target: keep the speed,
memory bounded by chunk size (not file size).

BENCH_FULL=1 also feeds 1,000,000 mutated real datagrams through the
decoders (the nightly-sized fuzz run) and reports how many were rejected.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from rankscope.collectors.flows.flow_decoder import FlowDecoder  # noqa: E402
from tests.unit.collectors.flow_builders import (  # noqa: E402
    data_set,
    ipfix_message,
    mutate,
    seed_datagrams,
    template_set,
    u,
    v4,
)

FULL = os.environ.get("BENCH_FULL") == "1"
TEMPLATE = [(8, 4), (12, 4), (152, 8), (153, 8), (1, 8), (2, 8), (10, 4), (14, 4), (7, 2), (11, 2), (4, 1),
            (6, 1), (5, 1)]
PER_MSG = 30


def build_messages(n_msgs: int) -> list[bytes]:
    out = []
    for m in range(n_msgs):
        recs = [v4(f"10.{m % 4}.{i}.1") + v4(f"10.{(m + 1) % 4}.{i}.2") + u(1_700_000_000_000 + m, 8)
                + u(1_700_000_000_100 + m, 8) + u(1500 * (i + 1), 8) + u(i + 1, 8) + u(3, 4) + u(4, 4)
                + u(40000 + i, 2) + u(29500, 2) + u(6, 1) + u(0x18, 1) + u(0, 1) for i in range(PER_MSG)]
        sets = ([template_set({256: TEMPLATE})] if m % 100 == 0 else []) + [data_set(256, recs)]
        out.append(ipfix_message(sets, domain=1, seq=m * PER_MSG))
    return out


def bench_rankscope(msgs: list[bytes], repeats: int = 3) -> tuple[float, int]:
    """Median records/s (CPU time) of ``repeats`` passes over ``msgs``."""
    dec = FlowDecoder()
    dec.feed(msgs[0], "127.0.0.1", 0)
    dec.flush()  # warm the imports (pyarrow/pandas hooks) outside the timing
    rates, rows = [], 0
    for _ in range(repeats):
        c0 = time.process_time()
        for m in msgs:
            dec.feed(m, "127.0.0.1", 0)
        rows = sum(t.num_rows for t in dec.flush().values())
        rates.append(rows / (time.process_time() - c0))
    return statistics.median(rates), rows


def bench_netflow_pkg(msgs: list[bytes], repeats: int = 3) -> tuple[float, int] | None:
    """The same passes as :func:`bench_rankscope`, with the `netflow` package (None when not installed)."""
    try:
        import netflow
    except ImportError:
        return None
    rates, rows = [], 0
    for _ in range(repeats):
        templates = {"netflow": {}, "ipfix": {}}
        rows = 0
        c0 = time.process_time()
        for m in msgs:
            p = netflow.parse_packet(m, templates)
            rows += len(p.flows)
        rates.append(rows / (time.process_time() - c0))
    return statistics.median(rates), rows


NETFLOW_FILE_PARSER = r"""
import sys, netflow
data = open(sys.argv[1], "rb").read()
templates = {"netflow": {}, "ipfix": {}}
pos = rows = 0
while pos + 4 <= len(data):
    n = int.from_bytes(data[pos + 2:pos + 4], "big")  # IPFIX message length
    rows += len(netflow.parse_packet(data[pos:pos + n], templates).flows)
    pos += n
print(rows)
"""


def whole_process_ingest(n_msgs: int = 12_200) -> None:
    """rankscope ingest of an IPFIX file vs the `netflow` package parsing it, whole processes, same run."""
    from whole_process import RANKSCOPE, anchor_python, measure, print_rows

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "flows.ipfix"
        f.write_bytes(b"".join(build_messages(n_msgs)))
        st = Path(d) / "st"
        ours = measure([*RANKSCOPE, "ingest", "-q", str(f), "--store", str(st), "--job", "fabric"],
                       before=lambda: shutil.rmtree(st, ignore_errors=True))
        py = anchor_python("netflow", ["netflow"])
        theirs = "could not be installed"
        if py is not None:
            script = Path(d) / "parse_netflow.py"
            script.write_text(NETFLOW_FILE_PARSER)
            theirs = measure([str(py), str(script), str(f)])
        print(f"\nIPFIX file ingest, {n_msgs * PER_MSG:,} records ({f.stat().st_size / 2**20:.1f} MiB):")
        print_rows([(f"IPFIX file, {n_msgs * PER_MSG // 1000}k records", ours, theirs,
                     "keep the speed; memory bounded by chunk size")], "netflow pkg")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_nfcapd(msgs: list[bytes]) -> tuple[float, int] | None:
    if shutil.which("nfcapd") is None or shutil.which("nfdump") is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        proc = subprocess.Popen(["nfcapd", "-w", d, "-b", "127.0.0.1", "-p", str(port), "-B", str(64 << 20)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        c0 = _cpu_s(proc.pid)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for i, m in enumerate(msgs):
            s.sendto(m, ("127.0.0.1", port))
            if i % 200 == 199:
                time.sleep(0.002)  # pace the sender so nfcapd's buffer does not overflow
        time.sleep(1.0)
        cpu = _cpu_s(proc.pid) - c0
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        files = sorted(Path(d).glob("nfcapd.*"))
        rows = 0
        for f in files:
            out = subprocess.run(["nfdump", "-r", str(f), "-q", "-o", "csv"], capture_output=True, text=True)
            rows += sum(1 for line in out.stdout.splitlines() if line and line[0].isdigit())
    return (rows / cpu if cpu > 0 else float("nan")), rows


def fuzz_full(n: int) -> tuple[float, int, int]:
    seeds = seed_datagrams(REPO / "tests" / "unit" / "collectors" / "fixtures")
    dec = FlowDecoder()
    for s in seeds:
        dec.feed(s, "127.0.0.1", 1)
    t = time.perf_counter()
    for i, pkt in enumerate(mutate(seeds, n, seed=11)):
        dec.feed(pkt, "127.0.0.1", 1)
        if i % 20_000 == 0:
            dec.flush(final=True)
    dec.flush(final=True)
    return n / (time.perf_counter() - t), sum(dec.rejects.values()), dec.datagrams


def main() -> int:
    n_msgs = 10_000 if FULL else 3_000
    msgs = build_messages(n_msgs)
    ours, rows = bench_rankscope(msgs)
    nf = bench_netflow_pkg(msgs)
    nfc = bench_nfcapd(msgs)
    print(f"IPFIX, fixed template, {PER_MSG} records/message, {rows:,} records, the same for each decoder")
    print(f"{'decoder':<28}{'records/s/core':>16}{'target':>12}{'vs netflow pkg':>16}")
    if nf is None:
        print(f"{'rankscope (median of 3)':<28}{ours:>16,.0f}{1_000_000:>12,}{'-':>16}")
        print(f"{'netflow (PyPI)':<28}{'not installed in this venv (see the whole-process row)':>16}")
        theirs = float("nan")
    else:
        theirs = nf[0]
        print(f"{'rankscope (median of 3)':<28}{ours:>16,.0f}{1_000_000:>12,}{ours / theirs:>15.1f}x")
        print(f"{'netflow (median of 3)':<28}{theirs:>16,.0f}{'':>12}{1.0:>15.1f}x")
    if nfc is None:
        print(f"{'nfdump nfcapd':<28}{'not installed':>16}")
    else:
        print(f"{'nfdump nfcapd (socket+file)':<28}{nfc[0]:>16,.0f}{'':>12}{nfc[0] / theirs:>15.1f}x"
              f"   ({nfc[1]:,} records received)")
    whole_process_ingest()
    if FULL:
        rate, rejected, seen = fuzz_full(1_000_000)
        print(f"fuzz: {seen:,} datagrams (1,000,000 mutated) decoded without an exception at {rate:,.0f}/s; "
              f"{rejected:,} rejects counted")
    return 0 if ours > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
