"""Structure-aware fuzzing of every non-flow input format through the whole ingest path.

Feeds mutated files (huge numbers, wrong types, deep nesting, quoted newlines, bit flips,
truncation, huge length fields, pickle reference bombs) of each format into ``ingest_file``
and prints the outcome counts. The figure that must hold: 0 tracebacks (errors that were not
a RankscopeError reaching the file boundary).

Default: 1,000 files (a few minutes here). BENCH_FULL=1 or ``--files N``: the long run
(>= 10,000 files). ``--seed`` picks the corpus.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.unit.collectors.input_fuzz import run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000 if os.environ.get("BENCH_FULL") else 1_000)
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--keep", type=Path, default=None, help="copy files that hit a traceback here")
    a = ap.parse_args()
    t0 = time.perf_counter()
    c = run(a.seed, max_files=a.files, keep=a.keep)
    dt = time.perf_counter() - t0
    print(f"input fuzz (seed {a.seed}): {c.line()} in {dt:,.0f} s ({sum(c.files.values()) / dt:,.1f} files/s)")
    per = Counter()
    for (fmt, status), n in sorted(c.outcomes.items()):
        per[fmt] += n
        print(f"  {fmt:<24}{status:<10}{n:>7,}")
    for fmt, path, err in c.tracebacks[:20]:
        print(f"  TRACEBACK {fmt}: {path}: {err}")
    return 1 if c.tracebacks else 0


if __name__ == "__main__":
    sys.exit(main())
