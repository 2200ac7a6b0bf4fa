"""PyTorch NCCL/gloo flight recorder dumps (pickle or JSON, versions 2.x) -> comm_op.

A dump (``TORCH_FR_BUFFER_SIZE`` / ``TORCH_NCCL_TRACE_BUFFER_SIZE``, written on
timeout or by ``torch._C._distributed_c10d._dump_fr_trace[_json]()``) is one
rank's ring buffer of recent collectives. Each entry becomes a comm_op row:

- seq = ``collective_seq_id`` (``p2p_seq_id`` for p2p), group from
  ``process_group``/``pg_id`` and its ranks from ``pg_config``;
- start = ``time_discovered_started_ns`` when the recorder saw it start, else
  ``time_created_ns`` (enqueue, also kept as launch_ns); end =
  ``time_discovered_completed_ns``, else start + ``duration_ms``;
- state ``completed`` when the entry says so, when it has an end time, or when
  ``pg_status.last_completed_collective`` has passed its op id; otherwise
  ``pending`` with a null end (the op a hang is stuck in).

torch 2.13's gloo recorder writes zero or null start/completion times and
leaves every entry ``scheduled``: completion then comes from ``pg_status``,
and a completed op without a completion time gets end_ns = start_ns (its
duration is unknown; ``notes.completed_without_time`` counts them).
The rank is not in the dump; it comes from the file name (``rank3.pkl``,
``nccl_trace_rank_3``) or ``--opt rank=N``. Pickles are read with the
restricted unpickler (importers.safe_pickle): plain data only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import orjson
import polars as pl

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers import safe_pickle
from rankscope.collectors.importers.contract import (
    ImportBatch,
    ImportOptions,
    file_rank,
    rows_frame,
)
from rankscope.collectors.importers.kineto.chrome_trace import read_bytes
from rankscope.collectors.importers.kineto.comm_rows import parse_ranks
from rankscope.collectors.schema import P2P_OPS
from rankscope.collectors.vocab import dtype_name, dtype_size, normalise_op

_RANK = re.compile(r"(\d+)(?:\.[A-Za-z]\w*)*$")
_PEER = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")
ENTRY_KEYS = ("profiling_name", "collective_seq_id")



def _pos(v) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def _bytes(sizes, dtypes) -> tuple[int | None, int | None]:
    """(elements, bytes) of a list of tensor shapes with their dtypes."""
    if not isinstance(sizes, list) or not isinstance(dtypes, list):
        return None, None
    n_total, b_total = 0, 0
    for i, shape in enumerate(sizes):
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            return None, None
        n = 1
        for d in shape:
            n *= d
        es = dtype_size(dtypes[i]) if i < len(dtypes) else None
        n_total += n
        b_total = None if b_total is None or es is None else b_total + n * es
    return n_total, b_total


def _pg_ranks(dump: dict) -> dict[str, list[int]]:
    out = {}
    cfg = dump.get("pg_config")
    if isinstance(cfg, dict):
        for name, g in cfg.items():
            ranks = parse_ranks(g.get("ranks")) if isinstance(g, dict) else None
            if ranks:
                out[str(name)] = ranks
    return out


def _pg_named(dump: dict) -> list[dict]:
    """The process groups the job named (``pg_config`` descs other than torch's ``undefined``):
    [{name, desc, ranks}], for the strategy (Megatron's TENSOR_MODEL_PARALLEL_GROUP, ...)."""
    cfg = dump.get("pg_config")
    out = []
    for name, g in (cfg.items() if isinstance(cfg, dict) else ()):
        desc = g.get("desc") if isinstance(g, dict) else None
        ranks = parse_ranks(g.get("ranks")) if isinstance(g, dict) else None
        if isinstance(desc, str) and desc and desc != "undefined" and ranks:
            out.append({"name": str(name), "desc": desc, "ranks": ranks})
    return out


def _last_completed(dump: dict) -> dict[str, int]:
    out = {}
    st = dump.get("pg_status")
    if isinstance(st, dict):
        for pg, s in st.items():
            try:
                out[str(pg)] = int(s.get("last_completed_collective"))
            except (AttributeError, TypeError, ValueError):
                continue
    return out


def entry_row(e: dict, groups: dict, done: dict) -> dict:
    """One FR entry -> comm_op fields (raises KeyError/TypeError/ValueError on a malformed entry)."""
    name = e["profiling_name"]
    op = normalise_op(name.split(" ")[0] if isinstance(name, str) else name)
    if op is None:
        raise ValueError(f"unknown collective {name!r}")
    pg = e.get("process_group")
    pg_name = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(e.get("pg_id"))
    ranks = groups.get(pg_name)
    p2p = bool(e.get("is_p2p")) or op in P2P_OPS
    seq = int(e["p2p_seq_id"] if p2p else e["collective_seq_id"])
    peer = None
    m = _PEER.search(name) if p2p else None
    if m:
        local = int(m.group(3))
        peer = ranks[local] if ranks and local < len(ranks) else local
    n_in, b_in = _bytes(e.get("input_sizes"), e.get("input_dtypes"))
    _, b_out = _bytes(e.get("output_sizes"), e.get("output_dtypes"))
    created = _pos(e.get("time_created_ns"))
    started = _pos(e.get("time_discovered_started_ns"))
    start = started or created
    if start is None:
        raise ValueError("no time_created_ns or time_discovered_started_ns")
    end = _pos(e.get("time_discovered_completed_ns"))
    dur = e.get("duration_ms")
    if end is None and isinstance(dur, (int, float)) and not isinstance(dur, bool) and dur >= 0 \
            and e.get("state") == "completed":
        end = start + int(round(dur * 1e6))
    op_id = e.get("op_id", e.get("collective_seq_id"))
    # pg_status is keyed by the recorder's pg_id (process_group names the group globally).
    passed = not p2p and isinstance(op_id, int) and done.get(str(e.get("pg_id")), -1) >= op_id
    completed = e.get("state") == "completed" or end is not None or passed
    dtypes = e.get("input_dtypes") or []
    return {
        "op": op, "name": name, "group_id": pg_name, "group_ranks": ranks, "peer": peer, "seq": seq,
        "num_elements": n_in, "size_bytes": b_in, "out_size_bytes": b_out,
        "dtype": dtype_name(dtypes[0]) if dtypes else None, "start_ns": start,
        "end_ns": (end if end is not None else start) if completed else None,
        "state": "completed" if completed else "pending", "launch_ns": created,
        "_no_time": completed and end is None,
    }


def _load(path: Path) -> tuple[dict, list, str | None]:
    """(dump dict, entries, truncation note) from a pickle or JSON dump."""
    data, gz_cut = read_bytes(path)
    if not data.strip():
        raise InputFormatError(path, None, "a flight recorder dump (pickle or JSON)", got="empty file")
    if data[:1] == b"\x80":
        obj, partial = safe_pickle.loads(data, path)
        if partial is None:
            return _as_dump(path, obj), _entries(path, obj), None
        entries = _find_entries(partial)
        if not entries:
            raise InputFormatError(path, None, "a complete pickle (or one with complete entries before the cut)",
                                   got="truncated pickle without any complete entry")
        dump = next((p for p in partial if isinstance(p, dict) and "version" in p), {})
        return dump, entries, f"truncated pickle: {len(entries)} complete entries kept"
    try:
        obj = orjson.loads(data)
        return _as_dump(path, obj), _entries(path, obj), "truncated gzip" if gz_cut else None
    except orjson.JSONDecodeError as e:
        entries, dump = _salvage_json(data.decode("utf-8", "replace"))
        if not entries:
            raise InputFormatError(path, None, "a flight recorder dump (pickle or JSON)",
                                   got=f"invalid JSON: {e}") from None
        return dump, entries, f"truncated JSON: {len(entries)} complete entries kept"


def _as_dump(path: Path, obj) -> dict:
    if not isinstance(obj, dict):
        raise InputFormatError(path, None, "a dump object with entries, pg_config, version", got=type(obj).__name__)
    return obj


def _entries(path: Path, dump) -> list:
    entries = dump.get("entries") if isinstance(dump, dict) else None
    if not isinstance(entries, list):
        raise InputFormatError(path, "entries", "a list of flight recorder entries",
                               got=type(entries).__name__)
    return entries


def _find_entries(objs: list) -> list:
    """Complete entry dicts anywhere in partially built objects (a cut list, a dict's pending items)."""
    found, seen = [], set()

    def walk(o, depth=0):
        if depth > 4 or id(o) in seen:
            return
        seen.add(id(o))
        if isinstance(o, dict):
            if all(k in o for k in ENTRY_KEYS):
                found.append(o)
                return
            for v in o.values():
                walk(v, depth + 1)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v, depth + 1)

    for o in objs:
        walk(o)
    return found


def _salvage_json(text: str) -> tuple[list, dict]:
    """Complete entries (and pg_config/pg_status when complete) from a cut-off JSON dump."""
    dec = json.JSONDecoder()
    dump, entries = {}, []
    for key in ("pg_config", "pg_status", "version"):
        i = text.find(f'"{key}"')
        if i >= 0:
            j = text.find(":", i) + 1
            while j < len(text) and text[j] in " \t\r\n":
                j += 1
            try:
                dump[key] = dec.raw_decode(text, j)[0]
            except (json.JSONDecodeError, RecursionError):
                pass
    i = text.find('"entries"')
    if i >= 0:
        pos = text.find("[", i) + 1
        while True:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            try:
                obj, pos = dec.raw_decode(text, pos)
            except (json.JSONDecodeError, RecursionError):
                break
            entries.append(obj)
    return entries, dump


def _shared_groups(rows: list[dict], groups: dict[str, list[int]], batch: ImportBatch) -> list[dict]:
    """The rows without their member lists, which :func:`_groups_frame` joins back once per group.

    A group's list is checked once, not once per row: a 100k-rank group on 2,000 entries was 200M
    per-element checks and 200M Python ints turned into a column (minutes, most of a GB)."""
    bad = {g for g, ranks in groups.items() if not _int32_ranks(ranks)}
    out = []
    for i, r in enumerate(rows):
        r.pop("group_ranks", None)
        if r["group_id"] in bad:
            batch.reject("flight recorder entry: group_ranks out of range or of the wrong type",
                         f"record {i}: group {r['group_id']!r} has a rank outside the 32-bit range")
            continue
        out.append(r)
    return out


def _int32_ranks(ranks: list[int]) -> bool:
    return bool(ranks) and all(type(x) is int for x in ranks) and -(2**31) <= min(ranks) and max(ranks) < 2**31


def _groups_frame(groups: dict[str, list[int]]) -> pl.DataFrame:
    """group_id -> member ranks, one row per group (the checked lists of :func:`_shared_groups`)."""
    ok = {g: r for g, r in groups.items() if _int32_ranks(r)}
    return pl.DataFrame({"group_id": list(ok), "group_ranks": list(ok.values())},
                        schema={"group_id": pl.String, "group_ranks": pl.List(pl.Int32)})


def read_dump(path: Path, opts: ImportOptions) -> ImportBatch:
    rank = file_rank(path, opts, _RANK)
    if rank is None:
        raise InputFormatError(path, None, "the rank at the end of the file name (rank3.pkl) or --opt rank=N",
                               got=path.name)
    dump, entries, cut = _load(path)
    batch = ImportBatch()
    if cut:
        batch.reject("truncated dump (entries after the cut lost)", f"{path.name}: {cut}")
    groups, done = _pg_ranks(dump), _last_completed(dump)
    rows, no_time = [], 0
    for i, e in enumerate(entries):
        try:
            if not isinstance(e, dict):
                raise TypeError(f"entry is a {type(e).__name__}, not an object")
            r = entry_row(e, groups, done)
        except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError) as err:
            batch.reject("malformed flight recorder entry", f"entry {i}: {type(err).__name__}: {err}")
            continue
        no_time += r.pop("_no_time")
        rows.append(r)
    if rows:
        rows = _shared_groups(rows, groups, batch)
    if rows:
        df = rows_frame(rows, {
            "start_ns": pl.Int64, "end_ns": pl.Int64, "launch_ns": pl.Int64,
            "size_bytes": pl.Int64, "out_size_bytes": pl.Int64, "num_elements": pl.Int64, "peer": pl.Int32,
            "seq": pl.Int64, "op": pl.String, "name": pl.String, "group_id": pl.String, "dtype": pl.String,
            "state": pl.String}, batch, "flight recorder entry")
        df = df.join(_groups_frame(groups), on="group_id", how="left", maintain_order="left")
        batch.add("comm_op", df.with_columns(pl.lit(rank, pl.Int32).alias("rank")))
    batch.notes.update(rank=rank, version=str(dump.get("version")), entries=len(entries),
                       completed_without_time=no_time, groups=sorted(groups))
    named = _pg_named(dump)
    if named:
        batch.notes["pg_named"] = named
    return batch


class _FlightRecorder:
    name = "flight_recorder"
    source = "flight_recorder"
    rank_in_name = _RANK
    """a dump is one rank's: the rank its name gives is part of the source's identity (ingest's key)"""
    same_records_any_form = True
    """torch writes one dump as a pickle or as JSON; ingest stores the records of either once."""

    def sniff(self, path: Path, head: bytes) -> bool:
        if head[:1] == b"\x80":
            return any(k in head for k in (b"pg_config", b"profiling_name", b"collective_seq_id"))
        s = head.lstrip()[:1]
        return s == b"{" and (b'"pg_config"' in head or b'"pg_status"' in head) and \
            (b'"entries"' in head or b'"version"' in head) and b'"traceEvents"' not in head

    def read(self, path: Path, opts: ImportOptions) -> ImportBatch:
        return read_dump(path, opts)


FLIGHT_RECORDER = _FlightRecorder()
