"""Analysis results cached per store version, so a re-run on an unchanged store is instant.

One computation serves ``analyze``, ``diff``, ``export``, the metrics endpoint
and (later) the dashboard. An entry's key hashes three things:

- the *store version* of the store jobs the result reads: every committed part
  file of those jobs (name, size, mtime) and their manifest entries, so any
  ingest, collector roll or rewrite changes it;
- the *options* (the frozen config dataclasses' repr, the planned job);
- the *code version*: a hash of rankscope's own analysis and loader sources,
  so an upgrade never serves results an older analysis computed.

Entries live under ``<store>/_cache/<key>/`` (JSON and Arrow IPC only: nothing
in a store is ever unpickled). A store that cannot be written is simply not
cached; an unreadable or partial entry is a miss. This module does I/O by
design; the analysis functions it wraps stay pure. ``RANKSCOPE_NO_CACHE=1``
turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from rankscope.analysis.diagnose import DiagnoseConfig
from rankscope.analysis.report.diagnosis import Diagnosis
from rankscope.collectors.schema import SCHEMAS

if TYPE_CHECKING:
    from rankscope.collectors.store import Store

CACHE_DIR = "_cache"
MAX_ENTRIES = 64
"""entries kept per store; the least recently used go first."""
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""the folder that holds analysis/ and collectors/ (this file is analysis/runner/cache.py)."""
_CODE_DIRS = ("analysis", "collectors")


def enabled() -> bool:
    return os.environ.get("RANKSCOPE_NO_CACHE", "") in ("", "0")


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """Hash of the analysis and loader sources (content, not mtimes: a checkout keeps its entries)."""
    h = hashlib.sha256()
    for d in _CODE_DIRS:
        for p in sorted((_PACKAGE_ROOT / d).rglob("*.py")):
            h.update(p.relative_to(_PACKAGE_ROOT).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def store_version(store: Store, jobs: Iterable[str]) -> str:
    """Changes whenever the records of ``jobs`` change: their committed parts and manifest entries."""
    jobs = sorted({j for j in jobs if j})
    h = hashlib.sha256(str(Path(store.root).resolve()).encode())
    for kind in SCHEMAS:
        for job in jobs:
            for p in store.parts(kind, job):
                try:
                    st = p.stat()
                except OSError:
                    continue
                h.update(f"{kind}/{job}/{p.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for m in sorted(store.manifest(), key=lambda m: m.key):
        if m.job in jobs:
            h.update(f"{m.key}:{m.ingested_at}:{m.relative_time}\n".encode())
    return h.hexdigest()[:32]


def result_key(what: str, versions: Iterable[str], options: object) -> str:
    """The entry key of one result: what was computed, from which store versions, with which options."""
    text = "\n".join([what, code_version(), *versions, repr(options)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class ResultCache:
    """Entries of one store. Reads and writes never raise: a failure is a miss or a skipped write."""

    def __init__(self, store: Store):
        self.root = Path(store.root) / CACHE_DIR
        self.on = enabled()

    def _entry(self, key: str) -> Path:
        return self.root / key

    def _get(self, key: str) -> Path | None:
        if not self.on:
            return None
        e = self._entry(key)
        if not (e / "done").is_file():
            return None
        try:
            os.utime(e)  # recently used: kept longest by the pruning
        except OSError:
            pass
        return e

    def _put(self, key: str, fill: Callable[[Path], None]) -> None:
        if not self.on:
            return
        tmp = self.root / f".{key}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            tmp.mkdir(parents=True)
            fill(tmp)
            (tmp / "done").write_bytes(b"")
            final = self._entry(key)
            if final.exists():
                shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            self._prune()
        except (OSError, TypeError, ValueError):
            pass  # a cache that cannot be written (read-only store, a value JSON cannot hold) is a miss
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _prune(self) -> None:
        entries = [p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")]
        if len(entries) <= MAX_ENTRIES:
            return
        entries.sort(key=lambda p: p.stat().st_mtime)
        for p in entries[:len(entries) - MAX_ENTRIES]:
            shutil.rmtree(p, ignore_errors=True)

    # ------------------------------------------------------------ JSON and bytes
    def get_json(self, key: str):
        e = self._get(key)
        if e is None:
            return None
        try:
            return json.loads((e / "value.json").read_text())
        except (OSError, ValueError):
            return None

    def put_json(self, key: str, value) -> None:
        self._put(key, lambda d: (d / "value.json").write_text(json.dumps(value, default=_plain)))

    def get_bytes(self, key: str) -> bytes | None:
        e = self._get(key)
        if e is None:
            return None
        try:
            return (e / "value.bin").read_bytes()
        except OSError:
            return None

    def put_bytes(self, key: str, data: bytes) -> None:
        self._put(key, lambda d: (d / "value.bin").write_bytes(data))

    # ------------------------------------------------------- Diagnosis + tables
    def get_analysis(self, key: str) -> tuple[Diagnosis, dict[str, pl.DataFrame]] | None:
        e = self._get(key)
        if e is None:
            return None
        try:
            d = Diagnosis.decoded(json.loads((e / "diagnosis.json").read_text()))
            tables = {p.stem: pl.read_ipc(p) for p in sorted((e / "tables").glob("*.arrow"))}
        except (OSError, ValueError, TypeError, KeyError, pl.exceptions.PolarsError):
            return None
        return d, tables

    def put_analysis(self, key: str, d: Diagnosis, tables: dict[str, pl.DataFrame]) -> None:
        def fill(tmp: Path) -> None:
            (tmp / "diagnosis.json").write_text(json.dumps(d.encoded(), default=_plain))
            (tmp / "tables").mkdir()
            for name, frame in tables.items():
                frame.write_ipc(tmp / "tables" / f"{name}.arrow")

        self._put(key, fill)


def _plain(x):
    """numpy scalars and tuples-in-sets for json.dumps (NaN stays NaN: it round-trips)."""
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    raise TypeError(f"cannot cache a {type(x).__name__}")


def cached_analysis(store: Store, planned, config,
                    compute: Callable[[], tuple[Diagnosis, dict[str, pl.DataFrame]]],
                    cache: ResultCache | None = None) -> tuple[Diagnosis, dict[str, pl.DataFrame], bool]:
    """(Diagnosis, tables, hit) of one planned job: from the cache when its store jobs are unchanged."""
    cache = cache or ResultCache(store)
    if not cache.on:  # no key to compute: it hashes every source file and stats every part (~7 ms)
        return (*compute(), False)
    config = config or DiagnoseConfig()  # None and the defaults are one computation
    key = result_key("analyze", [store_version(store, [planned.source, planned.flow_job])],
                     (planned, config))
    got = cache.get_analysis(key)
    if got is not None:
        return got[0], got[1], True
    d, tables = compute()
    cache.put_analysis(key, d, tables)
    return d, tables, False


__all__ = ["CACHE_DIR", "ResultCache", "cached_analysis", "code_version", "result_key",
           "store_version"]
