"""`make bench`: run every benchmarks/bench_*.py in turn, each in its own process, and print its figures.

Each bench script prints its own table (figure, target, ratio against the
anchor measured in the same run). BENCH_FULL=1 asks them for the full corpora.
Run one with `python benchmarks/run_all.py simulate` (substring match).

Registered: every bench_*.py here (bench_16k, 16,384 GPUs embedded and on a 2-node Ray cluster, only with
BENCH_FULL=1 or by name), among them bench_corpus (black-box accuracy
and calibration on the de-idealised corpus: 24 jobs up to 256 GPUs by default,
>= 200 jobs up to 4,096 GPUs with BENCH_FULL=1; run it alone with
`python benchmarks/bench_corpus.py --jobs N` for a reduced size).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FULL_ONLY = ("bench_16k",)
"""benchmarks that `make bench` runs only with BENCH_FULL=1 (or when named): bench_16k simulates and
analyses 16,384 GPUs twice (embedded and on Ray), far beyond the default run's 20 minutes."""


def main(argv: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    if argv:
        scripts = [s for s in scripts if any(a in s.stem for a in argv)]
    elif os.environ.get("BENCH_FULL") != "1":
        # tens of minutes each: run with BENCH_FULL=1 or by name
        scripts = [s for s in scripts if s.stem not in FULL_ONLY]
    failed = []
    for s in scripts:
        print(f"\n=== {s.stem} ===", flush=True)
        t = time.perf_counter()
        r = subprocess.run([sys.executable, str(s)], env=os.environ.copy())
        print(f"--- {s.stem}: exit {r.returncode}, {time.perf_counter() - t:.1f} s wall", flush=True)
        if r.returncode:
            failed.append(s.stem)
    if failed:
        print(f"\nbenchmarks that failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
