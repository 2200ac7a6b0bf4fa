"""The trace store: Parquet files hive-partitioned by record kind and job.

Layout::

    <store>/<kind>/job=<job>/part-<time>-<uuid>.parquet
    <store>/_manifest/<key>.json        one entry per ingested source

Every file is written to a temporary name in the same directory and renamed
into place, so a crash never leaves a half file under a ``part-*`` name.
The manifest makes ingest idempotent: a source whose content hash is already
recorded for the same job is skipped.

Read side: :meth:`Store.scan` gives polars LazyFrames over one kind (all
parts unified to the declared schema, so parts written before a column was
added still read), and :meth:`Store.duckdb` a DuckDB connection with one view
per record kind (empty views for kinds the store does not hold).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from rankscope.collectors.errors import StoreError, UsageError
from rankscope.collectors.schema import SCHEMAS, empty, schema

MANIFEST_DIR = "_manifest"
_JOB_RE = re.compile(r"^[A-Za-z0-9_.:+-]{1,128}$")


def check_job_name(job: str) -> str:
    """Job names become directory names; keep them to a safe alphabet."""
    if not isinstance(job, str) or not _JOB_RE.match(job):
        raise UsageError(f"job name {job!r} is not allowed; expected 1-128 of letters, digits and _.:+-")
    return job


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass
class ManifestEntry:
    """One ingested source."""

    key: str
    """content hash (or a writer's id for live sources) + job; the dedup key."""
    source: str
    """path or description of the source."""
    format: str
    job: str
    sha256: str | None = None
    records: dict[str, int] = field(default_factory=dict)
    """rows stored per record kind."""
    rejects: dict[str, int] = field(default_factory=dict)
    """rows rejected per reason (validation and decoding together)."""
    samples: dict[str, str] = field(default_factory=dict)
    """a short example per reject reason, for debugging."""
    relative_time: bool = False
    """True when the source's times are relative (stored from 0), not Unix epoch."""
    notes: dict = field(default_factory=dict)
    ingested_at: float = field(default_factory=time.time)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
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


class Store:
    """A trace store rooted at a directory (created on first write)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    # ---------------------------------------------------------------- write
    def write(self, kind: str, table: pa.Table, job: str | None = None, *, prefix: str = "part") -> Path | None:
        """Write rows of one kind as new part file(s), one per job; returns the last path.

        The table must already be in the kind's schema (use schema.validate or
        schema.conform first). When ``job`` is given, it overrides the column.
        """
        sch = schema(kind)
        if table.num_rows == 0:
            return None
        if job is not None:
            check_job_name(job)
            i = table.schema.get_field_index("job")
            table = table.set_column(i, sch.field(i), pa.array([job] * table.num_rows, pa.string()))
        if not table.schema.equals(sch, check_metadata=False):
            raise StoreError(f"{kind}: table schema differs from the declared one; validate it first")
        jobs = table.column("job").unique().to_pylist()
        last = None
        for j in jobs:
            check_job_name(j)
            part = table if len(jobs) == 1 else table.filter(pa.compute.equal(table.column("job"), j))
            d = self.root / kind / f"job={j}"
            d.mkdir(parents=True, exist_ok=True)
            path = d / f"{prefix}-{time.time_ns():020d}-{uuid.uuid4().hex[:12]}.parquet"
            tmp = d / f".{path.name}.tmp"
            try:
                pq.write_table(part.replace_schema_metadata(None).cast(sch), tmp, compression="zstd")
                os.replace(tmp, path)
            except OSError as e:
                raise StoreError(f"could not write {path}: {e}") from e
            finally:
                if tmp.exists():
                    tmp.unlink()
            last = path
        return last

    # ------------------------------------------------------------- manifest
    def manifest_dir(self) -> Path:
        return self.root / MANIFEST_DIR

    @staticmethod
    def manifest_key(sha256: str, job: str) -> str:
        return hashlib.sha256(f"{sha256}\0{job}".encode()).hexdigest()[:32]

    def has_source(self, key: str) -> bool:
        return (self.manifest_dir() / f"{key}.json").exists()

    def add_manifest(self, entry: ManifestEntry) -> None:
        d = self.manifest_dir()
        d.mkdir(parents=True, exist_ok=True)
        _atomic_write_bytes(d / f"{entry.key}.json", json.dumps(asdict(entry), indent=1, default=str).encode())

    def manifest(self) -> list[ManifestEntry]:
        d = self.manifest_dir()
        out = []
        if not d.is_dir():
            return out
        for p in sorted(d.glob("*.json")):
            try:
                out.append(ManifestEntry(**json.loads(p.read_text())))
            except (OSError, ValueError, TypeError) as e:
                raise StoreError(f"manifest entry {p} is unreadable: {e}") from e
        return out

    def relative_jobs(self) -> set[str]:
        """Jobs with at least one source whose times are relative, not epoch."""
        return {m.job for m in self.manifest() if m.relative_time}

    # ----------------------------------------------------------------- read
    def parts(self, kind: str, job: str | None = None) -> list[Path]:
        schema(kind)
        base = self.root / kind
        if not base.is_dir():
            return []
        pattern = f"job={job}/*.parquet" if job is not None else "job=*/*.parquet"
        return sorted(p for p in base.glob(pattern) if p.name.startswith("part"))

    def jobs(self, kind: str | None = None) -> list[str]:
        kinds = [kind] if kind else list(SCHEMAS)
        out = set()
        for k in kinds:
            base = self.root / k
            if base.is_dir():
                out.update(p.name[4:] for p in base.glob("job=*") if any(p.glob("part*.parquet")))
        return sorted(out)

    def dataset(self, kind: str, job: str | None = None) -> pads.Dataset | None:
        paths = self.parts(kind, job)
        if not paths:
            return None
        # An explicit schema unifies parts written before a column was appended.
        return pads.dataset([str(p) for p in paths], schema=schema(kind).remove_metadata(), format="parquet")

    def scan(self, kind: str, job: str | None = None) -> pl.LazyFrame:
        """A LazyFrame over one record kind (optionally one job); empty when absent."""
        ds = self.dataset(kind, job)
        if ds is None:
            return pl.from_arrow(empty(kind)).lazy()
        return pl.scan_pyarrow_dataset(ds)

    def read(self, kind: str, job: str | None = None, columns: Iterable[str] | None = None) -> pl.DataFrame:
        """One kind eagerly as a polars DataFrame."""
        ds = self.dataset(kind, job)
        if ds is None:
            df = pl.from_arrow(empty(kind))
            return df.select(list(columns)) if columns else df
        return pl.from_arrow(ds.to_table(columns=list(columns) if columns else None))

    def read_arrow(self, kind: str, job: str | None = None) -> pa.Table:
        ds = self.dataset(kind, job)
        return empty(kind) if ds is None else ds.to_table()

    def count(self, kind: str, job: str | None = None) -> int:
        ds = self.dataset(kind, job)
        return 0 if ds is None else ds.count_rows()

    def duckdb(self, job: str | None = None):
        """An in-memory DuckDB connection with a view per record kind over the store."""
        import duckdb

        con = duckdb.connect()
        for kind in SCHEMAS:
            ds = self.dataset(kind, job)
            if ds is None:
                con.register(f"_empty_{kind}", empty(kind))
                con.execute(f'CREATE VIEW "{kind}" AS SELECT * FROM "_empty_{kind}"')
            else:
                con.register(f"_ds_{kind}", ds)
                con.execute(f'CREATE VIEW "{kind}" AS SELECT * FROM "_ds_{kind}"')
        return con
