"""Scale: the OSDI'25 AR trace tiled along DP, whole processes against the authors' analyzer.

Each size is written once as the analyzer's own input (``trace-AR-xN.parquet`` and ``meta-AR-xN.yaml``
under bench-out/scale): the AR job repeated N times along DP, dp ranks and ranks shifted per copy, so
the DP groups grow N-fold and every pipeline is a copy of a real one. Both sides then read the same files:
``rankscope analyze --ingest --no-html`` (one process, fresh store, no result cache) and ``wia.py``.

Targets (issue 40): at 16x, >= 3x the analyzer's speed at <= its peak memory; rankscope's peak grows
sub-linearly over 4x, 8x and 16x. Sizes: BENCH_SCALE="1,4,8,16" by default.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import polars as pl
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_whatif import ANALYZER, ANALYZER_REQUIREMENTS, OSDI, analyzer_job, one_process_job  # noqa: E402
from whole_process import BENCH_OUT, RUNS, anchor_python, interleaved, print_rows  # noqa: E402

SIZES = [int(x) for x in os.environ.get("BENCH_SCALE", "1,4,8,16").split(",")]


def tiled_trace(times: int, out: Path) -> tuple[Path, Path, int]:
    """(trace, meta, ops) of AR repeated ``times`` along DP, in the analyzer's input format."""
    trace, meta = out / f"trace-AR-x{times}.parquet", out / f"meta-AR-x{times}.yaml"
    src = pl.read_parquet(OSDI / "trace-AR.parquet")
    m = yaml.safe_load((OSDI / "meta-AR.yaml").read_text())
    if not trace.exists():
        dp, ranks = m["dp_size"], int(src["rank"].max()) + 1
        if dp * times > 127 or ranks * times > 32767:
            raise SystemExit(f"{times}x does not fit the trace's dp_rank (int8) and rank (int16) columns")
        df = pl.concat([src.with_columns((pl.col("dp_rank") + k * dp).cast(pl.Int8),
                                         (pl.col("rank") + k * ranks).cast(pl.Int16)) for k in range(times)])
        out.mkdir(parents=True, exist_ok=True)
        tmp = trace.with_suffix(".tmp")
        df.write_parquet(tmp)
        tmp.rename(trace)
        meta.write_text(yaml.safe_dump({**m, "trial_name": f"AR-x{times}", "dp_size": dp * times,
                                        "world_size": m["world_size"] * times}))
    return trace, meta, src.height * times


def main() -> int:
    out = BENCH_OUT / "scale"
    py = anchor_python("stragglers-analyzer", ANALYZER_REQUIREMENTS) if ANALYZER.is_dir() else None
    why = "analyzer not found at " + str(ANALYZER) if not ANALYZER.is_dir() else "could not be installed"
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    base["PYTHONPYCACHEPREFIX"] = str(BENCH_OUT / "pycache")
    env = {**base, "RANKSCOPE_NO_CACHE": "1"}
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    jobs, ops = {}, {}
    for n in SIZES:
        trace, meta, ops[n] = tiled_trace(n, out)
        jobs[f"{n} ours"] = one_process_job(trace, tmp / f"st-{n}", tmp / f"out-{n}", env)
        if py is not None:
            jobs[f"{n} anchor"] = analyzer_job(py, meta, trace, tmp / f"wia-{n}", base)
    print(f"AR tiled along DP, sizes {SIZES}: whole processes, {RUNS} interleaved runs each, same files on both sides")
    m = interleaved(jobs, RUNS)
    rows = []
    for n in SIZES:
        target = ">= 3x, mem ratio <= 1" if n == 16 else ("(start-up bound)" if n == 1 else "")
        rows.append((f"AR x{n} ({ops[n]:,} ops, {64 * n:,} GPUs)", m[f"{n} ours"], m.get(f"{n} anchor", why), target))
    print_rows(rows, "analyzer")
    print("\nmemory growth against the trace (target: rankscope's peak grows sub-linearly over 4x, 8x, 16x):")
    print(f"{'size':>6} {'ops':>11} {'ours MiB':>9} {'MiB/1k ops':>10} {'anchor MiB':>10} {'MiB/1k ops':>10}")
    for n in SIZES:
        o, a = m[f"{n} ours"], m.get(f"{n} anchor")
        am = f"{a.peak_mib:10.0f} {a.peak_mib / ops[n] * 1e3:10.3f}" if a is not None and a.ok else f"{'-':>10} {'-':>10}"
        om = f"{o.peak_mib:9.0f} {o.peak_mib / ops[n] * 1e3:10.3f}" if o.ok else f"{'failed':>9} {'-':>10}"
        print(f"{n:>5}x {ops[n]:>11,} {om} {am}")
    big = [n for n in SIZES if n >= 4 and m[f"{n} ours"].ok]
    if len(big) >= 2:
        lo, hi = big[0], big[-1]
        grow = m[f"{hi} ours"].peak_mib / m[f"{lo} ours"].peak_mib
        print(f"peak x{hi} / x{lo}: {grow:.2f} for {hi / lo:.0f}x the ops: "
              f"{'sub-linear' if grow < hi / lo else 'NOT sub-linear'}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(m[f"{n} ours"].ok for n in SIZES) else 1


if __name__ == "__main__":
    sys.exit(main())
