"""A file's ingest split in two, for ingest engines that decode files in other processes (Ray tasks).

:func:`stage_file` (in a task) runs the serial ingest's own code (collectors.ingest.files) up to the
commit: hash, skip a source already in the store, detect, decode batch by batch, validate, count rejects,
write each batch's parts. The parts go to the store's staging area (``<store>/_staged/<run>/<file>/``, at
the relative paths they will have), not under the writer lock: nothing outside ``<kind>/job=*`` is seen
by readers or removed by another writer's orphan clean-up. :func:`commit_staged` (in the driver, file by
file in the serial ingest's order) moves the parts into the store and writes the manifest entry in one
store transaction under the writer lock (:func:`adopt`), so concurrent writers stay as safe as
with serial ingests: each source's rows become visible at once, with its entry, or never.

Flow template state (collectors.flows.template_state) is what makes a flow file's decode depend on the
files before it: a serial ingest decodes file i with the templates, sampling rates, time bases and held
data sets that files 1..i-1 left. A task cannot know those, so it decodes with none and reports the state
its file left and the exporters its rows name. The driver then commits it only when that decode equals
the serial one: the state committed so far has no entry for any exporter the file touched (templates,
rates, time bases and held data are all per exporter) and the global bounds (held bytes, templates) are
not reached. The committed state becomes the merge of the two, exactly what the serial decoder leaves.
Otherwise (files of one exporter rotated, IPFIX files of the same observation domain) :func:`commit_staged`
returns None and the caller ingests that file the serial way (``files.ingest_file``, in a task), in order.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import field
from pathlib import Path

import pyarrow as pa

from rankscope.collectors.errors import StoreError
from rankscope.collectors.flows import flow_files, template_state
from rankscope.collectors.importers import contract
from rankscope.collectors.ingest import files
from rankscope.collectors.orphans import note_removed
from rankscope.collectors.part_files import Transaction
from rankscope.collectors.record_class import record
from rankscope.collectors.schema import unique_values
from rankscope.collectors.store import ManifestEntry, Store

STAGED_DIR = "_staged"
LOCK_NAME = ".lock"
SPECULATIVE_KEY = "speculative"
MAX_TEMPLATES = 16_384
"""FlowDecoder's default template table size (a merged state above it is left to the serial path)."""
NEW_AREA_GRACE_S = 600
"""Age past which a ``.new-*`` area with its lock free is abandoned: its run died between ``mkdir`` and
``flock`` (a younger one may be a live run about to lock it)."""

PART_ROWS = 1 << 20
"""Rows a task gathers per kind before it writes them as one part. The serial ingest writes each decoded batch
(flow_importers.CHUNK_RECORDS, 32k records) as a part; at 100 M records that is 3,000 parts, and as many
recognition tasks for analyze --engine ray (one per part up to --partition-rows, 1M). Same rows, in the same
order; a task holds at most this many rows (~100 MB of flows) besides its batch."""


class _StagedTransaction(Transaction):
    """A transaction on the staging area's own store (no writer lock: the driver commits), noting the
    exporters of the rows it writes (what the template state check needs) and writing parts of up to
    :data:`PART_ROWS` rows."""

    def __init__(self, root: Path, key: str, exporters: set[str]):
        super().__init__(Store(root), key)
        self.exporters = exporters
        self._held: dict[str, list[pa.Table]] = {}

    def write(self, kind: str, table: pa.Table) -> None:
        if "exporter" in table.column_names:
            self.exporters.update(v for v in unique_values(table.column("exporter")) if v is not None)
        held = self._held.setdefault(kind, [])
        held.append(table)
        if sum(t.num_rows for t in held) >= PART_ROWS:
            self.flush()

    def write_kinds(self, tables: list[tuple[str, pa.Table]]) -> None:
        for kind, table in tables:
            self.write(kind, table)  # gathered, not written: parts come at flush

    def flush(self) -> None:
        """Write what is gathered, one part per kind (and job)."""
        for kind, tables in self._held.items():
            if tables:
                super().write(kind, pa.concat_tables(tables))
        self._held = {}


@record(frozen=False)
class Staged:
    """One file decoded and written to the staging area, waiting for its commit (picklable: a task's result)."""

    root: Path
    """the file's staging directory (a store's layout: ``<kind>/job=<job>/part-<key16>-...``)"""
    result: files.FileResult
    key: str = ""
    known: list[str] = field(default_factory=list)
    entry: ManifestEntry | None = None
    jobs: set = field(default_factory=set)
    rows_key: str | None = None
    parts: dict[str, dict] = field(default_factory=dict)
    """relative path -> ``{sha256, bytes}`` of each staged part"""
    exporters: set[str] = field(default_factory=set)
    state: dict | None = None
    """the flow template state the file's decode left, starting from none (None: not a flow decode)"""
    self_contained: set[str] = field(default_factory=set)
    """exporters whose every record the file decodes with templates it sends itself, before the data
    (flow_files.ipfix_file_self_contained: RFC 5655 files, e.g. an exporter's rotated files)"""

    @contextlib.contextmanager
    def transaction(self, key: str) -> Iterator[Transaction]:
        tx = _StagedTransaction(self.root, key, self.exporters)
        try:
            yield tx
        except BaseException:
            tx.rollback()
            raise

    def written(self, key: str, known: list[str], entry: ManifestEntry, jobs: set, rows_key: str | None,
                tx: Transaction) -> None:
        """Called by the serial code where it would commit."""
        tx.flush()
        self.key, self.known, self.entry, self.jobs, self.rows_key = key, known, entry, jobs, rows_key
        self.parts = dict(tx.records)
        self.result.status = "staged"


def stage_file(store_root: str, path: str, fmt: str, opts: contract.ImportOptions, lim: contract.Limits,
               stage_root: str) -> Staged:
    """In a task: the file ingested as far as the commit, its parts under ``stage_root`` (see the module)."""
    path_ = Path(path)
    st = Staged(Path(stage_root), files.FileResult(path, "failed"))
    store = Store(store_root)

    def run() -> None:
        # a template state of the task's own, starting empty (the store's is read at the commit)
        scratch = Store(st.root / "_templates")
        with contract.limits(lim), template_state.session(scratch, opts.job):
            files.decode_and_write(store, path_, fmt, opts, st.result, staged=st)
            if st.result.status == "staged":
                template_state.stage(SPECULATIVE_KEY)
        left = scratch.root / template_state.STATE_DIR / f"job={opts.job or 'fabric'}" / \
            f"staged-{SPECULATIVE_KEY}.json"
        st.state = json.loads(left.read_text()) if left.exists() else None
        if st.result.status == "staged" and st.result.format == "ipfix_file" and not contract.is_gzip(path_):
            st.self_contained = {f"file/{d}" for d in flow_files.ipfix_file_self_contained(path_) or ()}

    files.at_file_boundary(store, path_, st.result, run)
    if st.result.status != "staged":
        shutil.rmtree(st.root, ignore_errors=True)
    return st


def _exporters(state: dict) -> set[str]:
    """Every exporter named in a template state (export_state's layout)."""
    rows = [(r[1],) for k in ("templates", "held") for r in state.get(k, [])]
    rows += [(r[0],) for k in ("rates", "selector_rates", "system_init_ms") for r in state.get(k, [])]
    return {str(r[0]) for r in rows}


def _held_bytes(state: dict) -> int:
    from rankscope.collectors.flows.flow_decoder import held_cost

    return sum(held_cost(base64.b64decode(r[3])) for r in state.get("held", []))


def independent(committed: dict, st: Staged) -> bool:
    """Whether the file's decode from no template state equals its decode from ``committed`` (the state the
    files before it left), and the merge of the two is the state the serial decode leaves: every exporter
    it touched either has no state there, or has only templates there and decodes in this file with
    templates this file sends first (no rates, time bases or held data sets from earlier files apply to
    it; redefined templates replace theirs in place, as in the serial decoder); and the merged state
    stays in bounds."""
    mine = st.state or {}
    shared = _exporters(committed) & (_exporters(mine) | st.exporters)
    context = {k: committed.get(k, []) for k in ("rates", "selector_rates", "system_init_ms", "held")}
    if shared - st.self_contained or shared & _exporters(context):
        return False
    if mine.get("held") and _held_bytes(committed) + _held_bytes(mine) > template_state.MAX_HELD_BYTES:
        return False
    return len(committed.get("templates", [])) + len(mine.get("templates", [])) <= MAX_TEMPLATES


def commit_staged(store: Store, st: Staged, opts: contract.ImportOptions) -> files.FileResult | None:
    """In the driver, in ingest order: the staged file committed (or skipped, or failed, as the serial ingest
    would have it); None when its decode depends on template state (ingest it the serial way)."""
    res = st.result
    if res.status != "staged":
        return res  # failed, skipped or unknown in the task: nothing of it depends on the files before it
    serial = False

    def run() -> None:
        nonlocal serial
        if _skipped(store, st):  # an earlier file of this ingest was the same source: no state involved
            return
        with template_state.session(store, opts.job):
            try:
                if st.state is not None and not _merge_state(st):
                    serial = True
                    return
                _commit(store, st, opts)
            finally:
                if not serial:
                    res.warnings.extend(template_state.warnings())

    files.at_file_boundary(store, Path(res.path), res, run)
    shutil.rmtree(st.root, ignore_errors=True)
    return None if serial else res


def _merge_state(st: Staged) -> bool:
    """Load the store's committed template state (taking its capture's lock, as a serial decode does) and,
    when the staged decode is independent of it, leave the merged state to be committed with the entry."""
    dec = template_state.new_decoder()
    if not independent(template_state.export_state(dec), st):
        return False
    template_state.import_state(dec, st.state)
    if "flow_sets_held_for_template" in st.entry.notes:
        st.entry.notes["flow_sets_held_for_template"] = dec.held_sets  # the serial note counts all held
    template_state.remember(dec)
    return True


def _skipped(store: Store, st: Staged) -> bool:
    """Whether the source is in the store now (an earlier file of this ingest, or another writer, committed
    it): then the result is the serial ingest's for a file found in the store (nothing counted)."""
    if not (any(store.has_source(k) for k in st.known) or (st.rows_key and store.has_alias(st.rows_key))):
        return False
    res = st.result
    res.status = "skipped"
    res.records.clear()
    res.rejects.clear()
    res.warnings.clear()
    return True


def adopt(tx: Transaction, staged_root: Path, records: dict[str, dict]) -> None:
    """Move into ``tx``'s store the parts a task staged at the same relative paths under ``staged_root``, as if
    ``tx`` had written them (its commit lists them, its rollback removes them)."""
    for rel, rec in records.items():
        src, dst = Path(staged_root) / rel, tx.store.root / rel
        try:
            size = src.stat().st_size
            if size != rec.get("bytes"):
                raise StoreError(f"staged part {src} holds {size:,} bytes, expected {rec.get('bytes')}")
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
        except OSError as e:
            raise StoreError(f"could not move staged part {src} into {dst.parent}: {e.strerror or e}") from e
        tx.written.append(dst)
        tx.records[rel] = rec


def _commit(store: Store, st: Staged, opts: contract.ImportOptions) -> None:
    res = st.result
    with store.transaction(st.key) as tx:
        if _skipped(store, st):  # checked again under the writer lock
            return
        adopt(tx, st.root, st.parts)
        if not res.records:
            files.refuse_all_rejected(Path(res.path), res, st.entry)
        files.commit_file(store, tx, st.key, st.entry, res, st.jobs, opts, st.rows_key)


@contextlib.contextmanager
def staging_area(store: Store) -> Iterator[Path]:
    """A directory ``<store>/_staged/<run>`` for one ingest's tasks, locked while it runs and removed after;
    areas of runs that died (their lock free) are removed first, each noted in ``_removed.log``."""
    base = store.root / STAGED_DIR
    base.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(base, store.root)
    run = uuid.uuid4().hex[:16]
    new = base / f".new-{run}"  # locked before it gets a name the clean-up looks at
    new.mkdir()
    fd = os.open(new / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    root = base / run
    os.replace(new, root)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
        os.close(fd)


def _remove_abandoned(base: Path, store_root: Path) -> None:
    now = time.time()
    for d in sorted(base.iterdir()):
        if not d.is_dir() or (d.name.startswith(".") and not _stale_new_area(d, now)):
            continue
        try:
            fd = os.open(d / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # a running ingest's
        shutil.rmtree(d, ignore_errors=True)
        os.close(fd)
        note_removed(store_root, [f"{d.relative_to(store_root)}\tstaged parts of an ingest that did not finish"])


def _stale_new_area(d: Path, now: float) -> bool:
    try:
        return d.name.startswith(".new-") and now - d.stat().st_mtime > NEW_AREA_GRACE_S
    except OSError:
        return False
