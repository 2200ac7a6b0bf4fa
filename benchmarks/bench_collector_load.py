"""Loopback load test of `rankscope collect flows`: a bounded burst, then received / decoded / dropped.

The collector runs as its own process (the real CLI) on 127.0.0.1; this
process sends IPFIX messages (one fixed template, 10 records each) at a
paced rate for a bounded time, then SIGTERMs the collector and reads its
manifest entry. Default: 50,000 packets/s for 10 s (500,000 packets);
BENCH_FULL=1 sends for 30 s. "sent" is what this sender managed (a
Python sender on a shared 2-core machine may fall short of the asked rate).
Then the two floods of the hardening report go to a fresh collector (40 MB
each: empty data sets for unknown templates, and a new observation domain in
every message) and its peak RSS (VmHWM) is printed against the stated cap.
Loopback only, never another address.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rankscope.collectors.store import Store  # noqa: E402
from tests.unit.collectors.flow_builders import (  # noqa: E402
    data_set,
    flood_empty_sets,
    flood_new_domain,
    ipfix_message,
    template_set,
    u,
    v4,
)

RATE_PPS = 50_000
SECONDS = 30 if os.environ.get("BENCH_FULL") == "1" else 10
PER_MSG = 10
FIELDS = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]


def messages(n: int) -> list[bytes]:
    tmpl = template_set({256: FIELDS})
    out = []
    for m in range(n):
        recs = [v4(f"10.0.{i}.1") + v4(f"10.1.{m % 200}.2") + u(40000 + i, 2) + u(29500, 2) + u(6, 1)
                + u(1500, 8) + u(1, 8) + u(1_700_000_000_000 + m, 8) + u(1_700_000_000_001 + m, 8)
                for i in range(PER_MSG)]
        out.append(ipfix_message(([tmpl] if m % 1000 == 0 else []) + [data_set(256, recs)], seq=m))
    return out


def main() -> int:
    pool = messages(2000)
    with tempfile.TemporaryDirectory() as d:
        store = Path(d) / "st"
        proc = subprocess.Popen([sys.executable, "-m", "rankscope.cli.main", "collect", "flows", "--listen",
                                 "127.0.0.1:0", "--store", str(store), "--roll-seconds", "2"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = proc.stdout.readline()
        port = int(line.split("127.0.0.1:")[1].split()[0])
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(pool[0], ("127.0.0.1", port))  # the template first
        sent, t0 = 1, time.perf_counter()
        batch = max(1, RATE_PPS // 1000)  # one batch per millisecond at the asked rate
        while time.perf_counter() - t0 < SECONDS:
            for _ in range(batch):
                s.sendto(pool[sent % len(pool)], ("127.0.0.1", port))
                sent += 1
            ahead = sent / RATE_PPS - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
        elapsed = time.perf_counter() - t0
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=300)[0]
        entry = [m for m in Store(store).manifest() if m.format == "collect-flows"][0]
        received = entry.notes["datagrams"]
        decoded = entry.records.get("flow", 0)
        drops = entry.notes["kernel_drops"]
    print(f"loopback burst: asked {RATE_PPS:,} packets/s for {SECONDS} s, {PER_MSG} records/packet")
    print(f"{'figure':<34}{'value':>14}")
    print(f"{'sent (packets)':<34}{sent:>14,}")
    print(f"{'sent rate (packets/s)':<34}{sent / elapsed:>14,.0f}")
    print(f"{'received (packets)':<34}{received:>14,}")
    print(f"{'decoded (records stored)':<34}{decoded:>14,}")
    print(f"{'kernel drops (packets)':<34}{drops:>14,}")
    print(f"{'lost (sent - received)':<34}{sent - received:>14,}")
    print(f"{'stored / (received * per packet)':<34}{decoded / max(1, received * PER_MSG):>14.4f}")
    if proc.returncode:
        print(out)
    return proc.returncode


FLOOD_MB = 40
CAP_OVER_BASELINE_MB = 64  # the cap tests/unit/collectors/test_collector_floods.py asserts


def _hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) / 1024 for x in f if x.startswith("VmHWM"))


def floods() -> int:
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen([sys.executable, "-m", "rankscope.cli.main", "collect", "flows", "--listen",
                                 "127.0.0.1:0", "--store", str(Path(d) / "st")],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        port = int(proc.stdout.readline().split("127.0.0.1:")[1].split()[0])
        time.sleep(0.5)
        base = _hwm_mb(proc.pid)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rows = []
        for builder in (flood_empty_sets, flood_new_domain):
            sent, i, t0 = 0, 0, time.perf_counter()
            while sent < FLOOD_MB << 20:
                m = builder(i)
                s.sendto(m, ("127.0.0.1", port))
                sent, i = sent + len(m), i + 1
                if i % 100 == 0:
                    time.sleep(0.005)
            time.sleep(0.5)
            rows.append((builder.__name__, i, sent, time.perf_counter() - t0, _hwm_mb(proc.pid)))
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=300)[0]
    print(f"collector floods ({FLOOD_MB} MB each), baseline RSS {base:,.0f} MB, cap baseline + "
          f"{CAP_OVER_BASELINE_MB} MB")
    for name, n, sent, dt, peak in rows:
        print(f"  {name:<20}{n:>9,} messages {sent / 2**20:>6.1f} MB in {dt:5.1f} s   peak RSS {peak:,.0f} MB "
              f"(+{peak - base:,.0f} MB)")
    print("  " + "\n  ".join(out.strip().splitlines()[-6:]))
    return 0 if max(r[4] for r in rows) - base <= CAP_OVER_BASELINE_MB and proc.returncode == 0 else 1


if __name__ == "__main__":
    rc = main()
    sys.exit(rc or floods())
