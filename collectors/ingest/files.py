"""The ingest engine: files in, validated record kinds into the store, once.

For each file: hash it, skip it when the manifest already holds that hash for
the same job, detect its format, let the importer decode it (within the
limits of :class:`contract.Limits`), validate every table against its record
kind, then in one store transaction write the good rows and commit the
manifest entry with counts and rejects. A file that fails as a whole (an
error, or every record rejected) is reported with its reason, leaves no rows
and never stops the others; any exception is caught at the file boundary.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import field, replace
from pathlib import Path

import polars as pl
import pyarrow as pa

from rankscope.collectors.errors import InputFormatError, RankscopeError, StoreError
from rankscope.collectors.flows import template_state
from rankscope.collectors.importers import compression, contract
from rankscope.collectors.ingest import parallel_decode, registry
from rankscope.collectors.integrity import file_sha256
from rankscope.collectors.record_class import record
from rankscope.collectors.schema import unique_values, validate
from rankscope.collectors.store import ManifestEntry, Store, check_job_name

FLOW_KINDS = ("flow", "interface_counter")


def default_job(kind: str) -> str:
    """Without --job: flows belong to the capture ``fabric``, everything else to ``default``."""
    return "fabric" if kind in FLOW_KINDS else "default"


@record(frozen=False)
class FileResult:
    path: str
    status: str
    """ingested, skipped (already in the store), failed, or unknown (no importer)."""
    format: str | None = None
    records: dict[str, int] = field(default_factory=dict)
    rejects: Counter = field(default_factory=Counter)
    error: str | None = None
    unexpected: bool = False
    """The error was not one rankscope raises on purpose (a decoder bug: what the fuzzer counts)."""
    warnings: list[str] = field(default_factory=list)
    """What was assumed to read the file (also kept in its manifest entry's notes)."""
    kept: list = field(default_factory=list, repr=False)
    """``(kind, job, part path, rows)`` of each part the file committed, when ingest was asked to keep
    them (``keep_rows``): ``analyze --ingest`` analyses these instead of reading the Parquet back."""


@record(frozen=False)
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


def not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists but is not a regular file (a FIFO blocks the first read for ever)."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    for test, word in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return word
    return None


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


def default_job_for_format(name: str) -> str:
    """The job records of a format land in without --job (flow formats: ``fabric``)."""
    return "fabric" if ".flows." in registry.IMPORTERS.get(name, "") else "default"


def _stored(store: Store, keys: list[str]) -> bool:
    """Whether any of a source's keys (:func:`source_keys`) is in the store already."""
    return any(store.has_source(k) for k in keys)


def source_rank(path: Path, name: str, opts: contract.ImportOptions) -> int | None:
    """The rank a per-rank format's file is of (``--opt rank=N``, else its name), before decoding it.

    Part of the source's identity: two ranks can write identical bytes (two flight-recorder dumps with
    no unfinished call), and both are sources. None for formats whose files are not one rank's."""
    pattern = getattr(registry.importer(name), "rank_in_name", None)
    try:
        return None if pattern is None else contract.file_rank(path, opts, pattern)
    except InputFormatError:
        return None  # a bad --opt rank is reported when the file is decoded; the key then needs none


def source_keys(sha: str, name: str, job: str | None, rank: int | None = None) -> tuple[str, list[str]]:
    """(the key to record, every key that means 'this source is already in the store').

    The key is the content hash + format + job (+ the rank, for one rank's file: :func:`source_rank`),
    with the default job spelled one way (no --job and ``--job default`` are the same ingest); older
    stores keyed a missing --job as an empty name, so that spelling is looked up too.
    """
    dflt = default_job_for_format(name)
    if rank is not None:
        name = f"{name}\0rank {rank}"
    key = Store.manifest_key(sha, (job or dflt) + "\0" + name)
    legacy = [Store.manifest_key(sha, (job or "") + "\0" + name)]
    if job == dflt:
        legacy.append(Store.manifest_key(sha, "\0" + name))
    return key, [key, *legacy]


FINGERPRINT_MAX_ROWS = 2_000_000
"""Above this many rows a source is not fingerprinted (the sort would cost more than a duplicate)."""


def rows_digest(valid: list[tuple[str, pa.Table]]) -> str | None:
    """A hash of decoded records that ignores row order and the ``source`` column."""
    if sum(t.num_rows for _, t in valid) > FINGERPRINT_MAX_ROWS:
        return None
    h = hashlib.sha256()
    for kind, t in sorted(valid, key=lambda kt: kt[0]):
        df = _lists_as_text(t.drop_columns([c for c in ("source",) if c in t.column_names]))
        h.update(kind.encode() + b"\0" + df.sort(df.columns, nulls_last=True).write_csv().encode())
    return h.hexdigest()


def _list_digests(arr: pa.Array) -> list[str | None]:
    """The sha256 of each list's values, read in place (offsets into the values buffer, no copy)."""
    import numpy as np

    offsets = arr.offsets.to_numpy()
    values = np.ascontiguousarray(arr.values.to_numpy(zero_copy_only=False))
    valid = np.ones(len(arr), dtype=bool) if arr.null_count == 0 else \
        np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))
    return [hashlib.sha256(values[offsets[i]:offsets[i + 1]].tobytes()).hexdigest() if valid[i] else None
            for i in range(len(arr))]


def _lists_as_text(t: pa.Table) -> pl.DataFrame:
    """The table for the digest, list columns as text: each list joined with commas, or, where the lists
    hold more than :data:`FINGERPRINT_MAX_ROWS` values in all, each row's list as the sha256 of its values
    (a 100k-rank group on 2,000 rows as text was 200M numbers and GBs; hashed in place it is no copy)."""
    big = {}
    for c in [f.name for f in t.schema if pa.types.is_list(f.type) or pa.types.is_large_list(f.type)]:
        col = t.column(c)
        if sum(len(ch.values) for ch in col.chunks) <= FINGERPRINT_MAX_ROWS:
            continue
        big[c] = pl.Series(c, [h for ch in col.chunks for h in _list_digests(ch)], dtype=pl.String)
    df = pl.from_arrow(t.drop_columns(list(big))) if big else pl.from_arrow(t)
    df = df.with_columns(pl.col(c).cast(pl.List(pl.String)).list.join(",") for c, d in df.schema.items()
                         if isinstance(d, pl.List))
    return df.with_columns(big.values()).select(t.column_names) if big else df


def _fingerprint(imp, valid: list[tuple[str, pa.Table]], job_key: str, rank: object = None) -> str | None:
    """A key for the decoded records, for formats in which one source can be written several ways
    (a flight recorder dump as pickle or as JSON): the second form adds nothing. The file's rank is part
    of it: two ranks' dumps with no records decode to the same (empty) rows and are still two sources."""
    if not getattr(imp, "same_records_any_form", False):
        return None
    digest = rows_digest(valid)
    if digest is not None and rank is not None:
        job_key = f"{job_key}\0rank {rank}"
    return None if digest is None else "rows-" + Store.manifest_key(digest, job_key + "\0" + imp.name)


def ingest_file(store: Store, path: Path, fmt: str = "auto",
                opts: contract.ImportOptions | None = None,
                lim: contract.Limits | None = None,
                decoded: Callable[[Path], contract.ImportBatch | None] | None = None,
                keep_rows: bool = False, sha: str | None = None) -> FileResult:
    """Ingest one file; never raises for bad input (the result says what happened).

    ``decoded(path)``, when given, may hand over the file's decode done elsewhere (ingest.parallel_decode);
    ``sha``: the file's SHA-256 when the caller hashed it already.

    The file's rows become visible only when its manifest entry is written (one
    transaction under the store's writer lock); a failed file leaves no rows.
    """
    opts = opts or contract.ImportOptions()
    res = FileResult(str(path), "failed")

    def run() -> None:
        with contract.limits(lim or contract.Limits()), template_state.session(store, opts.job):
            try:
                decode_and_write(store, path, fmt, opts, res, decoded, keep_rows, sha)
            finally:
                res.warnings.extend(template_state.warnings())

    at_file_boundary(store, path, res, run)
    return res


def at_file_boundary(store: Store, path: Path, res: FileResult, run: Callable[[], None]) -> None:
    """``run()``, with whatever it raises turned into ``res``'s failure (the one boundary of a file's ingest,
    shared by the serial ingest and the Ray tasks' staged one: the same errors and rejects either way)."""
    try:
        run()
    except StoreError as e:
        # the store, not the file, failed (a full disk): name both, and count no record of the file as bad
        res.status, res.error = "failed", f"{path}: not stored in {store.root}: {e}"
    except RankscopeError as e:
        res.status, res.error = "failed", str(e)
        res.rejects[f"file: {type(e).__name__}"] += 1
    except RecursionError:
        res.unexpected = True
        res.status, res.error = "failed", f"{path}: expected nesting of a sane depth, got deeper (RecursionError)"
        res.rejects["file: nesting too deep"] += 1
    except MemoryError:
        res.unexpected = True
        res.status, res.error = "failed", f"{path}: ran out of memory decoding it (use --max-bytes to bound input)"
        res.rejects["file: out of memory"] += 1
    except Exception as e:  # noqa: BLE001 - the file boundary: one bad file never stops the rest
        res.unexpected = True
        res.status, res.error = "failed", f"{path}: could not be decoded: {type(e).__name__}: {str(e)[:300]}"
        res.rejects[f"file: {type(e).__name__}"] += 1
    if res.status == "failed":
        res.records.clear()  # the transaction was rolled back: nothing of this file is stored
        res.kept = []


ASSUMPTION_NOTES = ("rank_assumed",)
"""Manifest notes that say an importer had to assume something the file did not tell."""


def decode_and_write(store: Store, path: Path, fmt: str, opts: contract.ImportOptions, res: FileResult,
                     decoded: Callable[[Path], contract.ImportBatch | None] | None = None,
                     keep_rows: bool = False, sha: str | None = None, staged=None) -> None:
    """One file's ingest inside :func:`at_file_boundary` (raises for bad input); ``staged``
    (collectors.ingest.staged.Staged): write the parts there and leave the commit to its caller."""
    if not path.is_file():
        raise InputFormatError(path, None, "an existing regular file", got=not_regular(path) or "missing")
    _refuse_compression(path)
    name = registry.detect(path) if fmt == "auto" else fmt
    if name is None:
        res.status = "unknown"
        res.error = f"{path}: no importer recognises this file"
        return
    res.format = name
    sha = sha or file_sha256(path)
    key, known = source_keys(sha, name, opts.job, source_rank(path, name, opts))
    if _stored(store, known):
        res.status = "skipped"
        return
    imp = registry.importer(name)
    result = decoded(path) if decoded is not None else None
    if result is None:
        result = imp.read(path, opts)
    if isinstance(result, contract.ImportBatch) or getattr(imp, "same_records_any_form", False):
        _write_whole(store, path, name, imp, result, key, known, sha, opts, res, keep_rows, staged)
    else:
        _write_streamed(store, path, name, imp, result, key, known, sha, opts, res, keep_rows, staged)


def _refuse_compression(path: Path) -> None:
    """zstd, and compression inside compression, refused by name before any importer guesses at them."""
    with open(path, "rb") as f:
        magic = f.read(8)
    outer = compression.compression_of(magic)
    if outer is not None:
        compression.refuse_unsupported(path, magic)
        inner = contract.read_head(path)[:8]
        if inner != magic:  # the same bytes: the head could not be decompressed (the importer will say why)
            compression.refuse_nested(path, outer, inner)


def _entry(path: Path, name: str, key: str, sha: str, opts: contract.ImportOptions) -> ManifestEntry:
    return ManifestEntry(key=key, source=str(path.resolve()), format=name, job=opts.job or "", sha256=sha)


def _take_notes(entry: ManifestEntry, batch: contract.ImportBatch, res: FileResult) -> None:
    entry.relative_time = entry.relative_time or batch.relative_time
    entry.notes.update(batch.notes)
    res.rejects.update(batch.rejects)
    for k, v in batch.samples.items():
        entry.samples.setdefault(k, v)


def _validated(batch: contract.ImportBatch, imp, name: str, opts: contract.ImportOptions, entry: ManifestEntry,
               res: FileResult) -> list[tuple[str, pa.Table]]:
    """The batch's tables checked against their record kinds (rejects counted into ``res``)."""
    valid: list[tuple[str, pa.Table]] = []
    for kind, tables in batch.tables.items():
        for t in tables:
            df = _fill_job_source(t, kind, opts.job, getattr(imp, "source", name))
            v = validate(df, kind)
            res.rejects.update(v.rejects)
            for reason, idx in v.samples.items():
                entry.samples.setdefault(reason, f"{kind} row {idx}")
            if v.table.num_rows:
                valid.append((kind, v.table))
    return valid


def refuse_all_rejected(path: Path, res: FileResult, entry: ManifestEntry) -> None:
    """Raise, naming the commonest reason, when every record was rejected (not while data sets wait for a template)."""
    if res.rejects and not entry.notes.get("flow_sets_held_for_template"):
        top, n = res.rejects.most_common(1)[0]
        raise InputFormatError(path, None, "at least one record that decodes and fits its record kind",
                               got=f"all {sum(res.rejects.values()):,} rejected, most for {top!r} ({n:,})")


def commit_file(store: Store, tx, key: str, entry: ManifestEntry, res: FileResult, jobs: set, opts, rows_key=None):
    """Write the file's manifest entry in ``tx`` (its rows become visible) and adopt its flow template state."""
    entry.records = dict(res.records)
    entry.rejects = dict(res.rejects)
    # a source without records (a rank's empty flight-recorder dump) still belongs to the job it was
    # ingested for: it says that rank's input is there
    entry.job = opts.job or ",".join(sorted(jobs)) or default_job_for_format(entry.format)
    if rows_key:
        entry.notes["rows_key"] = rows_key
    held = template_state.hold_reason()
    if held:
        raise InputFormatError(entry.source, None, f"templates for every data set; the capture is held: {held}")
    template_state.stage(key)  # flow template state left by this file: adopted iff the entry commits
    tx.commit(entry)
    template_state.promote(key)
    if rows_key:
        store.add_alias(rows_key, key)
    res.status = "ingested"
    res.kept = tx.kept or []


def _write_whole(store: Store, path: Path, name: str, imp, result, key: str, known: list[str], sha: str,
                 opts: contract.ImportOptions, res: FileResult, keep_rows: bool = False, staged=None) -> None:
    """Decode everything, then write it in one transaction (one batch, or a fingerprinted format)."""
    total = contract.ImportBatch()
    for b in contract.as_batches(result):
        total.merge(b)
    entry = _entry(path, name, key, sha, opts)
    _take_notes(entry, total, res)
    res.warnings.extend(str(total.notes[k]) for k in ASSUMPTION_NOTES if total.notes.get(k))
    valid = _validated(total, imp, name, opts, entry, res)
    del total.tables
    if not valid and staged is None:  # staged: the commit decides (template state held elsewhere counts)
        refuse_all_rejected(path, res, entry)
    rows_key = _fingerprint(imp, valid, opts.job or default_job_for_format(name), total.notes.get("rank"))
    with _transaction(store, key, keep_rows, staged) as tx:
        # Re-check under the lock: a concurrent ingest of the same source may have committed.
        if staged is None and (any(store.has_source(k) for k in known) or (rows_key and store.has_alias(rows_key))):
            res.status = "skipped"
            res.rejects.clear()
            return
        jobs = set()
        tx.write_kinds(valid)
        for kind, table in valid:
            res.records[kind] = res.records.get(kind, 0) + table.num_rows
            jobs.update(unique_values(table.column("job")))
        if staged is not None:
            staged.written(key, known, entry, jobs, rows_key, tx)
            return
        commit_file(store, tx, key, entry, res, jobs, opts, rows_key)


def _write_streamed(store: Store, path: Path, name: str, imp, batches, key: str, known: list[str], sha: str,
                    opts: contract.ImportOptions, res: FileResult, keep_rows: bool = False, staged=None) -> None:
    """Validate and write each batch as the importer yields it, so memory holds one batch, not the file.

    The parts stay invisible until the manifest entry commits; a file that fails on the way (or whose
    records were all rejected) is rolled back as a whole, as in the one-batch path.
    """
    entry = _entry(path, name, key, sha, opts)
    with _transaction(store, key, keep_rows, staged) as tx:
        if staged is None and any(store.has_source(k) for k in known):
            res.status = "skipped"
            return
        jobs: set = set()
        for b in batches:
            _take_notes(entry, b, res)
            for kind, table in _validated(b, imp, name, opts, entry, res):
                tx.write(kind, table)
                res.records[kind] = res.records.get(kind, 0) + table.num_rows
                jobs.update(unique_values(table.column("job")))
            b.tables.clear()
        res.warnings.extend(str(entry.notes[k]) for k in ASSUMPTION_NOTES if entry.notes.get(k))
        if staged is not None:
            staged.written(key, known, entry, jobs, None, tx)
            return
        if not res.records:
            refuse_all_rejected(path, res, entry)
        commit_file(store, tx, key, entry, res, jobs, opts)


def _transaction(store: Store, key: str, keep_rows: bool, staged):
    """The store's transaction (its writer lock held until the commit), or, for a Ray task's staged ingest,
    one that writes the parts into the staging area without the lock (the driver commits them)."""
    return store.transaction(key, keep_rows) if staged is None else staged.transaction(key)


def files_to_ingest(paths: Iterable[str | os.PathLike], fmt: str,
                    opts: contract.ImportOptions) -> tuple[IngestSummary, list[Path]]:
    """(a summary holding the paths refused unopened, the files to ingest in the order to ingest them): what
    every ingest engine does first (the Ray one too: collectors.ingest.staged)."""
    if opts.job is not None:
        check_job_name(opts.job)
    summary = IngestSummary()
    named = expand_paths(paths)
    special = {p: what for p in named if (what := not_regular(p))}
    for p, what in special.items():  # refused before anything opens them
        summary.files.append(FileResult(str(p), "failed", error=f"{p}: expected a regular file, got {what}"))
    files = [p for p in named if p not in special and (fmt != "auto" or not registry.is_companion(p))]
    return summary, template_state.capture_order(files)  # flow captures: templates before the data they describe


def ingest(store: Store, paths: Iterable[str | os.PathLike], fmt: str = "auto",
           opts: contract.ImportOptions | None = None,
           progress: Callable[[Iterable[Path]], Iterable[Path]] | None = None,
           lim: contract.Limits | None = None, keep_rows: bool = False) -> IngestSummary:
    """Ingest files and directories; companion files (read by another importer) are skipped.

    ``keep_rows`` keeps each committed part's rows in its :class:`FileResult` (``kept``), for a caller
    that analyses them in the same process (:mod:`rankscope.collectors.fresh_rows`)."""
    opts = opts or contract.ImportOptions()
    if keep_rows and not opts.rows_kept:
        opts = replace(opts, rows_kept=True)
    summary, files = files_to_ingest(paths, fmt, opts)
    lim = lim or contract.Limits()

    shas: dict[Path, str] = {}
    """files hashed for the decode-ahead check, so that their ingest does not hash them again"""

    def in_store(path: Path, name: str) -> bool:
        shas[path] = file_sha256(path)
        return _stored(store, source_keys(shas[path], name, opts.job, source_rank(path, name, opts))[1])

    # before anything else computes: decode workers can only be forked from a single-threaded process
    with parallel_decode.ahead(files, fmt, opts, lim, skip=in_store) as pre:
        for path in (progress(files) if progress else files):
            summary.files.append(ingest_file(store, path, fmt, opts, lim, decoded=pre.take, keep_rows=keep_rows,
                                             sha=shas.pop(path, None)))
    release_freed_heap()
    return summary


def release_freed_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    Arrow's Parquet reader and writer (on the system pool: cli.commands.analyze) allocate from glibc arenas
    of their own threads, and what they free there stays resident: nothing else allocates in those arenas,
    and glibc returns only the top of a heap. For a process that goes on after the ingest (``analyze
    --ingest`` of the OSDI'25 AR trace tiled 16x): RSS after the ingest 733 -> 692 MiB, after the job model
    864 -> 781 MiB, peak 20-60 MiB lower (the analysis' own numpy temporaries fill the heap again); the
    call took ~20 ms there."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: its allocator returns memory its own way
