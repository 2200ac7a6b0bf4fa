"""Load a PyTorch profiler (Kineto) Chrome-trace JSON into event columns.

The event array is streamed in chunks that orjson parses one at a time
(importers.kineto.event_chunks); complete events (``ph == "X"``) become a polars frame
(``idx, name, cat, pid, tid, ts_ns, dur_ns``) whose ``idx`` is the event's
position in the file, and only the ``args`` of the events an importer reads
(ARGS_NEEDED) are kept, by that index. A file the stream does not take (a
truncated one: a job killed while writing) is read whole and cut back to its
last complete event.

Times: ``baseTimeNanoseconds + ts * 1000`` (epoch ns on the rank's clock)
where the trace has a base time; without one the source is relative and times
are stored from the trace's first event (``relative_time``).
"""

from __future__ import annotations

import re
from array import array
from dataclasses import field
from pathlib import Path

import numpy as np
import orjson
import polars as pl

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers.contract import MAX_RANK, rank_in_name, read_limited
from rankscope.collectors.importers.kineto.event_chunks import Irregular, stream_events
from rankscope.collectors.record_class import record

_MAX_REPAIR_TRIES = 64
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


class ArgStore:
    """The args of some events, by event index, as compact JSON in one growing buffer.

    Why not the dicts: they take about five times the memory, and thousands of small
    objects that outlive each parsed chunk keep its freed memory from going back.
    Events must be added in increasing index order.
    """

    def __init__(self) -> None:
        self._blob = bytearray()
        self._idx = array("q")
        self._end = array("q")
        self._odd: dict[int, dict] = {}
        """args orjson reads but will not write back (an int beyond 64 bits): kept as they are"""

    def add(self, i: int, args: object) -> None:
        if type(args) is not dict:
            return  # read back as {}
        try:
            self._blob += orjson.dumps(args)
        except (orjson.JSONEncodeError, TypeError):
            self._odd[i] = args
            return
        self._idx.append(i)
        self._end.append(len(self._blob))

    def __len__(self) -> int:
        return len(self._idx) + len(self._odd)

    def get(self, idx) -> list[dict]:
        """The args dict of each event index (a new empty dict where none was kept)."""
        want = np.asarray(idx, dtype=np.int64)
        have = np.frombuffer(self._idx, dtype=np.int64) if len(self._idx) else np.zeros(0, np.int64)
        pos = np.searchsorted(have, want)
        found = pos < len(have)
        found[found] = have[pos[found]] == want[found]
        ends = np.frombuffer(self._end, dtype=np.int64) if len(self._end) else np.zeros(0, np.int64)
        view, loads, odd = memoryview(self._blob), orjson.loads, self._odd
        out = []
        for i, p, f in zip(want.tolist(), pos.tolist(), found.tolist(), strict=True):
            if f:
                out.append(loads(view[(ends[p - 1] if p else 0):ends[p]]))
            else:
                a = odd.get(i)
                out.append(a if a is not None else {})
        return out


@record(frozen=False)
class KinetoTrace:
    """One rank's trace: metadata and its complete events as columns."""

    path: Path
    arg_map: ArgStore
    """the args of the events an importer reads (ARGS_NEEDED), by ``frame['idx']``"""
    frame: pl.DataFrame
    """complete events: idx, name, cat, pid, tid, ts_ns, dur_ns (end = ts_ns + dur_ns)"""
    rank: int
    world_size: int | None
    host: str | None
    pid: int | None
    base_ns: int | None
    relative: bool
    origin_us: float
    """the trace-clock time (µs) that became 0 for a relative trace; 0 otherwise"""
    dist_info: dict
    rank_note: str | None = None
    """why the rank was assumed (a single-process trace); None when the trace or the user gave it"""
    rejects: dict[str, int] = field(default_factory=dict)
    samples: dict[str, str] = field(default_factory=dict)
    memo: dict = field(default_factory=dict, repr=False)
    """what more than one importer step derives from the trace, derived once"""

    def args(self, idx) -> list[dict]:
        """The args dict of each event index (empty dict when absent or not a dict)."""
        return self.arg_map.get(idx)

    def reject(self, reason: str, sample: str, count: int = 1) -> None:
        self.rejects[reason] = self.rejects.get(reason, 0) + count
        self.samples.setdefault(reason, sample[:300])


def _parse(path: Path, data: bytes) -> tuple[dict, bool]:
    """The trace object, and whether it had to be cut back after truncation."""
    if not data.strip():
        raise InputFormatError(path, None, "a Kineto Chrome-trace JSON object", got="empty file")
    try:
        return orjson.loads(data), False
    except orjson.JSONDecodeError as first:
        start = data.find(b'"traceEvents"')
        if start < 0:
            raise InputFormatError(path, None, "a Kineto Chrome-trace JSON object",
                                   got=f"invalid JSON: {first}") from None
        # Cut after the last '}' that closes an event of the array and close the document.
        end = len(data)
        for _ in range(_MAX_REPAIR_TRIES):
            end = data.rfind(b"}", start, end)
            if end < 0:
                break
            try:
                return orjson.loads(data[:end + 1] + b"]}"), True
            except orjson.JSONDecodeError:
                continue
        raise InputFormatError(path, "traceEvents", "a complete or truncated-but-recoverable event list",
                               got=f"invalid JSON: {first}") from None


MAX_US = 4e15
"""|ts| and dur beyond this many microseconds (year 2096 as epoch time) cannot be times."""


def _num_column(values: list, dtype) -> pl.Series:
    """Values as one typed column; a value of another type or out of range becomes null
    (and the event is rejected downstream), never an exception."""
    try:
        return pl.Series(values, dtype=dtype, strict=False)
    except Exception:  # noqa: BLE001 - mixed lists/ints/huge ints; sort them out one by one below
        pass
    if dtype == pl.String:
        ok = [v if isinstance(v, str) else None for v in values]
    elif dtype == pl.Int64:
        ok = [v if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 else None
              for v in values]
    else:
        ok = [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e300 else None
              for v in values]
    return pl.Series(ok, dtype=dtype)


SINGLE_PROCESS_NOTE = ("no distributedInfo and no rank in the file name: read as a single-process trace, "
                       "rank 0 (give --opt rank=N to place it)")


def _rank(path: Path, info: dict | None, override: int | None = None) -> tuple[int, str | None]:
    """The trace's rank and, when it had to be assumed, why.

    A trace with no distributedInfo at all comes from a single-process run (HTA's ROCm,
    Triton and CPU-only samples): it is rank 0, and the manifest says so.
    """
    if override is not None:
        return override, None
    if info is None:
        named = rank_in_name(path)
        return (named, None) if named is not None else (0, SINGLE_PROCESS_NOTE)
    r = info.get("rank")
    if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_RANK:
        return r, None
    named = rank_in_name(path)
    if named is not None:
        return named, None
    raise InputFormatError(path, "distributedInfo.rank", "the rank in distributedInfo, the file name "
                           "(rank<N>) or --opt rank=N", got=r)


def read_bytes(path: Path) -> tuple[bytes, bool]:
    """The file's bytes, gunzipped within the ingest limits; the flag says a gzip stream ended early."""
    return read_limited(path)


def load(path: Path, rank: int | None = None) -> KinetoTrace:
    """Read one Kineto trace; raises InputFormatError only when nothing in it can be read.

    ``rank`` (from ``--opt rank=N``) overrides the rank the trace declares. The
    event array is streamed in chunks (importers.kineto.event_chunks); a file of any other shape
    (truncated, invalid, oddly nested) is read whole, as it always was.
    """
    try:
        parts = _streamed(path)
    except (Irregular, InputFormatError):
        parts = None  # the whole-file path gives such files their exact old treatment and errors
    if parts is None:
        parts = _whole(path)
    return _trace(path, rank, *parts)


def _streamed(path: Path) -> tuple:
    frames, arg_map, n_events, n_bad = [], ArgStore(), 0, 0
    doc = None
    for item in stream_events(path):
        if type(item) is dict:
            doc = item
            break
        f, bad = _chunk_columns(item, n_events, arg_map)
        frames.append(f)
        n_events += len(item)
        n_bad += bad
        del item  # before the next chunk is parsed: one chunk's dicts alive at a time
    if doc is None:
        raise Irregular("no document")
    return doc, frames, arg_map, n_events, n_bad, False, False


def _whole(path: Path) -> tuple:
    data, gz_cut = read_bytes(path)
    doc, truncated = _parse(path, data)
    del data
    if type(doc) is not dict or not isinstance(doc.get("traceEvents"), list):
        raise InputFormatError(path, None, "a JSON object with a traceEvents list",
                               got=type(doc).__name__ if type(doc) is not dict else sorted(doc)[:8])
    events = doc["traceEvents"]
    arg_map = ArgStore()
    frame, n_bad = _chunk_columns(events, 0, arg_map)
    return doc, [frame], arg_map, len(events), n_bad, truncated, gz_cut


def _chunk_columns(events: list, base: int, arg_map: ArgStore) -> tuple[pl.DataFrame, int]:
    """The complete events of one chunk as columns (``idx`` counts from the file's first event),
    and the number of elements that are not objects; the args an importer reads go to ``arg_map``."""
    xs = [i for i, e in enumerate(events) if type(e) is dict and e.get("ph") == "X"]
    n_bad = sum(1 for e in events if type(e) is not dict)
    x_events = [events[i] for i in xs]
    names = [e.get("name") for e in x_events]
    cats = [e.get("cat") for e in x_events]
    frame = pl.DataFrame({
        "idx": pl.Series(xs, dtype=pl.Int64) + base,
        "name": _num_column(names, pl.String),
        "cat": _num_column(cats, pl.String),
        "pid": _num_column([e.get("pid") for e in x_events], pl.Int64),
        "tid": _num_column([e.get("tid") for e in x_events], pl.Int64),
        "ts": _num_column([e.get("ts") for e in x_events], pl.Float64),
        "dur": _num_column([e.get("dur", 0) for e in x_events], pl.Float64),
    })
    # keep only the args an importer will read (ARGS_NEEDED): the parsed dicts of everything else are freed
    # with the chunk. Tested in Python: a polars filter per chunk cost more than building the columns.
    for i, c, n in zip(xs, cats, names, strict=True):
        if (type(c) is str and c in _ARGS_CATS) or (type(n) is str and (n in _ARGS_NAMES
                                                                       or n.startswith(_ARGS_PREFIXES))):
            arg_map.add(i + base, events[i].get("args"))
    return frame, n_bad


def _trace(path: Path, rank: int | None, doc: dict, frames: list[pl.DataFrame], arg_map: ArgStore,
           n_events: int, n_bad: int, truncated: bool, gz_cut: bool) -> KinetoTrace:
    info = doc.get("distributedInfo") if type(doc.get("distributedInfo")) is dict else {}
    rank, rank_note = _rank(path, info if "distributedInfo" in doc else None, rank)
    frame = frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")
    del frames
    base = doc.get("baseTimeNanoseconds")
    base = base if isinstance(base, int) and not isinstance(base, bool) and 0 <= base < 4 * 10**18 else None
    tr = KinetoTrace(path=path, arg_map=arg_map, frame=frame, rank=rank,
                     world_size=info.get("world_size") if isinstance(info.get("world_size"), int) else None,
                     host=doc.get("host_name") if isinstance(doc.get("host_name"), str) else None,
                     pid=None, base_ns=base, relative=base is None, origin_us=0.0, dist_info=info,
                     rank_note=rank_note)
    if truncated or gz_cut:
        tr.reject("truncated file (events after the last complete one lost)", f"{path.name}: cut after "
                  f"{n_events} events")
    if n_bad:
        tr.reject("event is not a JSON object", f"{n_bad} events")
    bad = frame.filter(pl.col("ts").is_null() | pl.col("dur").is_null() | pl.col("name").is_null()
                       | (pl.col("dur") < 0) | ~(pl.col("ts").abs() < MAX_US) | ~(pl.col("dur") < MAX_US))
    if bad.height:
        tr.reject("event without name, numeric ts or dur >= 0", f"event {int(bad['idx'][0])}", bad.height)
        frame = frame.join(bad.select("idx"), on="idx", how="anti")
    if frame.height == 0:
        raise InputFormatError(path, "traceEvents", "at least one complete ('X') event with ts",
                               got=f"{n_events} events, none usable")
    if tr.relative:
        tr.origin_us = float(frame["ts"].min())
    ts_ns = (frame["ts"] - tr.origin_us) * 1000.0
    frame = frame.with_columns(
        (ts_ns.round(0).cast(pl.Int64) + (base or 0)).alias("ts_ns"),
        (frame["dur"] * 1000.0).round(0).cast(pl.Int64).alias("dur_ns"),
    ).drop("ts", "dur")
    tr.frame = frame
    cpu = frame.filter(pl.col("cat") == "cpu_op")["pid"].drop_nulls()
    tr.pid = int(cpu.mode().sort()[0]) if cpu.len() else None
    return tr


# ARGS_NEEDED: the events whose args an importer reads, by category or name; the args of the others
# are dropped from memory after the chunk's columns are built
_ARGS_CATS = frozenset(("kernel", "cuda_runtime", "cuda_driver"))
_ARGS_NAMES = frozenset(("record_param_comms", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                         "aten::matmul", "aten::linear"))
_ARGS_PREFIXES = ("c10d::", "gloo:", "nccl:")
def step_frame(tr: KinetoTrace) -> pl.DataFrame:
    """ProfilerStep#N spans: step, start_ns, end_ns, sorted by start."""
    f = tr.frame.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    f = f.with_columns(pl.col("name").str.extract(r"^ProfilerStep#(\d+)$", 1).cast(pl.Int64).alias("step"))
    f = f.filter(pl.col("step").is_not_null())
    return f.select("step", pl.col("ts_ns").alias("start_ns"),
                    (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns")).sort("start_ns")


def steps_at(steps: pl.DataFrame, t_ns: np.ndarray) -> np.ndarray:
    """Step whose span contains each time (float array with NaN where none does)."""
    out = np.full(len(t_ns), np.nan)
    if steps.height == 0 or len(t_ns) == 0:
        return out
    starts = steps["start_ns"].to_numpy()
    ends = steps["end_ns"].to_numpy()
    pos = np.searchsorted(starts, t_ns, side="right") - 1
    ok = pos >= 0
    posc = np.clip(pos, 0, None)
    ok &= t_ns < ends[posc]
    out[ok] = steps["step"].to_numpy()[posc[ok]]
    return out


def containing(outer: pl.DataFrame, inner_tid: np.ndarray, inner_t: np.ndarray) -> np.ndarray:
    """Row index into ``outer`` (tid, ts_ns, dur_ns; non-overlapping per tid) of the span holding each time.

    -1 where no span on the same thread contains it. Spans that nest on one
    thread resolve to the latest-starting one, which is the innermost.
    """
    res = np.full(len(inner_t), -1, dtype=np.int64)
    if outer.height == 0 or len(inner_t) == 0:
        return res
    o = outer.with_row_index("_row").sort("tid", "ts_ns")
    o_tid = o["tid"].fill_null(-1).to_numpy()
    o_ts = o["ts_ns"].to_numpy()
    o_end = o_ts + o["dur_ns"].to_numpy()
    o_row = o["_row"].to_numpy()
    for tid in np.unique(inner_tid):
        sel = np.nonzero(inner_tid == tid)[0]
        lo, hi = np.searchsorted(o_tid, tid, "left"), np.searchsorted(o_tid, tid, "right")
        if lo == hi:
            continue
        ts, end, row = o_ts[lo:hi], o_end[lo:hi], o_row[lo:hi]
        pos = np.searchsorted(ts, inner_t[sel], side="right") - 1
        ok = pos >= 0
        posc = np.clip(pos, 0, None)
        ok &= inner_t[sel] <= end[posc]
        res[sel[ok]] = row[posc[ok]]
    return res
