"""Kineto trace loading, whole processes: ``rankscope ingest`` against Meta's HTA ``TraceAnalysis``.

Corpora: the two sampled HTA reference ranks, and ``nccl_data.json.gz``
replicated to N ranks (its ``distributedInfo.rank`` rewritten; N = 8, or 32
with BENCH_FULL=1). Each side runs as its own whole process (start-up
included), median wall of 3 runs, peak RSS of the largest process of the tree
(both sides decode in worker processes: rankscope forks one per idle core
plus one, and one on a busy machine, RANKSCOPE_INGEST_WORKERS=N forces N;
HTA parses ranks in a process pool), and the peak of the memory summed over the
tree (PSS) in one more run: ``rankscope ingest DIR --store fresh`` (decode,
validate and write Parquet) against a script that builds
``TraceAnalysis(trace_dir=DIR)``. HTA (``holistictraceanalysis``) is installed
from PyPI into a bench-only venv under bench-out/; when it cannot be installed
its column says so and shows no figure. Target: >= 3x faster at <= HTA's memory.

    python benchmarks/bench_kineto_load.py
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from whole_process import (  # noqa: E402
    BENCH_OUT,
    RANKSCOPE,
    anchor_python,
    measure,
    print_rows,
    run_once,
    tree_pss_peak_mib,
)

REPO = Path(__file__).resolve().parents[1]
REF = Path(os.environ.get("RANKSCOPE_SHARED", REPO.parent / "shared")) / "reference" / "kineto-hta"

HTA_LOADER = r"""
import sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
print(sum(len(df) for df in a.t.traces.values()))
"""


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


def main() -> int:
    if not REF.is_dir():
        print(f"skipped: HTA reference traces not found at {REF}")
        return 0
    n = 32 if os.environ.get("BENCH_FULL") else 8
    hta = anchor_python("hta", ["holistictraceanalysis"])
    rows, sums = [], []
    # like with like: a pip-installed package runs from bytecode, so both sides get a bytecode cache (one
    # untimed warm-up each fills it); PYTHONDONTWRITEBYTECODE in the environment would otherwise have
    # rankscope's editable sources compiled on every run while HTA's were compiled at its install
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONWARNINGS="ignore", PYTHONPYCACHEPREFIX=str(BENCH_OUT / "pycache"))
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "sampled"
        small.mkdir()
        for f in ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz"):
            (small / f).symlink_to(REF / f)
        corpora = [("HTA sampled, 2 ranks", small), (f"nccl_data x {n} ranks", replicate(
            REF / "nccl_data.json.gz", Path(tmp) / "big", n))]
        script = Path(tmp) / "hta_load.py"
        script.write_text(HTA_LOADER)
        for label, d in corpora:
            mb = sum(p.stat().st_size for p in d.iterdir()) / 2**20
            st = Path(tmp) / "st"
            shutil.rmtree(st, ignore_errors=True)
            run_once([*RANKSCOPE, "ingest", "-q", str(d), "--store", str(st)], env=env)  # warm-up
            if hta:
                run_once([str(hta), str(script), str(d)], env=env)
            ours = measure([*RANKSCOPE, "ingest", "-q", str(d), "--store", str(st)], env=env,
                           before=lambda st=st: shutil.rmtree(st, ignore_errors=True))
            theirs = measure([str(hta), str(script), str(d)], env=env) if hta else "could not be installed"
            rows.append((f"{label} ({mb:.0f} MiB gz)", ours, theirs, ">= 3x, mem ratio <= 1"))
            # both sides run worker processes (rankscope's decode workers, HTA's pool): the tree's sum too
            sums.append((label, tree_pss_peak_mib([*RANKSCOPE, "ingest", "-q", str(d), "--store", str(st)], env=env,
                                                  before=lambda st=st: shutil.rmtree(st, ignore_errors=True)),
                         tree_pss_peak_mib([str(hta), str(script), str(d)], env=env) if hta else None))
    print_rows(rows, "HTA load")
    for label, ours_sum, theirs_sum in sums:
        fig = lambda v: f"{v:.0f} MiB" if v is not None else "n/a"  # noqa: E731
        print(f"    {label}: memory summed over the process tree (PSS, one run, sampled every 20 ms): "
              f"rankscope {fig(ours_sum)}, HTA {fig(theirs_sum)}")
    return 0 if all(r[1].ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
