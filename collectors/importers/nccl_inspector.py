"""NCCL Inspector plugin output (JSON objects, one per collective per communicator) -> comm_op.

Each object holds ``header`` (communicator ``id``, ``rank``, ``n_ranks``),
``metadata`` (``hostname``, ``pid``, ``dump_timestamp_us``) and ``coll_perf``
(``coll``, ``coll_sn``, ``coll_msg_size_bytes``, ``coll_exec_time_us``,
algorithm and bus bandwidth). Objects are decoded one after another (JSON lines
or pretty-printed), so a broken object costs only itself.

Times: the verbose form's ``event_trace_ts`` (epoch µs) gives the real start
(first kernel start, else coll start) and end; the plain form only says when
the record was dumped, so the op is placed to end at ``dump_timestamp_us``
with its measured duration (``notes.placed_at_dump`` counts those rows; their
durations are exact, their placement an upper bound). ``rank`` is the
communicator rank; the communicator id is the group.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers.contract import ImportBatch, ImportOptions, rows_frame
from rankscope.collectors.importers.kineto.chrome_trace import read_bytes
from rankscope.collectors.vocab import normalise_op


def _objects(text: str, batch: ImportBatch) -> list:
    dec = json.JSONDecoder()
    out, pos, n = [], 0, len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n:
            break
        try:
            obj, pos = dec.raw_decode(text, pos)
            out.append(obj)
        except (json.JSONDecodeError, RecursionError):
            nxt = text.find("\n{", pos + 1)
            batch.reject("undecodable JSON object", f"offset {pos}: {text[pos:pos + 100]!r}")
            if nxt < 0:
                break
            pos = nxt + 1
    return out


def _row(o: dict) -> tuple[dict, bool]:
    h, m, c = o["header"], o.get("metadata") or {}, o["coll_perf"]
    op = normalise_op(c["coll"])
    if op is None:
        raise ValueError(f"unknown collective {c['coll']!r}")
    exec_ns = int(round(float(c["coll_exec_time_us"]) * 1000))
    tr = c.get("event_trace_ts") or {}
    kernels = tr.get("kernel_events") or []
    kstarts = [int(k["kernel_start_ts"]) * 1000 for k in kernels if k.get("kernel_start_ts")]
    kstops = [int(k["kernel_stop_ts"]) * 1000 for k in kernels if k.get("kernel_stop_ts")]
    start = min(kstarts) if kstarts else (int(tr["coll_start_ts"]) * 1000 if tr.get("coll_start_ts") else None)
    end = max(kstops) if kstops else None
    placed = start is None
    if placed:
        end = int(m["dump_timestamp_us"]) * 1000
        start = end - exec_ns
    elif end is None:
        end = start + exec_ns
    return {
        "rank": int(h["rank"]), "op": op, "name": c["coll"], "group_id": str(h.get("id")),
        "seq": c.get("coll_sn"), "size_bytes": c.get("coll_msg_size_bytes"),
        "start_ns": start, "end_ns": end,
        "host": m.get("hostname"), "pid": m.get("pid"),
    }, placed


def read_inspector(path: Path, opts: ImportOptions) -> ImportBatch:
    data, cut = read_bytes(path)
    text = data.decode("utf-8", "replace")
    if not text.strip():
        raise InputFormatError(path, None, "NCCL Inspector JSON objects", got="empty file")
    batch = ImportBatch()
    if cut:
        batch.reject("truncated gzip", path.name)
    objs = _objects(text, batch)
    rows, placed = [], 0
    for i, o in enumerate(objs):
        try:
            r, p = _row(o)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            batch.reject("malformed inspector record", f"record {i}: {type(e).__name__}: {e}")
            continue
        placed += p
        rows.append(r)
    if not rows:
        raise InputFormatError(path, None, "NCCL Inspector records with header and coll_perf",
                               got=f"{len(objs)} objects, none usable")
    df = rows_frame(rows, {
        "rank": pl.Int32, "seq": pl.Int64, "size_bytes": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
        "pid": pl.Int64, "op": pl.String, "name": pl.String, "group_id": pl.String, "host": pl.String},
        batch, "inspector record")
    batch.add("comm_op", df)
    batch.notes.update(records=len(rows), placed_at_dump=placed)
    return batch


class _NcclInspector:
    name = "nccl_inspector"
    source = "nccl_inspector"

    def sniff(self, path: Path, head: bytes) -> bool:
        return head.lstrip()[:1] == b"{" and b'"coll_perf"' in head and b'"header"' in head

    def read(self, path: Path, opts: ImportOptions) -> ImportBatch:
        return read_inspector(path, opts)


NCCL_INSPECTOR = _NcclInspector()
