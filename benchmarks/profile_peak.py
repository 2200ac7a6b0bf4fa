"""What holds the memory at a command's peak: memray's high-water-mark records, summed by call site.

usage: python benchmarks/profile_peak.py [--top N] -- rankscope analyze --ingest TRACE --store ST --no-html

The command runs whole, as a user runs it, under ``memray run`` (memray is a dev dependency). Allocations
live at the peak are grouped by the innermost three rankscope frames of their stack; those made on threads
with no Python frame (polars' and Arrow's worker pools building frames) are one line per thread. memray
counts bytes allocated, not pages touched, so its peak is at or above the process's peak RSS.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def holders(capture: Path, top: int) -> tuple[float, list[tuple[float, str]]]:
    """(peak MiB, [(MiB, call site)] of the ``top`` largest holders at the peak)."""
    from memray import FileReader

    reader = FileReader(str(capture))
    by: collections.Counter = collections.Counter()
    for rec in reader.get_high_watermark_allocation_records(merge_threads=False):
        stack = rec.stack_trace(max_stacks=60)
        ours = [f"{f[1].split(str(REPO) + '/')[-1]}:{f[2]} {f[0]}" for f in stack
                if f[1].startswith(str(REPO)) and "/.venv/" not in f[1]]
        key = " < ".join(ours[:3]) if ours else f"thread {rec.tid} without a rankscope frame (polars/Arrow workers)"
        by[key] += rec.size
    return reader.metadata.peak_memory / 2**20, [(v / 2**20, k) for k, v in by.most_common(top)]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--top", type=int, default=15)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = [c for c in args.command if c != "--"]
    if not cmd:
        p.error("give the command after --")
    if cmd[0] == "rankscope":
        cmd = ["-m", "rankscope.cli.main", *cmd[1:]]
    tmp = Path(tempfile.mkdtemp(prefix="profile-peak-"))
    try:
        capture = tmp / "capture.bin"
        r = subprocess.run([sys.executable, "-m", "memray", "run", "-q", "-o", str(capture), *cmd])
        if r.returncode != 0:
            print(f"the command exited {r.returncode}", file=sys.stderr)
            return r.returncode
        peak, top = holders(capture, args.top)
        print(f"peak {peak:,.0f} MiB (bytes allocated and live at the high-water mark); the largest holders:")
        for mib, where in top:
            print(f"{mib:9.1f} MiB  {where}")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
