"""Generic tables: the store's own Parquet files and CSV, one record kind per file.

The kind comes from ``--kind``, else from the file name (``comm_op.csv``,
``flow-leaf3.parquet``, a ``<kind>/job=X/part-*.parquet`` path), else from the
header: the kind whose required columns are all present and that shares the
most columns with the file. Rows are validated by the ingest engine, so a bad
row is counted there by reason and the good rows of the file still load.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers.contract import ImportBatch, ImportOptions, open_maybe_gzip
from rankscope.collectors.schema import KINDS


def kind_from_name(path: Path) -> str | None:
    for part in [path.name, *[p.name for p in path.parents][:3]]:
        stem = part.split(".")[0]
        for kind in sorted(KINDS, key=len, reverse=True):
            if stem == kind or stem.startswith(kind + "-") or stem.startswith(kind + "_"):
                return kind
    return None


def kind_from_columns(cols: list[str]) -> str | None:
    have = set(cols)
    best, score = None, 0
    for kind, spec in KINDS.items():
        required = {c.name for c in spec if c.required and c.name != "job"}
        if not required <= have:
            continue
        s = len(have & {c.name for c in spec})
        if s > score:
            best, score = kind, s
    return best


def _kind(path: Path, cols: list[str], opts: ImportOptions) -> str:
    kind = opts.kind or kind_from_name(path) or kind_from_columns(cols)
    if kind is None:
        raise InputFormatError(path, "header", "columns of one record kind "
                               f"({', '.join(KINDS)}) or --kind", got=cols[:12])
    if kind not in KINDS:
        raise InputFormatError(path, None, f"a record kind in {sorted(KINDS)}", got=kind)
    return kind


class _Parquet:
    name = "store-parquet"

    def sniff(self, path: Path, head: bytes) -> bool:
        return head[:4] == b"PAR1" and path.suffix == ".parquet" and (
            kind_from_name(path) is not None or self._kind_from_schema(path) is not None)

    @staticmethod
    def _kind_from_schema(path: Path) -> str | None:
        try:
            return kind_from_columns(pq.read_schema(path).names)
        except Exception:  # noqa: BLE001 - unreadable footers are reported by read()
            return None

    def read(self, path: Path, opts: ImportOptions) -> ImportBatch:
        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for corrupt files
            raise InputFormatError(path, "footer", "a readable Parquet file", got=str(e)) from e
        try:
            names = table.schema.names
            table = pl.from_arrow(table)
        except Exception as e:  # noqa: BLE001 - corrupt footers give undecodable names or types
            raise InputFormatError(path, "schema", "UTF-8 column names and Arrow types", got=str(e)[:200]) from e
        batch = ImportBatch()
        batch.add(_kind(path, names, opts), table)
        return batch


class _Csv:
    name = "csv"

    def sniff(self, path: Path, head: bytes) -> bool:
        # By name alone: an empty or broken .csv should reach read() and get a clear error.
        return any(path.name.endswith(s) for s in (".csv", ".csv.gz", ".tsv"))

    def read(self, path: Path, opts: ImportOptions) -> ImportBatch:
        with open_maybe_gzip(path) as f:
            data = f.read()
        if not data.strip():
            raise InputFormatError(path, None, "a CSV header line and rows", got="empty file")
        text = data.decode("utf-8", "replace")
        del data
        sep = "\t" if path.name.endswith(".tsv") else ","
        # One reader over the whole text: a quoted field may hold the separator or a newline.
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=sep)
        header = _next_row(reader, path, batch=None)
        if not header:
            raise InputFormatError(path, "line 1", "a CSV header line", got=text[:80])
        kind = _kind(path, header, opts)
        batch = ImportBatch()
        # Every column is read as text; validation casts and counts what does not convert.
        cols: list[list[str | None]] = [[] for _ in header]
        while True:
            line = reader.line_num + 1
            row = _next_row(reader, path, batch)
            if row is None:
                break
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != len(header):
                batch.reject("wrong number of fields", f"line {line}: {sep.join(row)[:120]}")
                continue
            for c, v in zip(cols, row):
                c.append(None if v in _NULLS else v)
        names = _unique(header)
        df = pl.DataFrame({n: pl.Series(n, c, dtype=pl.String) for n, c in zip(names, cols)})
        batch.add(kind, df)
        return batch


_NULLS = {"", "null", "NULL", "None", "NaN"}


def _unique(header: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for h in header:
        n = seen.get(h, 0)
        seen[h] = n + 1
        out.append(h if n == 0 else f"{h}_{n}")
    return out


def _next_row(reader, path: Path, batch: ImportBatch | None) -> list[str] | None:
    """The next row; a row the csv module cannot read (a field over its size limit, a NUL) is
    counted and skipped. None at the end."""
    while True:
        try:
            return next(reader)
        except StopIteration:
            return None
        except csv.Error as e:
            if batch is None:
                raise InputFormatError(path, f"line {reader.line_num}", "a readable CSV header", got=str(e)) from None
            batch.reject("unreadable CSV row", f"line {reader.line_num}: {e}")


PARQUET = _Parquet()
CSV = _Csv()
