"""Nsight Systems SQLite export (``nsys export --type sqlite``) -> compute_op and comm_op.

Read with SQL through DuckDB's sqlite scanner would add an extension download;
Python's sqlite3 is enough and ships everywhere. Tables used, tolerant of the
columns that differ between nsys versions (a missing optional column is null):

- ``CUPTI_ACTIVITY_KIND_KERNEL``: start, end, deviceId, streamId,
  correlationId, globalPid, ``demangledName``/``shortName`` (ids into
  ``StringIds``; older exports keep the text in ``name``), grid/block.
  NCCL kernels become comm_op (op from the kernel name), the rest compute_op.
- ``CUPTI_ACTIVITY_KIND_RUNTIME``: the launch of each kernel (correlationId,
  globalTid, start) so a kernel finds the NVTX range it was launched in.
- ``NVTX_EVENTS``: push/pop and start/end ranges (text or textId). NCCL's
  own ranges (``ncclAllReduce`` ...) give the message size where their payload
  holds one (``uint64Value``/``int64Value`` or a JSON payload with a size);
  ranges matching the forward/backward/optimizer regexes become compute spans.
- ``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` turns session-relative times
  into epoch ns; without it the batch is relative.

The rank comes from ``--opt rank=N`` or the file name (``report_rank3.sqlite``).
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import polars as pl

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers.contract import (
    ImportBatch,
    ImportOptions,
    file_rank,
)
from rankscope.collectors.importers.kineto.compute_rows import span_regexes
from rankscope.collectors.vocab import NCCL_KERNEL, kernel_category_expr, kernel_op, normalise_op

_SIZE_KEY = re.compile(r"(?i)size|bytes")
SQLITE_MAGIC = b"SQLite format 3\x00"


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info('{table}')")}


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


def _select(con, table: str, wanted: dict[str, str]) -> pl.DataFrame:
    """SELECT the wanted columns (alias -> first existing of 'a|b|c'); absent ones are NULL."""
    have = _columns(con, table)
    parts = []
    for alias, options in wanted.items():
        col = next((c for c in options.split("|") if c in have), None)
        parts.append(f'"{col}" AS {alias}' if col else f"NULL AS {alias}")
    rows = con.execute(f"SELECT {', '.join(parts)} FROM \"{table}\"").fetchall()
    return pl.DataFrame(rows, schema=list(wanted), orient="row", infer_schema_length=None)


def _strings(con, tables) -> dict[int, str]:
    if "StringIds" not in tables:
        return {}
    return dict(con.execute("SELECT id, value FROM StringIds").fetchall())


def _name(v, strings: dict) -> str | None:
    if isinstance(v, int):
        return strings.get(v)
    return v if isinstance(v, str) else None


def _payload_size(row: dict) -> int | None:
    for k in ("uint64Value", "int64Value"):
        v = row.get(k)
        if isinstance(v, int) and v >= 0:
            return v
    js = row.get("jsonText")
    if isinstance(js, str) and js:
        try:
            obj = json.loads(js)
        except json.JSONDecodeError:
            return None
        if isinstance(obj, dict):
            for k, v in obj.items():
                if _SIZE_KEY.search(k) and isinstance(v, int):
                    return v
    return None


def _contains(ranges: pl.DataFrame, tid: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index into ranges (tid, start, end) of the latest-starting range on the same thread holding t."""
    out = np.full(len(t), -1, dtype=np.int64)
    if ranges.height == 0:
        return out
    r = ranges.with_row_index("_i").sort("tid", "start")
    r_tid, r_start, r_end, r_i = (r[c].to_numpy() for c in ("tid", "start", "end", "_i"))
    for th in np.unique(tid):
        sel = np.nonzero(tid == th)[0]
        lo, hi = np.searchsorted(r_tid, th, "left"), np.searchsorted(r_tid, th, "right")
        if lo == hi:
            continue
        pos = np.searchsorted(r_start[lo:hi], t[sel], "right") - 1
        ok = pos >= 0
        pc = np.clip(pos, 0, None)
        ok &= t[sel] <= r_end[lo:hi][pc]
        out[sel[ok]] = r_i[lo:hi][pc[ok]]
    return out



def read_nsys(path: Path, opts: ImportOptions) -> ImportBatch:
    rank = file_rank(path, opts)
    if rank is None:
        raise InputFormatError(path, None, "the rank in the file name (report_rank3.sqlite) or --opt rank=N",
                               got=path.name)
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = _tables(con)
    except sqlite3.DatabaseError as e:
        raise InputFormatError(path, None, "an nsys SQLite export", got=str(e)) from e
    try:
        return _read(path, con, tables, rank, opts)
    except sqlite3.DatabaseError as e:
        raise InputFormatError(path, None, "a readable nsys SQLite export", got=str(e)) from e
    finally:
        con.close()


def _read(path, con, tables, rank, opts) -> ImportBatch:
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables and "NVTX_EVENTS" not in tables:
        raise InputFormatError(path, None, "tables CUPTI_ACTIVITY_KIND_KERNEL or NVTX_EVENTS", got=sorted(tables)[:10])
    strings = _strings(con, tables)
    epoch = None
    if "TARGET_INFO_SESSION_START_TIME" in tables and "utcEpochNs" in _columns(con, "TARGET_INFO_SESSION_START_TIME"):
        epoch = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        epoch = epoch[0] if epoch and isinstance(epoch[0], int) else None
    batch = ImportBatch(relative_time=epoch is None)
    off = epoch or 0
    nvtx = pl.DataFrame()
    if "NVTX_EVENTS" in tables:
        nvtx = _select(con, "NVTX_EVENTS", {"start": "start", "end": "end", "text": "text", "textId": "textId",
                                            "tid": "globalTid", "uint64Value": "uint64Value",
                                            "int64Value": "int64Value", "jsonText": "jsonText"})
        names = [_name(t, strings) or _name(i, strings) for t, i in zip(nvtx["text"], nvtx["textId"], strict=True)]
        nvtx = nvtx.with_columns(pl.Series("name", names, dtype=pl.String)).filter(
            pl.col("start").is_not_null() & pl.col("end").is_not_null() & pl.col("name").is_not_null())
    nccl_ranges = nvtx.filter(pl.col("name").str.starts_with("nccl")) if nvtx.height else nvtx
    rows_compute = []
    if nvtx.height:
        for cat, rx in span_regexes(opts.extra).items():
            s = nvtx.filter(pl.col("name").str.contains(rx.pattern))
            if s.height:
                rows_compute.append(s.select("name", pl.lit(cat).alias("category"), pl.col("start").alias("start_ns"),
                                             pl.col("end").alias("end_ns"), (pl.col("tid") & 0xFFFFFF).alias("stream")))
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        k = _select(con, "CUPTI_ACTIVITY_KIND_KERNEL", {
            "start": "start", "end": "end", "device": "deviceId", "stream": "streamId", "corr": "correlationId",
            "gpid": "globalPid", "dn": "demangledName", "sn": "shortName", "nm": "name",
            "gx": "gridX", "gy": "gridY", "gz": "gridZ", "bx": "blockX", "by": "blockY", "bz": "blockZ"})
        names = [_name(d, strings) or _name(s, strings) or _name(n, strings)
                 for d, s, n in zip(k["dn"], k["sn"], k["nm"], strict=True)]
        k = k.with_columns(pl.Series("kname", names, dtype=pl.String))
        bad = k.filter(pl.col("kname").is_null() | pl.col("start").is_null() | pl.col("end").is_null())
        if bad.height:
            batch.reject("kernel without name or times", f"{bad.height} kernels", count=bad.height)
            k = k.filter(pl.col("kname").is_not_null() & pl.col("start").is_not_null() & pl.col("end").is_not_null())
        is_nccl = k["kname"].str.contains(NCCL_KERNEL)
        comp = k.filter(~is_nccl)
        cat = kernel_category_expr("kname")
        rows_compute.append(comp.select(
            pl.col("kname").alias("name"), cat.alias("category"), pl.col("start").alias("start_ns"),
            pl.col("end").alias("end_ns"), pl.col("stream").cast(pl.Int64), pl.col("device").cast(pl.Int32),
            pl.concat_str([pl.col("gx"), pl.col("gy"), pl.col("gz")], separator=",").alias("grid"),
            pl.concat_str([pl.col("bx"), pl.col("by"), pl.col("bz")], separator=",").alias("block"),
            ((pl.col("gpid") // (1 << 24)) & 0xFFFFFF).alias("pid")))
        batch.add("comm_op", _nccl_kernels(con, tables, k.filter(is_nccl), nccl_ranges, off, rank))
    if rows_compute:
        df = pl.concat(rows_compute, how="diagonal_relaxed").with_columns(
            pl.col("start_ns") + off, pl.col("end_ns") + off, pl.lit(rank, pl.Int32).alias("rank"))
        batch.add("compute_op", df)
    batch.notes.update(rank=rank, session_epoch_ns=epoch, nvtx_nccl_ranges=int(nccl_ranges.height))
    return batch


def _nccl_kernels(con, tables, k: pl.DataFrame, ranges: pl.DataFrame, off: int, rank: int) -> pl.DataFrame:
    if k.height == 0:
        return pl.DataFrame()
    link = np.full(k.height, -1, dtype=np.int64)
    launch = [None] * k.height
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables and ranges.height:
        rt = _select(con, "CUPTI_ACTIVITY_KIND_RUNTIME", {"corr": "correlationId", "tid": "globalTid",
                                                          "start": "start"})
        by_corr = dict(zip(rt["corr"].to_list(), zip(rt["tid"].to_list(), rt["start"].to_list(), strict=True),
                           strict=True))
        hits = [by_corr.get(c, (-1, -1)) for c in k["corr"].to_list()]
        launch = [h[1] if h[1] != -1 else None for h in hits]
        link = _contains(ranges.select("tid", "start", "end"), np.array([h[0] for h in hits], dtype=np.int64),
                         np.array([h[1] for h in hits], dtype=np.int64))
    rng = ranges.to_dicts() if ranges.height else []
    ops, sizes = [], []
    for j, name in enumerate(k["kname"].to_list()):
        r = rng[link[j]] if link[j] >= 0 else None
        ops.append((normalise_op(re.sub(r"(?i)^nccl:?", "", r["name"])) if r else None) or kernel_op(name))
        sizes.append(_payload_size(r) if r else None)
    return k.select(
        pl.Series("op", ops, dtype=pl.String), pl.col("kname").alias("name"),
        (pl.col("start") + off).alias("start_ns"), (pl.col("end") + off).alias("end_ns"),
        pl.col("stream").cast(pl.String), pl.Series("size_bytes", sizes, dtype=pl.Int64),
        pl.Series("launch_ns", [x + off if x is not None else None for x in launch], dtype=pl.Int64),
        ((pl.col("gpid") // (1 << 24)) & 0xFFFFFF).alias("pid"), pl.lit(rank, pl.Int32).alias("rank"),
        pl.lit("completed").alias("state"))


class _NsysSqlite:
    name = "nsys_sqlite"
    source = "nsys"

    def sniff(self, path: Path, head: bytes) -> bool:
        if not head.startswith(SQLITE_MAGIC):
            return False
        try:
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                t = _tables(con)
            finally:
                con.close()
        except sqlite3.DatabaseError:
            return path.suffix in (".sqlite", ".db")
        return bool(t & {"CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"})

    def read(self, path: Path, opts: ImportOptions) -> ImportBatch:
        return read_nsys(path, opts)


NSYS_SQLITE = _NsysSqlite()
