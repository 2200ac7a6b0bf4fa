"""Collector memory under the two floods that used to grow it without bound (loopback only).

Flood A: messages full of empty data sets for a template that never comes (they used to count
0 bytes against the 4 MiB hold limit). Flood B: a new observation domain in every message, each
with its own template (per-exporter state was never freed). The collector runs as the real CLI
process; its peak RSS (VmHWM from /proc) is printed against the stated cap, with what it
received and rejected. BENCH_FULL=1 sends 3x as many messages.
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

from tests.unit.collectors.flow_builders import data_set, ipfix_message, template_set  # noqa: E402

CAP_MIB = 600
"""The stated cap: collector peak RSS under either flood (interpreter, pyarrow and polars included)."""
MESSAGES = 600_000 if os.environ.get("BENCH_FULL") == "1" else 200_000


def _peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _flood(name: str, make) -> tuple[float, int, str]:
    with tempfile.TemporaryDirectory() as d:
        port_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        port_sock.bind(("127.0.0.1", 0))
        port = port_sock.getsockname()[1]
        port_sock.close()
        p = subprocess.Popen([str(Path(sys.executable).parent / "rankscope"), "collect", "flows", "--listen",
                              f"127.0.0.1:{port}", "--store", f"{d}/st", "--roll-seconds", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = p.stdout.readline()  # the collector says it listens once its handlers are installed
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        sent, peak = 0, 0.0
        for i in range(MESSAGES):
            s.sendto(make(i), ("127.0.0.1", port))
            sent += 1
            if i % 20_000 == 0:
                peak = max(peak, _peak_mib(p.pid))
                time.sleep(0.05)  # let the collector keep up: a flood it drops proves nothing
        time.sleep(1.5)
        peak = max(peak, _peak_mib(p.pid))
        p.send_signal(signal.SIGTERM)
        out = line + p.communicate(timeout=120)[0]
    return peak, sent, out.strip().splitlines()[-1] if out.strip() else ""


def main() -> int:
    empty = ipfix_message([data_set(999, [])] * 300)
    tmpl = template_set({256: [(8, 4), (12, 4), (1, 4)]})
    rows = []
    for name, make in (("A: empty data sets, unknown template", lambda i: empty),
                       ("B: new observation domain per message", lambda i: ipfix_message([tmpl], domain=i))):
        peak, sent, last = _flood(name, make)
        rows.append((name, sent, peak, last))
    print(f"{'flood':<42}{'messages':>10}{'peak RSS MiB':>14}{'cap MiB':>9}{'ratio':>7}")
    for name, sent, peak, _ in rows:
        print(f"{name:<42}{sent:>10,}{peak:>14.0f}{CAP_MIB:>9}{peak / CAP_MIB:>7.2f}")
    for name, _, _, last in rows:
        print(f"  {name}: collector's last line: {last[:160]}")
    return 0 if all(r[2] <= CAP_MIB for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
