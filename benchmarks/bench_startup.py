"""`rankscope --help` and each command's `--help` as whole processes (start-up cost users feel).

Target (issue 15): `rankscope --help` < 0.2 s; each command imports only what it uses. No anchor.
Median wall of BENCH_RUNS (default 3) runs and peak RSS, through the venv's `rankscope` console script.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from whole_process import measure, print_rows  # noqa: E402

EXE = str(Path(sys.executable).parent / "rankscope")


def main() -> int:
    rows = [("rankscope --help", measure([EXE, "--help"]), "no anchor", "< 0.2 s")]
    for cmd in ("analyze", "ingest", "sql"):
        rows.append((f"rankscope {cmd} --help", measure([EXE, cmd, "--help"]), "no anchor", "< 0.2 s"))
    print_rows(rows, "-")
    return 0 if all(r[1].ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
