"""NCCL profiler plugin (ext-profiler/example) Chrome-trace output -> comm_op.

The example plugin writes one JSON object per line inside a ``[ ... ]`` array:
async begin/end pairs (``ph`` ``b``/``e``) matched by ``cat`` and ``id``.
COLL begins carry ``SeqNum, CommHash, Rank, Count, Datatype, Algorithm,
Protocol, nMaxChannels``; P2P begins ``CommHash, Rank, Peer, Count,
Datatype``. GROUP, PROXY, NET and GPU events describe the same work at finer
grain and are counted in the notes, not stored. Lines are decoded one at a
time, so a truncated file or a broken line loses only itself; bare tokens the
plugin leaves unquoted (``ncclFloat32``, ``0x7f...`` stream addresses) are
quoted first. Times are microseconds from the plugin's own start: the batch
is relative. The communicator (CommHash) is the group; ``Rank``/``Peer`` are
communicator ranks, stored as given (global when the communicator is the world).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import orjson
import polars as pl

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers.contract import (
    ImportBatch,
    ImportOptions,
    file_rank,
    rows_frame,
)
from rankscope.collectors.importers.kineto.chrome_trace import read_bytes
from rankscope.collectors.vocab import dtype_name, dtype_size, normalise_op

_BARE = re.compile(rb'(":\s*)(0x[0-9a-fA-F]+|nccl[A-Za-z0-9_]+|[A-Za-z_][A-Za-z0-9_]*(?<!true)(?<!false)(?<!null))'
                   rb'(\s*[,}])')
def nccl_dtype(raw) -> tuple[str | None, int | None]:
    size = dtype_size(raw) if raw is not None else None
    return (dtype_name(raw), size) if size is not None else (None, None)


def _events(path: Path, text: bytes, batch: ImportBatch) -> list[dict]:
    out = []
    for no, line in enumerate(text.splitlines(), start=1):
        s = line.strip().rstrip(b",")
        if s in (b"", b"[", b"]", b"{}", b"{}]", b"[]"):
            continue
        try:
            ev = orjson.loads(s)
        except orjson.JSONDecodeError:
            try:
                ev = orjson.loads(_BARE.sub(rb'\1"\2"\3', s))
            except orjson.JSONDecodeError:
                batch.reject("undecodable line", f"line {no}: {line[:120]!r}")
                continue
        if not isinstance(ev, dict):
            batch.reject("line is not a JSON object", f"line {no}: {line[:120]!r}")
            continue
        out.append(ev)
    return out


MAX_TS_US = 1e15
"""|ts| beyond this (31 years in microseconds) cannot be a time: the record is rejected."""


def _key(v):
    return v if v is None or isinstance(v, (int, float, str)) else repr(v)[:64]


def _args(ev: dict) -> dict:
    a = ev.get("args")
    return a if isinstance(a, dict) else {}


def _time(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < MAX_TS_US


def _pairs(events: list[dict]) -> tuple[list[tuple[dict, float | None]], Counter]:
    """COLL/P2P begin events with their end time (None when the end never came)."""
    ends: dict[tuple, list] = {}
    begins, other = [], Counter()
    for ev in events:
        cat = ev.get("cat")
        if cat not in ("COLL", "P2P") or not isinstance(cat, str):
            other[str(cat)] += 1
            continue
        key = (cat, _key(ev.get("id")), _key(ev.get("pid")), _key(ev.get("tid")))
        if ev.get("ph") == "b":
            begins.append((key, ev))
        elif ev.get("ph") == "e":
            ends.setdefault(key, []).append(ev.get("ts"))
    used: dict[tuple, int] = {}
    out = []
    for key, ev in begins:
        i = used.get(key, 0)
        lst = ends.get(key, [])
        used[key] = i + 1
        out.append((ev, lst[i] if i < len(lst) else None))
    return out, other



def read_profile(path: Path, opts: ImportOptions) -> ImportBatch:
    data, cut = read_bytes(path)
    if not data.strip():
        raise InputFormatError(path, None, "NCCL profiler plugin events", got="empty file")
    batch = ImportBatch(relative_time=True)
    if cut:
        batch.reject("truncated gzip", path.name)
    events = _events(path, data, batch)
    if not events:
        raise InputFormatError(path, None, "NCCL profiler plugin events (one JSON object per line)",
                               got=f"{sum(batch.rejects.values())} undecodable lines")
    pairs, other = _pairs(events)
    comm_ranks = {r for ev, _ in pairs if isinstance(r := _args(ev).get("Rank"), int) and not isinstance(r, bool)}
    rank = file_rank(path, opts)
    if rank is None and len(comm_ranks) == 1:
        rank = next(iter(comm_ranks))
    rows = []
    for ev, end in pairs:
        a = _args(ev)
        op = normalise_op(ev.get("name")) if isinstance(ev.get("name"), str) else None
        ts = ev.get("ts")
        if op is None or not _time(ts):
            batch.reject("COLL/P2P event without a known op or numeric ts", str(ev)[:200])
            continue
        if end is not None and not _time(end):
            batch.reject("COLL/P2P end event without a numeric ts", str(ev)[:200])
            continue
        dtype, es = nccl_dtype(a.get("Datatype"))
        count = a.get("Count") if isinstance(a.get("Count"), int) else None
        r = rank if rank is not None else a.get("Rank")
        rows.append({
            "rank": r, "op": op, "name": ev.get("name"), "group_id": str(a["CommHash"]) if "CommHash" in a else None,
            "peer": a.get("Peer") if ev.get("cat") == "P2P" else None,
            "seq": a.get("SeqNum") if isinstance(a.get("SeqNum"), int) else None,
            "num_elements": count, "size_bytes": count * es if count is not None and es else None,
            "dtype": dtype, "algorithm": "/".join(str(a[k]) for k in ("Algorithm", "Protocol") if a.get(k)) or None,
            "start_ns": ts, "end_ns": end, "pid": ev.get("pid"),
        })
    df = None
    if rows:
        df = rows_frame(rows, {
            "start_ns": pl.Float64, "end_ns": pl.Float64, "rank": pl.Int32, "peer": pl.Int32, "seq": pl.Int64,
            "num_elements": pl.Int64, "size_bytes": pl.Int64, "pid": pl.Int64, "name": pl.String,
            "group_id": pl.String, "op": pl.String, "dtype": pl.String, "algorithm": pl.String},
            batch, "profiler event")
    if rows and df.height:
        origin = df["start_ns"].min()
        df = df.with_columns(((pl.col(c) - origin) * 1000).round(0).cast(pl.Int64).alias(c)
                             for c in ("start_ns", "end_ns"))
        batch.add("comm_op", df)
        batch.notes["time_origin_us"] = origin
    batch.notes.update(rank=rank, other_events=dict(other), ops=len(rows))
    return batch


class _NcclProfiler:
    name = "nccl_profiler"
    source = "nccl_profiler"

    def sniff(self, path: Path, head: bytes) -> bool:
        h = head.lstrip()
        return h[:1] == b"[" and b'"ph": "b"' in head and any(
            c in head for c in (b'"cat": "COLL"', b'"cat": "P2P"', b'"cat": "GROUP"', b'"cat": "PROXY"'))

    def read(self, path: Path, opts: ImportOptions) -> ImportBatch:
        return read_profile(path, opts)


NCCL_PROFILER = _NcclProfiler()
