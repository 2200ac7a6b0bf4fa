"""The trace store: Parquet files hive-partitioned by record kind and job.

Layout::

    <store>/<kind>/job=<job>/part-<time>-<uuid>.parquet
    <store>/_manifest/<key>.json        one entry per ingested source

Every file is written to a temporary name in the same directory and renamed
into place, so a crash never leaves a half file under a ``part-*`` name.
The manifest makes ingest idempotent: a source whose content hash is already
recorded for the same job is skipped.

Ingest is a transaction (:meth:`Store.transaction`): it holds the store's
writer lock (``fcntl.flock`` on ``<store>/.writer.lock``), writes its parts
under ``part-<key16>-...`` names and commits by writing its manifest entry.
Readers list only committed ingest parts (a part whose key has no manifest
entry is invisible), so a crash between the first part and the manifest leaves
nothing a reader sees; the next writer removes such orphans and stale temp
files when it takes the lock. Live writers (hooks, the collector, the
simulator) use other part names and stay visible as they write.

Read side: :meth:`Store.scan` gives polars LazyFrames over one kind (all
parts unified to the declared schema, so parts written before a column was
added still read), and :meth:`Store.duckdb` a DuckDB connection with one view
per record kind (empty views for kinds the store does not hold).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from rankscope.collectors.errors import StoreError, UsageError
from rankscope.collectors.integrity import (
    manifest_problem,
    part_damage,
    sidecar_record,
    verify_mode,
)
from rankscope.collectors.orphans import clean_orphans, find_orphans, note_removed
from rankscope.collectors.part_files import Transaction, atomic_write_bytes, ingest_key, write_part
from rankscope.collectors.record_class import record
from rankscope.collectors.schema import SCHEMAS, cast_to, empty, polars_schema, schema, unique_values

if TYPE_CHECKING:
    import pyarrow.dataset as pads

MANIFEST_DIR = "_manifest"
LIVE_DIR = "_live"
"""``rankscope watch`` keeps each job's latest window here (``<job>.json``), for ``rankscope metrics``."""
LOCK_FILE = ".writer.lock"
JOB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Job names become directory names: a letter or digit first (so never ``.`` or ``..``), then up to
127 of letters, digits and ``._-``; matched with fullmatch (a trailing newline does not pass)."""


def check_job_name(job: object) -> str:
    """The one job-name rule, applied on every write and every read path."""
    if not isinstance(job, str) or JOB_NAME_RE.fullmatch(job) is None:
        raise UsageError(f"job name {job!r} is not allowed; expected a letter or digit, then up to 127 "
                         "letters, digits, '.', '_' or '-'")
    return job


@record(frozen=False)
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
    parts: dict[str, dict] = field(default_factory=dict)
    """part path (relative to the store) -> ``{sha256, bytes}`` of each part this source wrote; a read
    checks the parts against it (collectors.integrity). Empty in entries written before it existed."""


_CHECKED: set[tuple[str, int, int, bool]] = set()
"""(part, size, mtime_ns, hashed) of parts this process found whole: a part is immutable once renamed."""


class Store:
    """A trace store rooted at a directory (created on first write)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self._cleaned = False
        self._records: tuple[frozenset[str], dict[str, dict]] | None = None
        self.removed: dict[str, int] = {"parts": 0, "tmp": 0}
        """what the writer lock's clean-up removed (orphan parts, stale temp files), for the caller to say."""
        self._keys: frozenset[str] | None = None
        """the committed keys of a snapshot (:meth:`snapshot`); None: read them afresh on each call."""

    def snapshot(self) -> Store:
        """This store as of now: one set of committed keys for every kind and the manifest.

        Every read of a snapshot (parts, scan, duckdb, manifest, jobs) sees the same commits, so a query
        beside a running ingest never counts comm_op at one commit and compute_op at the next. Parts are
        written before their manifest entry, so each key in the set has all its parts on disk."""
        snap = Store(self.root)
        snap._cleaned = self._cleaned
        snap._keys = frozenset(self.committed_keys())
        return snap

    def require(self) -> Store:
        """This store, or UsageError when its directory does not exist (for read-only commands)."""
        if not self.root.is_dir():
            raise UsageError(f"store {self.root} does not exist or is not a directory; "
                             "expected a store written by rankscope ingest/collect/simulate")
        return self

    # ------------------------------------------------------------ transactions
    @contextlib.contextmanager
    def writer_lock(self, timeout_s: float = 600.0) -> Iterator[None]:
        """Hold the store's exclusive writer lock; cleans up after crashed writers once per Store."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StoreError(f"cannot open store {self.root} for writing: {e.strerror or e}") from e
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreError(f"store {self.root} is locked by another writer for "
                                         f"{timeout_s:.0f} s; expected it to finish") from None
                    time.sleep(0.05)
            if not self._cleaned:
                self.clean_orphans()
                self._cleaned = True
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    @contextlib.contextmanager
    def transaction(self, key: str, keep_rows: bool = False, replace: bool = False) -> Iterator[Transaction]:
        """Write parts and then the manifest entry (the commit) under the writer lock.

        Leaving the block by an exception removes every part written so far. ``replace``: a source already
        committed under ``key`` is uncommitted first (its entry removed, then its parts, with a note), so a
        retry replaces what an earlier try wrote instead of adding to it.
        """
        with self.writer_lock():
            replaced = replace and self.has_source(key)
            if replaced:
                (self.manifest_dir() / f"{key}.json").unlink()  # uncommitted: its parts are orphans now
            # Parts under this key without its manifest entry are a crashed earlier try.
            stale = [] if self.has_source(key) else list(self.root.glob(f"*/job=*/part-{key[:16]}-*.parquet"))
            for p in stale:
                p.unlink(missing_ok=True)
            if stale:
                self.removed["parts"] += len(stale)
                note_removed(self.root, [f"{p.relative_to(self.root)}\tpart of an earlier try of this source, "
                                         f"{'replaced' if replaced else 'never committed'}" for p in stale])
            tx = Transaction(self, key, keep_rows)
            try:
                yield tx
            except BaseException:
                tx.rollback()
                raise

    def committed_keys(self) -> set[str]:
        """The 16-character prefixes of every manifest key (names only, no file is read)."""
        if self._keys is not None:
            return set(self._keys)
        try:
            return {n[:16] for n in os.listdir(self.manifest_dir()) if n.endswith(".json")}
        except OSError:
            return set()

    def clean_orphans(self) -> dict[str, int]:
        """Remove ingest parts that never got a manifest entry and temp files left by crashes
        (collectors.orphans). Call with the writer lock held."""
        if not self.root.is_dir():
            return {"parts": 0, "tmp": 0}
        removed = clean_orphans(self.root, [*self.root.glob("*/job=*"), self.manifest_dir()], self.committed_keys())
        for k, n in removed.items():
            self.removed[k] += n
        return removed

    # ---------------------------------------------------------------- write
    def write(self, kind: str, table: pa.Table, job: str | None = None, *, prefix: str = "part") -> Path | None:
        """Write rows of one kind as new part file(s), one per job; returns the last path.

        The table must already be in the kind's schema (use schema.validate or
        schema.conform first). When ``job`` is given, it overrides the column.
        """
        written = self.write_parts(kind, table, job, prefix=prefix)
        return written[-1][1] if written else None

    def write_parts(self, kind: str, table: pa.Table, job: str | None = None, *,
                    prefix: str = "part") -> list[tuple[str, Path, pa.Table]]:
        """:meth:`write`, returning ``(job, part path, rows as written)`` for each part file."""
        sch = schema(kind)
        if table.num_rows == 0:
            return []
        if job is not None:
            check_job_name(job)
            i = table.schema.get_field_index("job")
            table = table.set_column(i, sch.field(i), pa.array([job] * table.num_rows, pa.string()))
        if not table.schema.equals(sch, check_metadata=False):
            raise StoreError(f"{kind}: table schema differs from the declared one; validate it first")
        jobs = unique_values(table.column("job"))
        out = []
        for j in jobs:
            check_job_name(j)
            if len(jobs) == 1:
                part = table
            else:
                import pyarrow.compute as pc  # only here: its import is a tenth of a small ingest (schema.cast_to)

                part = table.filter(pc.equal(table.column("job"), j))
            rows = cast_to(part.replace_schema_metadata(None), sch)
            path = write_part(self.root / kind / f"job={j}", rows, prefix)
            out.append((j, path, rows))
        return out

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
        try:
            d.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(d / f"{entry.key}.json", json.dumps(asdict(entry), indent=1, default=str).encode())
        except OSError as e:
            raise StoreError(f"could not write the manifest entry in {d}: {e.strerror or e}") from e

    def has_alias(self, name: str) -> bool:
        """True when decoded records with this fingerprint are already stored (see ingest)."""
        return (self.manifest_dir() / f"{name}.alias").exists()

    def add_alias(self, name: str, key: str) -> None:
        """Record that a source's decoded records (fingerprint ``name``) were committed under ``key``."""
        try:
            atomic_write_bytes(self.manifest_dir() / f"{name}.alias", key.encode())
        except OSError as e:
            raise StoreError(f"could not write {name}.alias in {self.manifest_dir()}: {e.strerror or e}") from e

    def write_live(self, job: str, data: dict) -> None:
        """Replace a job's latest live window (``rankscope watch``) in one rename."""
        d = self.root / LIVE_DIR
        try:
            d.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(d / f"{check_job_name(job)}.json", json.dumps(data, allow_nan=False).encode())
        except OSError as e:
            raise StoreError(f"cannot write the live window of job {job} under {d}: {e.strerror or e}") from e

    def live(self) -> dict[str, dict]:
        """Each job's latest live window (job -> its event object); a file that does not parse is skipped."""
        out = {}
        d = self.root / LIVE_DIR
        for p in sorted(d.glob("*.json")) if d.is_dir() else []:
            try:
                out[p.stem] = json.loads(p.read_text())
            except (OSError, ValueError):
                continue  # replaced or removed while being read: the next scrape reads the new one
        return out

    def manifest(self) -> list[ManifestEntry]:
        d = self.manifest_dir()
        out = []
        if not d.is_dir():
            return out
        keys = self._keys
        for p in sorted(d.glob("*.json")):
            if keys is not None and p.name[:16] not in keys:
                continue  # committed after this snapshot was taken
            try:
                data = json.loads(p.read_text())
            except (OSError, ValueError) as e:
                raise StoreError(f"manifest entry {p} is unreadable: {e}") from e
            problem = manifest_problem(data)
            if problem is not None:
                raise StoreError(f"manifest entry {p} is damaged: {problem}; `rankscope check --store "
                                 f"{self.root}` lists what to repair")
            out.append(ManifestEntry(**data))
        return out

    def part_records(self) -> dict[str, dict]:
        """Relative part path -> the ``{sha256, bytes}`` its manifest entry recorded (committed entries)."""
        keys = frozenset(self.committed_keys())
        if self._records is None or self._records[0] != keys:
            recs = {rel: r for m in self.manifest() for rel, r in m.parts.items() if isinstance(r, dict)}
            self._records = (keys, recs)
        return self._records[1]

    def checked(self, paths: list[Path]) -> list[Path]:
        """``paths``, each checked against its manifest record (collectors.integrity); StoreError names the
        first damaged part in one line. Parts already checked unchanged in this process are not re-read."""
        if not paths:
            return paths
        recs = self.part_records()
        stats = []
        for p in paths:
            try:
                st = p.stat()
            except OSError as e:
                raise StoreError(f"store part {p} cannot be read: {e.strerror or e}") from e
            stats.append((p, st.st_size, st.st_mtime_ns))
        full = verify_mode(sum(s for _, s, _ in stats)) == "full"
        for p, size, mtime in stats:
            if (str(p), size, mtime, full) in _CHECKED or (str(p), size, mtime, True) in _CHECKED:
                continue
            rec = recs.get(p.relative_to(self.root).as_posix())
            why = part_damage(p, rec if rec is not None else sidecar_record(p), full)
            if why is not None:
                raise StoreError(f"store part {p} is damaged: {why}; `rankscope check --store {self.root}` "
                                 "lists what to repair")
            _CHECKED.add((str(p), size, mtime, full))
        return paths

    def orphans(self) -> list[Path]:
        """Ingest parts no manifest entry commits, while no writer holds the lock (so none is mid-commit):
        a crashed ingest or a lost entry. Readers do not see them; ``info`` and ``check`` say so."""
        return find_orphans(self.root, self.root / LOCK_FILE, self.committed_keys(),
                            lambda: Store(self.root).committed_keys())

    def relative_jobs(self) -> set[str]:
        """Jobs with at least one source whose times are relative, not epoch."""
        return {m.job for m in self.manifest() if m.relative_time}

    # ----------------------------------------------------------------- read
    def _visible(self, names: Iterable[str], keys: set[str]) -> list[str]:
        out = []
        for n in names:
            if not (n.startswith("part") and n.endswith(".parquet")):
                continue
            key = ingest_key(n)
            if key is None or key in keys:
                out.append(n)
        return out

    def parts(self, kind: str, job: str | None = None, verify: bool = True) -> list[Path]:
        """Committed part files of one kind (and job), each checked (:meth:`checked`) unless ``verify`` is
        False (a caller that checks part by part, to go on past a damaged one). The job name is checked
        like on write."""
        schema(kind)
        if job is not None:
            check_job_name(job)
        base = self.root / kind
        if not base.is_dir():
            return []
        keys = self.committed_keys()
        dirs = [base / f"job={job}"] if job is not None else sorted(base.glob("job=*"))
        out = []
        for d in dirs:
            if d.name[4:] and JOB_NAME_RE.fullmatch(d.name[4:]) and d.is_dir() and not d.is_symlink():
                out.extend(d / n for n in self._visible(os.listdir(d), keys))
        return self.checked(sorted(out)) if verify else sorted(out)

    def jobs(self, kind: str | None = None) -> list[str]:
        """Jobs with at least one committed part (of one kind, or of any)."""
        kinds = [kind] if kind else list(SCHEMAS)
        out = set()
        keys = self.committed_keys()
        for k in kinds:
            base = self.root / k
            if not base.is_dir():
                continue
            for d in base.glob("job=*"):
                j = d.name[4:]
                if JOB_NAME_RE.fullmatch(j) and d.is_dir() and not d.is_symlink() \
                        and self._visible(os.listdir(d), keys):
                    out.add(j)
        return sorted(out)

    def dataset(self, kind: str, job: str | None = None) -> pads.Dataset | None:
        # pyarrow.dataset imports pandas (~50 MB, 0.2-0.3 s): only DuckDB and read_arrow need it
        import pyarrow.dataset as pads

        paths = self.parts(kind, job)
        if not paths:
            return None
        # An explicit schema unifies parts written before a column was appended.
        return pads.dataset([str(p) for p in paths], schema=schema(kind).remove_metadata(), format="parquet")

    def scan(self, kind: str, job: str | None = None) -> pl.LazyFrame:
        """A LazyFrame over one record kind (optionally one job); empty when absent."""
        paths = self.parts(kind, job)
        if not paths:
            return pl.from_arrow(empty(kind)).lazy()
        # polars' own reader: no pyarrow dataset (and no pandas import), and no Arrow copy of the columns
        # beside the frame. The explicit schema unifies parts written before a column was appended.
        return pl.scan_parquet([str(p) for p in paths], schema=polars_schema(kind), missing_columns="insert",
                               extra_columns="ignore", hive_partitioning=False)

    def read(self, kind: str, job: str | None = None, columns: Iterable[str] | None = None) -> pl.DataFrame:
        """One kind eagerly as a polars DataFrame."""
        lf = self.scan(kind, job)
        return lf.select(list(columns)).collect() if columns else lf.collect()

    def read_arrow(self, kind: str, job: str | None = None) -> pa.Table:
        ds = self.dataset(kind, job)
        return empty(kind) if ds is None else ds.to_table()

    def count(self, kind: str, job: str | None = None) -> int:
        return sum(pq.read_metadata(p).num_rows for p in self.parts(kind, job))

    def duckdb(self, job: str | None = None):
        """An in-memory DuckDB connection with a view per record kind over the store."""
        import duckdb

        snap = self if self._keys is not None else self.snapshot()
        con = duckdb.connect()
        for kind in SCHEMAS:
            ds = snap.dataset(kind, job)
            if ds is None:
                con.register(f"_empty_{kind}", empty(kind))
                con.execute(f'CREATE VIEW "{kind}" AS SELECT * FROM "_empty_{kind}"')
            else:
                con.register(f"_ds_{kind}", ds)
                con.execute(f'CREATE VIEW "{kind}" AS SELECT * FROM "_ds_{kind}"')
        return con
