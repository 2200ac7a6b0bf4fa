"""The registry of input formats that ``rankscope ingest`` understands.

An importer is a module with a module-level object exposing::

    name: str                                  # the --format name
    def sniff(path: Path, head: bytes) -> bool  # head: first 64 KiB, gunzipped
    def read(path: Path, opts: ImportOptions) -> ImportBatch | Iterable[ImportBatch]
    companion: optional callable(path) -> bool  # files read by another file's importer

Importers are listed here by dotted name and imported lazily, so the ground
floor stays light (no importer's dependencies load until it is needed).
Order matters for auto-detection: the first importer whose ``sniff`` says yes
wins, so specific formats come before generic ones.
"""

from __future__ import annotations

import gzip
import importlib
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from rankscope.collectors.errors import UsageError

HEAD_BYTES = 64 * 1024

IMPORTERS: dict[str, str] = {
    # name -> "module:attribute" (attribute is the importer object)
    "whatif_parquet": "rankscope.collectors.whatif_parquet:WHATIF_PARQUET",
    "nccl_profiler": "rankscope.collectors.nccl_profiler:NCCL_PROFILER",
    "kineto": "rankscope.collectors.kineto_import:KINETO",
    "flight_recorder": "rankscope.collectors.flight_recorder:FLIGHT_RECORDER",
    "nccl_inspector": "rankscope.collectors.nccl_inspector:NCCL_INSPECTOR",
    "nsys_sqlite": "rankscope.collectors.nsys_sqlite:NSYS_SQLITE",
    "ipfix_file": "rankscope.collectors.flows.flow_importers:IPFIX_FILE",
    "flow_pcap": "rankscope.collectors.flows.flow_importers:FLOW_PCAP",
    "nfdump_csv": "rankscope.collectors.flows.flow_importers:NFDUMP_CSV",
    "nfdump_json": "rankscope.collectors.flows.flow_importers:NFDUMP_JSON",
    "store-parquet": "rankscope.collectors.table_import:PARQUET",
    "csv": "rankscope.collectors.table_import:CSV",
}
"""Every format, in auto-detection order. Later issues add theirs before the generic ones."""

GENERIC_LAST = ("store-parquet", "csv")


@dataclass(frozen=True)
class ImportOptions:
    """Options every importer receives."""

    job: str | None = None
    """--job; None lets the importer or the default (``default``, flows: ``fabric``) decide."""
    kind: str | None = None
    """--kind for generic table formats whose kind is not in the file name."""
    extra: dict[str, Any] = field(default_factory=dict)
    """importer-specific options (e.g. compute-span regexes), from the CLI's --opt key=value."""


@dataclass
class ImportBatch:
    """What an importer produced from one file (or one chunk of it)."""

    tables: dict[str, list[pa.Table | pl.DataFrame]] = field(default_factory=dict)
    rejects: Counter = field(default_factory=Counter)
    """records the importer itself could not decode, per reason."""
    samples: dict[str, str] = field(default_factory=dict)
    """one short example per reason (record index and what was wrong)."""
    relative_time: bool = False
    notes: dict = field(default_factory=dict)

    def add(self, kind: str, table: pa.Table | pl.DataFrame | None) -> None:
        if table is not None and (table.num_rows if isinstance(table, pa.Table) else table.height):
            self.tables.setdefault(kind, []).append(table)

    def reject(self, reason: str, sample: str | None = None, count: int = 1) -> None:
        self.rejects[reason] += count
        if sample is not None and reason not in self.samples:
            self.samples[reason] = sample[:300]

    def merge(self, other: ImportBatch) -> None:
        for k, ts in other.tables.items():
            self.tables.setdefault(k, []).extend(ts)
        self.rejects.update(other.rejects)
        for k, v in other.samples.items():
            self.samples.setdefault(k, v)
        self.relative_time = self.relative_time or other.relative_time
        self.notes.update(other.notes)


def read_head(path: Path, n: int = HEAD_BYTES) -> bytes:
    """The first n bytes of a file, transparently gunzipped (a broken gzip gives the raw head)."""
    with open(path, "rb") as f:
        raw = f.read(n)
    if raw[:2] == b"\x1f\x8b":
        try:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            return d.decompress(raw, n)
        except zlib.error:
            return raw
    return raw


def open_maybe_gzip(path: Path):
    """Open a file for binary reading, gunzipping when it starts with the gzip magic."""
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def importer(name: str):
    try:
        target = IMPORTERS[name]
    except KeyError:
        raise UsageError(f"unknown format {name!r}; expected auto or one of {sorted(IMPORTERS)}") from None
    mod, attr = target.split(":")
    return getattr(importlib.import_module(mod), attr)


def names() -> list[str]:
    return list(IMPORTERS)


def detection_order() -> list[str]:
    specific = [n for n in IMPORTERS if n not in GENERIC_LAST]
    return specific + [n for n in GENERIC_LAST if n in IMPORTERS]


def is_companion(path: Path) -> bool:
    """True when some importer reads this file as part of another (e.g. meta-X.yaml)."""
    for n in detection_order():
        imp = importer(n)
        comp = getattr(imp, "companion", None)
        if comp is not None and comp(path):
            return True
    return False


def detect(path: Path) -> str | None:
    """The name of the first importer that recognises the file, or None."""
    head = read_head(path)
    for n in detection_order():
        if importer(n).sniff(path, head):
            return n
    return None


def as_batches(result: ImportBatch | Iterable[ImportBatch]) -> Iterable[ImportBatch]:
    return [result] if isinstance(result, ImportBatch) else result
