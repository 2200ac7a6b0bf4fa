"""A store's part files: their names, writing one so that a crash never leaves half a part visible, and the
transaction that writes one source's parts before its manifest entry makes them visible (the commit).

Every file is written to a temporary name in its directory and renamed into place. Ingest parts are
named ``part-<key16>-<time>-<uuid>.parquet`` after their transaction's key (visible only once the
key's manifest entry exists); live writers' parts carry a sidecar hash instead (collectors.integrity).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rankscope.collectors.errors import StoreError
from rankscope.collectors.integrity import part_record, sidecar

INGEST_PART = re.compile(r"part-([0-9a-f]{16})-\d{20}-")
"""Parts written by an ingest transaction; visible only once their manifest entry exists."""

LIST_VALUES_PER_ROW_GROUP = 1 << 22
"""List values (group member ranks) per Parquet row group: the writer holds a row group's levels at once,
so 2,000 ops of a 100k-rank group in one group cost 1.3 GB more and twice the time of 4M-value groups."""


def ingest_key(name: str) -> str | None:
    """The 16-character transaction key of an ingest part's file name; None for a live writer's part."""
    m = INGEST_PART.match(name)
    return m.group(1) if m else None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def dictionary_columns(sch: pa.Schema) -> list[str]:
    """The columns worth a Parquet dictionary: text (op names, sources, jobs: a handful of values each).

    Arrow's default dictionary-encodes every column, numbers too, until a dictionary outgrows its page (1 MiB),
    which the times and sizes of a part under ~100k rows never do: they were encoded twice and the files
    grew. Text only: a fifth less time writing the OSDI'25 AR trace's parts (38 -> 29 ms) and files a
    quarter smaller."""
    return [f.name for f in sch if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]


def row_group_rows(rows: pa.Table) -> int | None:
    """Rows per row group: Arrow's default, unless the list columns would make a group's values huge."""
    values = sum(len(ch.values) for f in rows.schema if pa.types.is_list(f.type) for ch in rows.column(f.name).chunks)
    if values <= LIST_VALUES_PER_ROW_GROUP or rows.num_rows == 0:
        return None
    return max(1, LIST_VALUES_PER_ROW_GROUP * rows.num_rows // values)


def write_part(d: Path, rows: pa.Table, prefix: str) -> Path:
    """``rows`` (already in their kind's schema) as a new part file in directory ``d``; its path."""
    path = d / f"{prefix}-{time.time_ns():020d}-{uuid.uuid4().hex[:12]}.parquet"
    tmp = d / f".{path.name}.tmp"
    try:
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows, tmp, compression="zstd", use_dictionary=dictionary_columns(rows.schema),
                       row_group_size=row_group_rows(rows), write_page_checksum=True)
        if ingest_key(path.name) is None:
            # a live writer's part has no manifest entry: its hash goes beside it, before it is visible
            atomic_write_bytes(sidecar(path), json.dumps(part_record(tmp)).encode())
        os.replace(tmp, path)
    except OSError as e:
        raise StoreError(f"could not write {path}: {type(e).__name__}: {e.strerror or e}") from e
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


class Transaction:
    """Parts written for one source under the writer lock; :meth:`commit` writes the manifest entry.

    ``store``: the :class:`~rankscope.collectors.store.Store` written to (not imported here: the store imports
    this module)."""

    def __init__(self, store, key: str, keep_rows: bool = False):
        self.store, self.key = store, key
        self.written: list[Path] = []
        self.records: dict[str, dict] = {}
        """relative path -> ``{sha256, bytes}`` of each part written (the manifest entry's ``parts``)."""
        self.committed = False
        self.kept: list[tuple[str, str, Path, pa.Table]] | None = [] if keep_rows else None
        """``(kind, job, part path, rows)`` of every part written, when asked for: the caller that
        analyses what it just ingested reuses them instead of reading the Parquet back."""

    def write(self, kind: str, table: pa.Table) -> None:
        self._note(kind, self._parts(kind, table))

    def write_kinds(self, tables: list[tuple[str, pa.Table]]) -> None:
        """:meth:`write` of each (kind, table), noted kind by kind; two kinds at once (Arrow's Parquet writer
        runs without the GIL: AR tiled 16x's comm_op and compute_op parts, 0.41 -> 0.26 s). The tables of one
        kind are written one after another, in order: part names carry the time they were written, and a store
        is read in part-name order, so the rows keep the order a serial write gives them."""
        kinds = list(dict.fromkeys(kind for kind, _ in tables))
        if len(kinds) < 2:
            for kind, table in tables:
                self.write(kind, table)
            return

        def parts_of(kind: str) -> tuple[list[list], BaseException | None]:
            written = []
            try:
                for k, t in tables:
                    if k == kind:
                        written.append(self._parts(k, t))
            except Exception as e:  # noqa: BLE001 - re-raised below, once what was written is noted
                return written, e
            return written, None

        with ThreadPoolExecutor(2, thread_name_prefix="rankscope-parts") as pool:
            done = {kind: pool.submit(parts_of, kind) for kind in kinds}
        errors = []
        for kind, f in done.items():
            written, error = f.result()
            for parts in written:  # noted even where a kind failed: the rollback removes what it wrote
                self._note(kind, parts)
            if error is not None:
                errors.append(error)
        if errors:
            raise errors[0]

    def _parts(self, kind: str, table: pa.Table) -> list[tuple[str, Path, pa.Table, dict]]:
        return [(job, path, rows, part_record(path))
                for job, path, rows in self.store.write_parts(kind, table, prefix=f"part-{self.key[:16]}")]

    def _note(self, kind: str, parts: list[tuple[str, Path, pa.Table, dict]]) -> None:
        for job, path, rows, rec in parts:
            self.written.append(path)
            self.records[path.relative_to(self.store.root).as_posix()] = rec
            if self.kept is not None:
                self.kept.append((kind, job, path, rows))

    def commit(self, entry) -> None:
        """Write ``entry`` (a :class:`~rankscope.collectors.store.ManifestEntry`) with this transaction's parts."""
        entry.parts = {**entry.parts, **self.records}
        self.store.add_manifest(entry)
        self.committed = True

    def rollback(self) -> None:
        if self.committed:
            return
        self.kept = None if self.kept is None else []
        for p in set(self.written):
            with contextlib.suppress(OSError):
                p.unlink()
