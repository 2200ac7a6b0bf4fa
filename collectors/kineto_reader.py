"""Load a PyTorch profiler (Kineto) Chrome-trace JSON into event columns.

The file is parsed once with orjson; complete events (``ph == "X"``) become a
polars frame (``idx, name, cat, pid, tid, ts_ns, dur_ns``) whose ``idx``
points back into the event list, so the few events whose ``args`` matter are
looked up by index instead of decoding every event's args. A truncated file
(a job killed while writing) is cut back to its last complete event.

Times: ``baseTimeNanoseconds + ts * 1000`` (epoch ns on the rank's clock)
where the trace has a base time; without one the source is relative and times
are stored from the trace's first event (``relative_time``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import polars as pl

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.formats import MAX_RANK, read_limited

_MAX_REPAIR_TRIES = 64
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass
class KinetoTrace:
    """One rank's trace: metadata and its complete events as columns."""

    path: Path
    events: list
    """every event of traceEvents (dicts), indexed by ``frame['idx']``"""
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

    def args(self, idx) -> list[dict]:
        """The args dict of each event index (empty dict when absent or not a dict)."""
        ev = self.events
        out = []
        for i in idx:
            e = ev[i]
            a = e.get("args") if e is not None else None
            out.append(a if type(a) is dict else {})
        return out

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


def _rank_in_name(path: Path) -> int | None:
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m and int(m.group(1)) < MAX_RANK else None


def _rank(path: Path, info: dict | None, override: int | None = None) -> tuple[int, str | None]:
    """The trace's rank and, when it had to be assumed, why.

    A trace with no distributedInfo at all comes from a single-process run (HTA's ROCm,
    Triton and CPU-only samples): it is rank 0, and the manifest says so.
    """
    if override is not None:
        return override, None
    if info is None:
        named = _rank_in_name(path)
        return (named, None) if named is not None else (0, SINGLE_PROCESS_NOTE)
    r = info.get("rank")
    if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_RANK:
        return r, None
    named = _rank_in_name(path)
    if named is not None:
        return named, None
    raise InputFormatError(path, "distributedInfo.rank", "the rank in distributedInfo, the file name "
                           "(rank<N>) or --opt rank=N", got=r)


def read_bytes(path: Path) -> tuple[bytes, bool]:
    """The file's bytes, gunzipped within the ingest limits; the flag says a gzip stream ended early."""
    return read_limited(path)


def load(path: Path, rank: int | None = None) -> KinetoTrace:
    """Read one Kineto trace; raises InputFormatError only when nothing in it can be read.

    ``rank`` (from ``--opt rank=N``) overrides the rank the trace declares.
    """
    data, gz_cut = read_bytes(path)
    doc, truncated = _parse(path, data)
    del data
    if type(doc) is not dict or not isinstance(doc.get("traceEvents"), list):
        raise InputFormatError(path, None, "a JSON object with a traceEvents list",
                               got=type(doc).__name__ if type(doc) is not dict else sorted(doc)[:8])
    events = doc["traceEvents"]
    info = doc.get("distributedInfo") if type(doc.get("distributedInfo")) is dict else {}
    rank, rank_note = _rank(path, info if "distributedInfo" in doc else None, rank)
    xs = [i for i, e in enumerate(events) if type(e) is dict and e.get("ph") == "X"]
    n_bad = sum(1 for e in events if type(e) is not dict)
    get = events.__getitem__
    frame = pl.DataFrame({
        "idx": pl.Series(xs, dtype=pl.Int64),
        "name": _num_column([get(i).get("name") for i in xs], pl.String),
        "cat": _num_column([get(i).get("cat") for i in xs], pl.String),
        "pid": _num_column([get(i).get("pid") for i in xs], pl.Int64),
        "tid": _num_column([get(i).get("tid") for i in xs], pl.Int64),
        "ts": _num_column([get(i).get("ts") for i in xs], pl.Float64),
        "dur": _num_column([get(i).get("dur", 0) for i in xs], pl.Float64),
    })
    base = doc.get("baseTimeNanoseconds")
    base = base if isinstance(base, int) and not isinstance(base, bool) and 0 <= base < 4 * 10**18 else None
    tr = KinetoTrace(path=path, events=events, frame=frame, rank=rank,
                     world_size=info.get("world_size") if isinstance(info.get("world_size"), int) else None,
                     host=doc.get("host_name") if isinstance(doc.get("host_name"), str) else None,
                     pid=None, base_ns=base, relative=base is None, origin_us=0.0, dist_info=info,
                     rank_note=rank_note)
    if truncated or gz_cut:
        tr.reject("truncated file (events after the last complete one lost)", f"{path.name}: cut after "
                  f"{len(events)} events")
    if n_bad:
        tr.reject("event is not a JSON object", f"{n_bad} events")
    bad = frame.filter(pl.col("ts").is_null() | pl.col("dur").is_null() | pl.col("name").is_null()
                       | (pl.col("dur") < 0) | ~(pl.col("ts").abs() < MAX_US) | ~(pl.col("dur") < MAX_US))
    if bad.height:
        tr.reject("event without name, numeric ts or dur >= 0", f"event {int(bad['idx'][0])}", bad.height)
        frame = frame.join(bad.select("idx"), on="idx", how="anti")
    if frame.height == 0:
        raise InputFormatError(path, "traceEvents", "at least one complete ('X') event with ts",
                               got=f"{len(events)} events, none usable")
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
    _drop_unused_events(tr)
    return tr


ARGS_NEEDED = (
    # events whose args an importer reads; the others are dropped from memory after the frame is built
    (pl.col("cat").is_in(["kernel", "cuda_runtime", "cuda_driver"]))
    | pl.col("name").is_in(["record_param_comms", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                            "aten::matmul", "aten::linear"])
    | pl.col("name").str.starts_with("c10d::") | pl.col("name").str.starts_with("gloo:")
    | pl.col("name").str.starts_with("nccl:")
)


def _drop_unused_events(tr: KinetoTrace) -> None:
    """Free the parsed dicts nobody will read (half or more of a GPU trace: flows, most cpu_ops)."""
    keep = np.zeros(len(tr.events), dtype=bool)
    keep[tr.frame.filter(ARGS_NEEDED)["idx"].to_numpy()] = True
    ev = tr.events
    for i in np.nonzero(~keep)[0].tolist():
        ev[i] = None


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
