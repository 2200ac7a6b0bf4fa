"""Write the golden reports anew: ``python tests/golden/regenerate.py [CASE ...]``.

Run it only for a deliberate change of the reports, and commit the new files on their own with a message
saying why they changed (the test then holds the new behaviour).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import CASES, GOLDEN, available, build_reports  # noqa: E402


def main(names: list[str]) -> int:
    chosen = [c for c in CASES if not names or c.name in names]
    for case in chosen:
        why = available(case)
        if why:
            print(f"{case.name}: skipped ({why})")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            reports = build_reports(case, Path(tmp))
        d = GOLDEN / case.name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        for name, text in reports.items():
            (d / name).write_text(text)
        print(f"{case.name}: {len(reports)} report(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
