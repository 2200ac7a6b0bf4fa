"""``rankscope check``: every part and manifest entry of a store verified, and what a repair would do.

Nothing is changed: each problem is one line naming the file and what is wrong, with the repair it calls
for (an orphan part is reported and only ever removed with a note; a damaged part's source is re-ingested).
"""

from __future__ import annotations

import json
import os
from dataclasses import field
from pathlib import Path

from rankscope.collectors.integrity import manifest_problem, part_damage, sidecar_record
from rankscope.collectors.orphans import REMOVED_LOG
from rankscope.collectors.part_files import ingest_key
from rankscope.collectors.record_class import record
from rankscope.collectors.store import MANIFEST_DIR, Store


@record(frozen=False)
class CheckResult:
    """What ``check`` found: problems and the repair each calls for (both one line each)."""

    parts: int = 0
    entries: int = 0
    problems: list[str] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)

    def add(self, problem: str, repair: str) -> None:
        self.problems.append(problem)
        self.repairs.append(repair)


def _entries(store: Store, res: CheckResult) -> dict[str, dict]:
    """Manifest entries that parse and fit, by file name; each one that does not is a problem."""
    good = {}
    d = store.root / MANIFEST_DIR
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        res.entries += 1
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            res.add(f"manifest entry {p}: unreadable ({str(e)[:120]})",
                    f"remove {p.name} and ingest its source again")
            continue
        problem = manifest_problem(data)
        if problem:
            res.add(f"manifest entry {p}: {problem}", f"rewrite or remove {p.name} and ingest its source again")
            continue
        good[p.name] = data
    return good


def _deep_damage(path: Path) -> str | None:
    """A part with no recorded hash (live writers, older stores): every page read with its checksum."""
    import pyarrow.parquet as pq

    try:
        pq.ParquetFile(path, page_checksum_verification=True).read()
    except Exception as e:  # noqa: BLE001 - Arrow raises several types for a damaged file
        return f"it does not read back ({type(e).__name__}: {str(e)[:120]})"
    return None


def check_store(store: Store, full: bool = True) -> CheckResult:
    """Verify every manifest entry and part of ``store``; ``full=False`` compares sizes, not hashes."""
    res = CheckResult()
    entries = _entries(store, res)
    keys = {n[:16] for n in os.listdir(store.root / MANIFEST_DIR)} if (store.root / MANIFEST_DIR).is_dir() else set()
    recorded = {rel: (name, r) for name, e in entries.items() for rel, r in e.get("parts", {}).items()}
    seen = set()
    for d in sorted(store.root.glob("*/job=*")):
        for name in sorted(os.listdir(d)):
            p, rel = d / name, f"{d.parent.name}/{d.name}/{name}"
            if name.startswith(".") and name.endswith(".tmp"):
                res.add(f"temp file {p}: left by a crashed writer", f"remove {p.name}")
                continue
            if not (name.startswith("part") and name.endswith(".parquet")):
                continue
            res.parts += 1
            seen.add(rel)
            key = ingest_key(name)
            if key is not None and key not in keys:
                res.add(f"orphan part {p}: no manifest entry commits it (a crashed ingest, or a lost entry); "
                        "readers do not see it", f"remove {p.name}, noting it in {store.root}/{REMOVED_LOG}")
                continue
            owner, rec = recorded.get(rel, (None, None))
            rec = rec if rec is not None else sidecar_record(p)
            why = part_damage(p, rec, full)
            if why is None and rec is None and full:
                why = _deep_damage(p)
            if why:
                fix = f"remove {p.name} and its manifest entry {owner}, then ingest that source again" if owner \
                    else f"remove {p.name} (its records are lost) or restore it from a copy"
                res.add(f"damaged part {p}: {why}", fix)
    for rel, (owner, _) in sorted(recorded.items()):
        if rel not in seen:
            res.add(f"missing part {store.root / rel}: manifest entry {owner} lists it",
                    f"remove manifest entry {owner} and ingest its source again")
    return res
