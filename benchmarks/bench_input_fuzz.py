"""Structure-aware fuzzing of every non-flow input format through the whole ingest path.

Feeds mutated files (huge numbers, wrong types, deep nesting, quoted newlines, bit flips,
truncation, huge length fields, pickle reference bombs) of each format into ``ingest_file``
and prints the outcome counts. The figure that must hold: 0 tracebacks (errors that were not
a RankscopeError reaching the file boundary).

Default: 1,000 files (a few minutes here). BENCH_FULL=1 or ``--files N``: the long run
(>= 10,000 files). ``--seed`` picks the corpus.

Then the flow decoders (IPFIX, NetFlow v9 / v5, sFlow, pcap) get their own structure-aware
fuzz (tests/unit/collectors/flow_fuzz.py): 100,000 packets by default, 1,000,000 with
BENCH_FULL=1 (``--flow-packets N``), printing decoded / counted-bad / traceback counts.
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

from tests.unit.collectors.flow_fuzz import run as run_flows  # noqa: E402
from tests.unit.collectors.input_fuzz import run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000 if os.environ.get("BENCH_FULL") else 1_000)
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--keep", type=Path, default=None, help="copy files that hit a traceback here")
    ap.add_argument("--flow-packets", type=int, default=1_000_000 if os.environ.get("BENCH_FULL") else 100_000)
    a = ap.parse_args()
    rc_files = 0 if a.files <= 0 else fuzz_files(a)
    return rc_files or fuzz_flows(a.seed, a.flow_packets)


def fuzz_flows(seed: int, packets: int) -> int:
    t0 = time.perf_counter()
    c = run_flows(seed, packets)
    dt = time.perf_counter() - t0
    print(f"flow fuzz (seed {seed}): {c.line()} in {dt:,.0f} s ({c.packets / dt:,.0f} packets/s)")
    for reason, n in c.rejects.most_common(15):
        print(f"  {n:>9,}  {reason}")
    for reason, n in c.schema_rejects.most_common():
        print(f"  {n:>9,}  schema: {reason}")
    for head, tb in c.tracebacks[:10]:
        print(f"  TRACEBACK on {head}:\n{tb}")
    return 1 if c.tracebacks else 0


def fuzz_files(a) -> int:
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
