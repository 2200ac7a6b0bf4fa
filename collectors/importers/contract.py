"""The contract between ``rankscope ingest`` and each importer: options in, batches of record tables out.

An importer is a module with a module-level object exposing::

    name: str                                  # the --format name
    def sniff(path: Path, head: bytes) -> bool  # head: first 64 KiB, gunzipped
    def read(path: Path, opts: ImportOptions) -> ImportBatch | Iterable[ImportBatch]
    companion: optional callable(path) -> bool  # files read by another file's importer (listed in
                                               # registry.WITH_COMPANIONS)

Here: the options and batches, the limits a file may cost in memory (gzip bombs), and the helpers every
importer shares (reading a file within the limits, rows into a frame with bad rows counted, ranks).
The list of importers is :mod:`rankscope.collectors.ingest.registry`.
"""

from __future__ import annotations

import contextlib
import contextvars
import gzip
import io
import os
import re
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from rankscope.collectors.errors import InputFormatError, UsageError
from rankscope.collectors.importers import compression
from rankscope.collectors.record_class import record

HEAD_BYTES = 64 * 1024

MAX_RATIO = 50.0
"""A compressed file may expand to this many times its size (gzip bombs run at ~1000x)."""
MIN_EXPANDED_BYTES = 64 << 20
"""...but a small file may always expand to this much, so small but very repetitive traces still load."""


@record
class Limits:
    """Bounds on what one input file may cost in memory."""

    max_bytes: int | None = None
    """--max-bytes: the most bytes any file may hold after decompression; set, it replaces the ratio rule."""
    max_ratio: float = MAX_RATIO
    max_references: int = 10_000
    """containers a pickle may fetch from its memo (one dict referenced 400,001 times is a bomb)."""

    def expanded_cap(self, compressed_bytes: int) -> int:
        if self.max_bytes is not None:
            return self.max_bytes
        return max(MIN_EXPANDED_BYTES, int(compressed_bytes * self.max_ratio))

    def __post_init__(self):
        if self.max_bytes is not None and self.max_bytes < 1:
            raise UsageError(f"--max-bytes {self.max_bytes}: expected a positive number of bytes")
        if not self.max_ratio >= 1:
            raise UsageError(f"max_ratio {self.max_ratio}: expected at least 1")


LIMITS: contextvars.ContextVar[Limits] = contextvars.ContextVar("rankscope_limits", default=Limits())  # noqa: B039 - frozen
"""The limits of the file being ingested (ingest sets them per file; importers read them here)."""


@contextlib.contextmanager
def limits(lim: Limits):
    token = LIMITS.set(lim)
    try:
        yield lim
    finally:
        LIMITS.reset(token)


def check_size(path: Path) -> None:
    """Raise InputFormatError naming --max-bytes when the file is larger than :data:`LIMITS` allow."""
    lim = LIMITS.get()
    size = os.path.getsize(path)
    if lim.max_bytes is not None and size > lim.max_bytes:
        raise InputFormatError(path, None, f"at most {lim.max_bytes:,} bytes (--max-bytes)", got=f"{size:,} bytes")


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def read_limited(path: Path) -> tuple[bytes, bool]:
    """The whole file, gunzipped within :data:`LIMITS`; the flag says a gzip stream ended early.

    Raises InputFormatError naming the limit when the file is (or expands to) more than allowed.
    """
    lim = LIMITS.get()
    check_size(path)
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] != b"\x1f\x8b":
        other = compression.decompress(path, raw, lim.expanded_cap(len(raw)))  # bz2, xz, zip
        return (raw, False) if other is None else (other, False)
    cap = lim.expanded_cap(len(raw))
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = d.decompress(raw, cap + 1)
    except zlib.error as e:
        raise InputFormatError(path, None, "a readable gzip stream", got=str(e)) from e
    if len(data) > cap:
        raise InputFormatError(path, None, f"a gzip file that expands to at most {cap:,} bytes "
                               f"({lim.max_ratio:g}x its size; raise with --max-bytes)",
                               got=f"more than {cap:,} bytes from {len(raw):,} compressed")
    compression.refuse_nested(path, "gzip", data)
    cut = not d.eof
    if d.eof and d.unused_data[:2] == b"\x1f\x8b":
        # a multi-member gzip (concatenated files): read the rest within the same cap
        rest = io.BytesIO()
        with gzip.open(io.BytesIO(d.unused_data)) as g:
            while block := g.read(1 << 20):
                rest.write(block)
                if len(data) + rest.tell() > cap:
                    raise InputFormatError(path, None, f"a gzip file that expands to at most {cap:,} bytes",
                                           got="more (multi-member gzip)")
        data += rest.getvalue()
    return data, cut

@record
class ImportOptions:
    """Options every importer receives."""

    job: str | None = None
    """--job; None lets the importer or the default (``default``, flows: ``fabric``) decide."""
    kind: str | None = None
    """--kind for generic table formats whose kind is not in the file name."""
    extra: dict[str, Any] = field(default_factory=dict)
    """importer-specific options (e.g. compute-span regexes), from the CLI's --opt key=value."""
    rows_kept: bool = False
    """the caller keeps every row it ingests in memory (``analyze --ingest``): an importer that would read a
    large file in batches to bound its memory may read it whole, which is cheaper (one pass)."""


@record(frozen=False)
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


_INT_RANGES = {pl.Int8: 7, pl.Int16: 15, pl.Int32: 31, pl.Int64: 63, pl.UInt8: 8, pl.UInt16: 16,
               pl.UInt32: 32, pl.UInt64: 64}


def _fits(v, dtype) -> bool:
    """Whether a decoded JSON/pickle value can go into a column of ``dtype`` without overflow."""
    if v is None:
        return True
    if isinstance(dtype, pl.List):
        return isinstance(v, (list, tuple)) and all(_fits(x, dtype.inner) for x in v)
    base = dtype.base_type() if hasattr(dtype, "base_type") else dtype
    if base in _INT_RANGES:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            return False
        bits = _INT_RANGES[base]
        return (0 if base in (pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64) else -(1 << bits)) <= v < (1 << bits)
    if base in (pl.Float32, pl.Float64):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= 1.7976931348623157e308 \
            and v == v
    if base in (pl.String, pl.Categorical):
        return isinstance(v, str)
    if base == pl.Boolean:
        return isinstance(v, bool)
    return True


def rows_frame(rows: list[dict], types: dict[str, pl.DataType], batch: ImportBatch, what: str) -> pl.DataFrame:
    """A DataFrame from decoded rows; a row with a value its column cannot hold (2**64 in an
    Int64, text in a number, a list in a string) is rejected and counted, never an exception.

    Columns not in ``types`` keep scalar values of one type; anything else there becomes text.
    """
    good = []
    for i, r in enumerate(rows):
        bad = next((c for c, t in types.items() if c in r and not _fits(r[c], t)), None)
        if bad is not None:
            batch.reject(f"{what}: {bad} out of range or of the wrong type", f"record {i}: {bad}={r[bad]!r:.80}")
            continue
        good.append(r)
    if not good:
        return pl.DataFrame(schema=types)
    seen: dict[str, set] = {}
    for r in good:
        for c, v in r.items():
            if c not in types and v is not None:
                seen.setdefault(c, set()).add(type(v))
    loose = {c for c, ts in seen.items() if len(ts) > 1 or not ts <= {int, float, str, bool}
             or (ts == {int} and any(isinstance(r.get(c), int) and not -(1 << 63) <= r[c] < (1 << 63)
                                     for r in good))}
    if loose:
        good = [{c: (str(v) if c in loose and v is not None else v) for c, v in r.items()} for r in good]
    for c, t in types.items():
        base = t.base_type() if hasattr(t, "base_type") else t
        if base in _INT_RANGES:
            for r in good:
                if isinstance(r.get(c), float):
                    r[c] = int(r[c])
    return pl.DataFrame(good, infer_schema_length=None, schema_overrides=types)


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
    if compression.compression_of(raw[:8]) == "zip":
        import zipfile

        try:
            with zipfile.ZipFile(path) as z:
                files = [i for i in z.infolist() if not i.is_dir()]
                if len(files) == 1:
                    with z.open(files[0]) as f:
                        return f.read(n)
        except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError):
            return raw
        return raw
    return compression.head_of(raw, n)


def open_maybe_gzip(path: Path):
    """The file's bytes (gunzipped within :data:`LIMITS`) as a binary file object."""
    try:
        data, _ = read_limited(path)
    except (OSError, EOFError) as e:
        raise InputFormatError(path, None, "a readable (gzip) file", got=str(e)) from e
    return io.BytesIO(data)


def as_batches(result: ImportBatch | Iterable[ImportBatch]) -> Iterable[ImportBatch]:
    return [result] if isinstance(result, ImportBatch) else result


MAX_RANK = 2**31
"""Ranks are int32 in the store."""


def rank_option(path: Path, opts: ImportOptions) -> int | None:
    """``--opt rank=N`` for one file, checked; None when not given."""
    v = opts.extra.get("rank")
    if v is None:
        return None
    if not (isinstance(v, str) and v.strip().isdigit() and int(v) < MAX_RANK):
        raise InputFormatError(path, "--opt rank", f"a rank number 0..{MAX_RANK - 1} (--opt rank=N)", got=v)
    return int(v)


RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)
"""``rank3``, ``rank_3``, ``rank-3`` in a file name (profiler, Nsight and Kineto dumps)."""


def rank_in_name(path: Path, pattern: re.Pattern[str] = RANK_IN_NAME) -> int | None:
    """The rank that ``pattern``'s first group finds in the file's name; None when absent or past int32."""
    m = pattern.search(path.name)
    return int(m.group(1)) if m and int(m.group(1)) < MAX_RANK else None


def file_rank(path: Path, opts: ImportOptions, pattern: re.Pattern[str] = RANK_IN_NAME) -> int | None:
    """``--opt rank=N`` when given, else the rank in the file's name; None when neither says."""
    given = rank_option(path, opts)
    return given if given is not None else rank_in_name(path, pattern)
