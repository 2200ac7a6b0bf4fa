"""A store's part files: their names, and writing one so that a crash never leaves half a part visible.

Every file is written to a temporary name in its directory and renamed into place. Ingest parts are
named ``part-<key16>-<time>-<uuid>.parquet`` after their transaction's key (visible only once the
key's manifest entry exists); live writers' parts carry a sidecar hash instead (collectors.integrity).
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
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
