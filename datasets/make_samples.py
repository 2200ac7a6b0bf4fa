"""Regenerate the bundled samples in datasets/samples/ (``python -m rankscope.datasets.make_samples``).

``demo/``: a DP2 x PP2 job on two hosts of two GPUs (so it has switch flows),
4 steps, one injected fault (rank 3 computes 1.5x slower), per-kernel GEMM
records; one CSV per record kind plus ``truth.json`` (kept beside the CSVs
as ``demo.truth.json`` one level up, so ``rankscope ingest samples/demo``
sees only trace files).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl

from rankscope.datasets.simulator import Fault, SimConfig, simulate

SAMPLES = Path(__file__).resolve().parent / "samples"

DEMO = SimConfig(job="default", dp=2, pp=2, tp=1, gpus_per_host=2, steps=4, microbatches=4, layers=4,
                 seed=7, gemm_records=True,
                 faults=(Fault("slow-worker", {"rank": 3, "factor": 1.5}),))


def write_csvs(res, out: Path) -> dict[str, int]:
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for kind, table in res.tables.items():
        df = pl.from_arrow(table)
        df = df.select([c for c in df.columns if df[c].null_count() < df.height])  # drop all-null columns
        if "group_ranks" in df.columns:
            df = df.with_columns(pl.format("[{}]", pl.col("group_ranks").cast(pl.List(pl.String)).list.join(","))
                                 .alias("group_ranks"))
        df.write_csv(out / f"{kind}.csv")
        counts[kind] = df.height
    return counts


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else SAMPLES
    res = simulate(DEMO)
    counts = write_csvs(res, root / "demo")
    (root / "demo.truth.json").write_text(json.dumps(res.truth_file(), indent=1))
    print(f"wrote {root / 'demo'}: {counts} and {root / 'demo.truth.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
