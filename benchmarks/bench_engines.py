"""`analyze --engine embedded` against `--engine ray` on one store holding several jobs.

Both engines run as whole processes (`rankscope analyze ...`), started the same
way a user starts them, in the same run; the Ray engine starts (and stops) a
local 127.0.0.1 cluster, so its figure includes Ray's start-up, as a user's
first call would. Peak RSS is the largest resident set among the process and
the children it waited for (Ray's workers are the raylet's children, not
ours, so the Ray row's memory is the driver's only: said beside the figure).

Default store: 6 jobs of 128 GPUs (DP8 PP4 TP4, 8 steps); BENCH_FULL=1 makes
12 jobs of 512 GPUs. The reports of both engines are compared key by key on
strategy, steps and verdict, and a difference fails the bench.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rankscope.datasets.simulator import Fault, SimConfig, simulate, write_store

BIN = Path(sys.executable).parent
RUNS = 3


def _store(root: Path, jobs: int, dp: int) -> Path:
    out = root / "st"
    faults = [(), (Fault("slow-worker", {"rank": 5, "factor": 1.5}),),
              (Fault("stage-imbalance", {"stage": 1, "factor": 1.4}),)]
    for j in range(jobs):
        cfg = SimConfig(job=f"job{j}", dp=dp, pp=4, tp=4, steps=8, microbatches=4, seed=100 + j,
                        faults=faults[j % len(faults)], flows=False)
        write_store(simulate(cfg), out)
    return out


def _analyze(store: Path, out: Path, *extra: str) -> tuple[float, float, dict]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    r = subprocess.run([str(BIN / "rankscope"), "analyze", "--store", str(store), "--out-dir", str(out),
                        "--no-html", *extra], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode:
        raise SystemExit(f"analyze {' '.join(extra)} failed: {r.stderr[-2000:]}")
    rss = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 2**20
    return wall, rss, {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def _same(a: dict, b: dict) -> list[str]:
    diffs = []
    for job in sorted(set(a) | set(b)):
        if job not in a or job not in b:
            diffs.append(f"{job}: only one engine reported it")
            continue
        for sec, keys in (("strategy", ("dp", "pp", "tp", "dp_groups", "pp_groups")),
                          ("steps", ("count", "median_ns")), ("stragglers", ("verdict", "slowdown"))):
            for k in keys:
                if a[job][sec].get(k) != b[job][sec].get(k):
                    diffs.append(f"{job}.{sec}.{k}")
    return diffs


def main() -> int:
    try:
        import ray  # noqa: F401
    except ImportError:
        print("ray is not installed: skipping (pip install 'rankscope[ray]')")
        return 0
    full = os.environ.get("BENCH_FULL") == "1"
    jobs, dp = (12, 32) if full else (6, 8)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        t = time.perf_counter()
        store = _store(root, jobs, dp)
        print(f"store: {jobs} jobs x {dp * 16} GPUs, 8 steps, written in {time.perf_counter() - t:.1f} s")
        walls: dict[str, list[float]] = {"embedded": [], "ray": []}
        rss: dict[str, float] = {"embedded": 0.0, "ray": 0.0}
        reports = {}
        for i in range(RUNS):
            for engine in ("embedded", "ray"):
                w, m, rep = _analyze(store, root / f"{engine}{i}", "--engine", engine)
                walls[engine].append(w)
                rss[engine] = max(rss[engine], m)
                reports[engine] = rep
        diffs = _same(reports["embedded"], reports["ray"])
    emb, ray_ = statistics.median(walls["embedded"]), statistics.median(walls["ray"])
    rows = [("figure", "embedded", "ray", "ray / embedded"),
            (f"analyze wall, median of {RUNS} (s)", f"{emb:.1f}", f"{ray_:.1f}", f"{ray_ / emb:.2f}"),
            ("peak RSS (GiB)", f"{rss['embedded']:.2f}", f"{rss['ray']:.2f} (driver only)", ""),
            ("CPUs on this machine", str(os.cpu_count()), "", "")]
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    print("reports agree on strategy, steps and verdict" if not diffs else f"REPORTS DIFFER: {diffs}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
