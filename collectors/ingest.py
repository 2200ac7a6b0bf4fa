"""The ingest engine: files in, validated record kinds into the store, once.

For each file: hash it, skip it when the manifest already holds that hash for
the same job, detect its format, let the importer decode it, validate every
table against its record kind, write the good rows and record counts and
rejects in the manifest. A file that fails as a whole is reported with its
reason and never stops the others.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa

from rankscope.collectors import formats
from rankscope.collectors.errors import InputFormatError, RankscopeError
from rankscope.collectors.schema import validate
from rankscope.collectors.store import ManifestEntry, Store, check_job_name, file_sha256

FLOW_KINDS = ("flow", "interface_counter")


def default_job(kind: str) -> str:
    """Without --job: flows belong to the capture ``fabric``, everything else to ``default``."""
    return "fabric" if kind in FLOW_KINDS else "default"


@dataclass
class FileResult:
    path: str
    status: str
    """ingested, skipped (already in the store), failed, or unknown (no importer)."""
    format: str | None = None
    records: dict[str, int] = field(default_factory=dict)
    rejects: Counter = field(default_factory=Counter)
    error: str | None = None


@dataclass
class IngestSummary:
    files: list[FileResult] = field(default_factory=list)

    @property
    def records(self) -> Counter:
        c = Counter()
        for f in self.files:
            c.update(f.records)
        return c

    @property
    def rejects(self) -> Counter:
        c = Counter()
        for f in self.files:
            c.update(f.rejects)
        return c

    def count(self, status: str) -> int:
        return sum(1 for f in self.files if f.status == status)


def expand_paths(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Files named, and files under directories named (recursively, hidden ones skipped)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.is_file()
                              and not any(part.startswith(".") for part in f.relative_to(p).parts)))
        else:
            out.append(p)
    return out


def _fill_job_source(table: pa.Table | pl.DataFrame, kind: str, job: str | None, source: str) -> pl.DataFrame:
    df = pl.from_arrow(table) if isinstance(table, pa.Table) else table
    job_value = job or default_job(kind)
    if job is not None or "job" not in df.columns:
        df = df.with_columns(pl.lit(job_value).alias("job"))
    else:
        df = df.with_columns(pl.col("job").cast(pl.String).fill_null(job_value))
    if "source" not in df.columns:
        df = df.with_columns(pl.lit(source).alias("source"))
    else:
        df = df.with_columns(pl.col("source").cast(pl.String).fill_null(source))
    return df


def ingest_file(store: Store, path: Path, fmt: str = "auto",
                opts: formats.ImportOptions | None = None) -> FileResult:
    """Ingest one file; never raises for bad input (the result says what happened)."""
    opts = opts or formats.ImportOptions()
    res = FileResult(str(path), "failed")
    try:
        if not path.is_file():
            raise InputFormatError(path, None, "an existing regular file", got="missing")
        name = formats.detect(path) if fmt == "auto" else fmt
        if name is None:
            res.status = "unknown"
            res.error = f"{path}: no importer recognises this file (use --format; known: {formats.names()})"
            return res
        res.format = name
        sha = file_sha256(path)
        key = Store.manifest_key(sha, (opts.job or "") + "\0" + name)
        if store.has_source(key):
            res.status = "skipped"
            return res
        remove_partial(store, key)
        imp = formats.importer(name)
        total = formats.ImportBatch()
        for b in formats.as_batches(imp.read(path, opts)):
            total.merge(b)
        entry = ManifestEntry(key=key, source=str(path.resolve()), format=name,
                              job=opts.job or "", sha256=sha, relative_time=total.relative_time,
                              notes=total.notes)
        res.rejects.update(total.rejects)
        entry.samples.update(total.samples)
        jobs = set()
        for kind, tables in total.tables.items():
            for t in tables:
                df = _fill_job_source(t, kind, opts.job, getattr(imp, "source", name))
                v = validate(df, kind)
                res.rejects.update(v.rejects)
                for reason, idx in v.samples.items():
                    entry.samples.setdefault(reason, f"{kind} row {idx}")
                if v.table.num_rows:
                    store.write(kind, v.table, prefix=f"part-{key[:16]}")
                    res.records[kind] = res.records.get(kind, 0) + v.table.num_rows
                    jobs.update(v.table.column("job").unique().to_pylist())
        entry.records = dict(res.records)
        entry.rejects = dict(res.rejects)
        entry.job = opts.job or ",".join(sorted(jobs))
        store.add_manifest(entry)
        res.status = "ingested"
    except RankscopeError as e:
        res.error = str(e)
        res.rejects[f"file: {type(e).__name__}"] += 1
    except (OSError, ValueError, KeyError, IndexError, TypeError, EOFError) as e:
        # Decoders are written to raise InputFormatError; anything else is still one bad file.
        res.error = f"{path}: {type(e).__name__}: {e}"
        res.rejects[f"file: {type(e).__name__}"] += 1
    return res


def remove_partial(store: Store, key: str) -> int:
    """Remove parts left by an earlier ingest of this source that crashed before its manifest entry."""
    removed = 0
    if store.root.is_dir():
        for p in store.root.glob(f"*/job=*/part-{key[:16]}-*.parquet"):
            p.unlink()
            removed += 1
    return removed


def ingest(store: Store, paths: Iterable[str | os.PathLike], fmt: str = "auto",
           opts: formats.ImportOptions | None = None,
           progress: Callable[[Iterable[Path]], Iterable[Path]] | None = None) -> IngestSummary:
    """Ingest files and directories; companion files (read by another importer) are skipped."""
    opts = opts or formats.ImportOptions()
    if opts.job is not None:
        check_job_name(opts.job)
    files = [p for p in expand_paths(paths) if fmt != "auto" or not formats.is_companion(p)]
    summary = IngestSummary()
    for path in (progress(files) if progress else files):
        summary.files.append(ingest_file(store, path, fmt, opts))
    return summary
