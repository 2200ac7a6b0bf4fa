"""Debris of crashed writers in a store: ingest parts no manifest entry commits, and stale temp files.

Readers never see an uncommitted ingest part (collectors.store lists only committed keys); these
functions find such parts (``rankscope info`` and ``check`` name them) and remove them under the writer
lock, each one noted in ``<store>/_removed.log``, never silently.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from rankscope.collectors.part_files import ingest_key

REMOVED_LOG = "_removed.log"
STALE_TMP_S = 900.0
"""A temp file of a live writer (which holds no lock) older than this is debris from a crash."""


def note_removed(root: Path, lines: list[str]) -> None:
    """Name every removed part in ``<store>/_removed.log``, one line each."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with contextlib.suppress(OSError), open(root / REMOVED_LOG, "a") as f:
        f.write("".join(f"{stamp}\t{line}\n" for line in lines))


def clean_orphans(root: Path, dirs: list[Path], keys: set[str]) -> dict[str, int]:
    """Remove from ``dirs`` the ingest parts whose key is not in ``keys`` and the temp files left by crashes;
    how many of each. Call with the writer lock held: no ingest is then between its first part and its
    commit."""
    removed = {"parts": 0, "tmp": 0}
    gone: list[str] = []
    now = time.time()
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            p = d / name
            key = ingest_key(name)
            try:
                if key is not None and key not in keys:
                    p.unlink()
                    removed["parts"] += 1
                    gone.append(f"{p.relative_to(root)}\torphan part: no manifest entry commits it")
                elif name.startswith(".") and name.endswith(".tmp"):
                    inner = ingest_key(name[1:])
                    if (inner is not None and inner not in keys) or now - p.stat().st_mtime > STALE_TMP_S:
                        p.unlink()
                        removed["tmp"] += 1
            except OSError:
                continue
    if gone:
        note_removed(root, gone)
    return removed


def find_orphans(root: Path, lock_file: Path, keys: set[str], committed: Callable[[], set[str]]) -> list[Path]:
    """Ingest parts under ``root`` whose key is not in ``keys``, while no writer holds ``lock_file`` (so none
    is mid-commit): a crashed ingest or a lost entry. ``committed()`` reads the committed keys afresh."""
    found = [d / n for d in root.glob("*/job=*") if d.is_dir() for n in os.listdir(d)
             if (k := ingest_key(n)) is not None and n.endswith(".parquet") and k not in keys]
    if not found:
        return []
    try:
        fd = os.open(lock_file, os.O_RDONLY)
    except OSError:
        return sorted(found)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        # under the lock no commit is under way: entries written since the listing count too
        now = committed()
        return sorted(p for p in found if ingest_key(p.name) not in now and p.exists())
    except BlockingIOError:
        return []  # a writer is at work: its parts are not orphans yet
    finally:
        os.close(fd)
