"""Kineto trace loading: rankscope's importer against Meta's HTA ``TraceAnalysis``, same files, same run.

Corpora: the two sampled HTA reference ranks, and ``nccl_data.json.gz``
replicated to N ranks (its ``distributedInfo.rank`` rewritten; N = 8, or 32
with BENCH_FULL=1). Each loader runs in its own subprocess and reports its
load wall time and peak RSS (``resource.getrusage`` maxrss of itself and of
its children, since HTA parses ranks in a process pool). HTA is installed
from PyPI into a private venv under /tmp (never into the project); without
network the HTA column is skipped with a message.

    python benchmarks/bench_kineto_load.py
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REF = Path(os.environ.get("RANKSCOPE_SHARED", REPO.parent / "shared")) / "reference" / "kineto-hta"
HTA_VENV = Path(os.environ.get("RANKSCOPE_HTA_VENV", "/tmp/rankscope-hta-venv"))
TARGET_SPEEDUP = 5.0

RANKSCOPE_LOADER = r"""
import json, resource, sys, time
from pathlib import Path
from rankscope.collectors.formats import ImportOptions
from rankscope.collectors.kineto_import import read_trace
files = sorted(Path(sys.argv[1]).glob("*.json*"))
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
c = cpu()
t = time.perf_counter()
rows = 0
for f in files:
    b = read_trace(f, ImportOptions())
    rows += sum(t.height for ts in b.tables.values() for t in ts)
wall = time.perf_counter() - t
rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"wall_s": wall, "cpu_s": cpu() - c, "rss_mib": rss / 1024, "rows": rows}))
"""

HTA_LOADER = r"""
import json, resource, sys, time, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
c = cpu()
t = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
rows = sum(len(df) for df in a.t.traces.values())
wall = time.perf_counter() - t
rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"wall_s": wall, "cpu_s": cpu() - c, "rss_mib": rss / 1024, "rows": rows}))
"""


def hta_python() -> Path | None:
    py = HTA_VENV / "bin" / "python"
    if py.exists() and subprocess.run([py, "-c", "import hta"], capture_output=True).returncode == 0:
        return py
    print(f"installing holistictraceanalysis into {HTA_VENV} (benchmark only) ...", flush=True)
    r = subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], capture_output=True, text=True)
    if r.returncode == 0:
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "holistictraceanalysis"],
                           capture_output=True, text=True)
    if r.returncode != 0:
        print(f"HTA column skipped: could not install holistictraceanalysis ({r.stderr.strip()[-200:]})")
        return None
    return py


def replicate(src: Path, out: Path, n: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    for r in range(n):
        doc["distributedInfo"]["rank"] = r
        doc["distributedInfo"]["world_size"] = n
        with gzip.open(out / f"rank-{r}.json.gz", "wt", compresslevel=1) as f:
            json.dump(doc, f)
    return out


def run(python: Path, code: str, trace_dir: Path) -> dict | None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([str(python), "-c", code, str(trace_dir)], capture_output=True, text=True, env=env,
                       timeout=1800)
    if r.returncode != 0:
        print(f"  loader failed ({python}): {r.stderr.strip()[-400:]}")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    if not REF.is_dir():
        print(f"skipped: HTA reference traces not found at {REF}")
        return 0
    n = 32 if os.environ.get("BENCH_FULL") else 8
    hta = hta_python()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "sampled"
        small.mkdir()
        for f in ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz"):
            (small / f).symlink_to(REF / f)
        corpora = [("HTA sampled, 2 ranks", small), (f"nccl_data x {n} ranks", replicate(
            REF / "nccl_data.json.gz", Path(tmp) / "big", n))]
        for label, d in corpora:
            mb = sum(p.stat().st_size for p in d.iterdir()) / 2**20
            ours = run(Path(sys.executable), RANKSCOPE_LOADER, d)
            theirs = run(hta, HTA_LOADER, d) if hta else None
            rows.append((label, mb, ours, theirs))
    print(f"\n{'corpus':24} {'gz MiB':>7} {'ours wall s':>11} {'HTA wall s':>10} {'speed-up':>8} {'ours CPU s':>10} "
          f"{'HTA CPU s':>9} {'CPU ratio':>9} {'target':>6} {'ours MiB':>8} {'HTA MiB':>7} {'mem ratio':>9}")
    ok = True
    for label, mb, ours, theirs in rows:
        if ours is None:
            ok = False
            continue
        if theirs:
            print(f"{label:24} {mb:7.1f} {ours['wall_s']:11.2f} {theirs['wall_s']:10.2f} "
                  f"{theirs['wall_s'] / ours['wall_s']:7.1f}x {ours['cpu_s']:10.2f} {theirs['cpu_s']:9.2f} "
                  f"{theirs['cpu_s'] / ours['cpu_s']:8.1f}x {TARGET_SPEEDUP:5.0f}x {ours['rss_mib']:8.0f} "
                  f"{theirs['rss_mib']:7.0f} {ours['rss_mib'] / theirs['rss_mib']:9.2f}")
        else:
            print(f"{label:24} {mb:7.1f} {ours['wall_s']:11.2f} {'-':>10} {'-':>8} {ours['cpu_s']:10.2f} {'-':>9} "
                  f"{'-':>9} {TARGET_SPEEDUP:5.0f}x {ours['rss_mib']:8.0f} {'-':>7} {'-':>9}")
    print("speed-up = HTA TraceAnalysis load wall time / rankscope import wall time (decode to record kinds);")
    print("CPU ratio = the same with CPU seconds (self + children: HTA parses ranks in a process pool), steadier")
    print("than wall time on a shared machine; mem ratio = rankscope peak RSS / HTA peak RSS (<= 1 meets target)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
