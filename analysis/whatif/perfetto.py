"""The real and the ideal (what-if) timeline of a job as Chrome JSON trace events (Perfetto).

One process per rank and timeline ("rank 3" real, "rank 3 (ideal)"), one
track (thread) per stream: compute, dp-comm, the pipeline send/recv streams,
other collectives. Events are complete ("ph": "X") with times in
microseconds. The ideal timeline is the replay with every compute at its op
type's mean and every transfer at its op type's median (T_ideal of
OSDI'25). Traces with per-step relative times (OSDI'25 traces start every
step at 0) are laid out step after step; epoch traces keep their times and
each ideal step starts where the real one did.

Pure: returns a polars DataFrame of events; the CLI writes the file.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.whatif.graph import WhatIfGraph

IDEAL_PID_OFFSET = 1_000_000
"""pid of a rank's ideal timeline = rank + this (keeps real and ideal processes apart)."""
PATH_PID = 2_000_000
"""pid of the critical-path track (above every rank's real and ideal process)."""
_GAP_NS = 1_000_000.0
"""space between stacked steps (1 ms) so step boundaries are visible."""


def _step_origin(graph: WhatIfGraph, ideal_end: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Where each step starts on the output clock (real and ideal), and whether real times are shifted."""
    ops = graph.ops
    si = graph.step_index
    n = len(graph.steps)
    lo = np.full(n, np.inf)
    hi = np.full(n, -np.inf)
    np.minimum.at(lo, si, ops["start_ns"].to_numpy())
    np.maximum.at(hi, si, ops["end_ns"].to_numpy())
    ideal_span = np.zeros(n)
    np.maximum.at(ideal_span, si, ideal_end)
    overlapping = n > 1 and bool(np.any(lo[1:] < hi[:-1]))
    if not overlapping:
        return lo, lo, False
    span = np.maximum(hi - lo, ideal_span) + _GAP_NS
    origin = np.concatenate([[0.0], np.cumsum(span)[:-1]])
    return origin, lo, True


def _timelines(graph: WhatIfGraph, ideal: np.ndarray) -> tuple[np.ndarray, ...]:
    """(real start, real end, ideal start, ideal end) of every op on the output clock, ns."""
    ops = graph.ops
    i_start, i_end = graph.replay(ideal)
    origin, real_lo, shifted = _step_origin(graph, i_end)
    si = graph.step_index
    start = ops["start_ns"].to_numpy()
    end = ops["end_ns"].to_numpy()
    if shifted:
        start = origin[si] + (start - real_lo[si])
        end = origin[si] + (end - real_lo[si])
    return start, end, origin[si] + i_start, origin[si] + i_end


def perfetto_events(graph: WhatIfGraph, ideal: np.ndarray) -> pl.DataFrame:
    """Chrome trace events of the real and the ideal timeline.

    Needs a WhatIfGraph (ops with rank, step, optype, stream, microbatch,
    start_ns, end_ns) and per-op ideal replay durations. Returns columns
    name, cat, ph, ts, dur, pid, tid, args (struct) -- one row per op and
    timeline; :func:`metadata_events` names the processes and tracks.
    """
    ops = graph.ops
    start, end, i_start, i_end = _timelines(graph, ideal)
    tid_of = _tids(graph)
    base = ops.select(
        # strings, as the metadata events these go beside (the osdi graph holds both as categories)
        pl.col("optype").cast(pl.String).fill_null("op").alias("name"), pl.col("stream").cast(pl.String).alias("cat"),
        pl.col("rank").cast(pl.Int64),
        pl.col("stream").replace_strict(tid_of, return_dtype=pl.Int64).alias("tid"),
        pl.struct(pl.col("step"), pl.col("microbatch"), pl.col("stage")).alias("args"))
    real = base.with_columns(
        pl.lit("X").alias("ph"), pl.Series("ts", start / 1e3), pl.Series("dur", (end - start) / 1e3),
        pl.col("rank").alias("pid"))
    idl = base.with_columns(
        pl.lit("X").alias("ph"), pl.Series("ts", i_start / 1e3),
        pl.Series("dur", np.maximum(i_end - i_start, 0.0) / 1e3),
        (pl.col("rank") + IDEAL_PID_OFFSET).alias("pid"))
    cols = ["name", "cat", "ph", "ts", "dur", "pid", "tid", "args"]
    return pl.concat([real.select(cols), idl.select(cols)])


def flow_events(graph: WhatIfGraph, ideal: np.ndarray) -> pl.DataFrame:
    """Flow arrows (Chrome "s"/"f" events, bound to the enclosing slice) on the real timeline: from each
    matched collective's first member to every other member, and from each send to its recv.

    Returns columns name, cat, ph, ts, pid, tid, id, bp: one start and one finish event per arrow."""
    start = _timelines(graph, ideal)[0]
    ops = graph.ops
    members = np.flatnonzero(graph.group >= 0)
    if members.size == 0:
        return pl.DataFrame(schema={"name": pl.String, "cat": pl.String, "ph": pl.String, "ts": pl.Float64,
                                    "pid": pl.Int64, "tid": pl.Int64, "id": pl.Int64, "bp": pl.String})
    tid = ops["stream"].replace_strict(_tids(graph), return_dtype=pl.Int64).to_numpy()
    is_send = (ops["stream"] == "send").to_numpy()
    g = graph.group[members]
    # the source of a group's arrows: its send (a p2p pair), else its earliest member
    order = np.lexsort((start[members], ~is_send[members], g))
    m, gs = members[order], g[order]
    first = np.r_[True, gs[1:] != gs[:-1]]
    src = m[np.maximum.accumulate(np.where(first, np.arange(m.size), 0))]
    dst_ok = ~first
    src, dst = src[dst_ok], m[dst_ok]
    rank = ops["rank"].cast(pl.Int64).to_numpy()
    name = ops["optype"].fill_null("op").to_numpy()
    ids = np.arange(src.size, dtype=np.int64)

    def side(ix: np.ndarray, ph: str) -> pl.DataFrame:
        return pl.DataFrame({"name": name[ix], "cat": "sync", "ph": ph, "ts": start[ix] / 1e3, "pid": rank[ix],
                             "tid": tid[ix], "id": ids, "bp": "e"})

    return pl.concat([side(src, "s"), side(dst, "f")])


def path_track_events(graph: WhatIfGraph, ideal: np.ndarray, op: np.ndarray, kind: np.ndarray,
                      dur: np.ndarray) -> pl.DataFrame:
    """The critical path as one track (process PATH_PID) on the real timeline: per path segment (``op`` the op
    row, ``kind`` 0 = the op's work, 1 = the launch gap before it, ``dur`` ns) a slice named after the rank and
    op, placed at the op's recorded end (work) or start (gap). Columns as :func:`perfetto_events`."""
    start, end, _, _ = _timelines(graph, ideal)
    rank = graph.ops["rank"].cast(pl.Int64).to_numpy()[op]
    optype = graph.ops["optype"].fill_null("op").to_numpy()[op]
    work = kind == 0
    s = np.where(work, end[op] - dur, start[op] - dur)
    names = [f"rank {r} {t}" if w else f"rank {r} launch gap before {t}"
             for r, t, w in zip(rank.tolist(), optype.tolist(), work.tolist(), strict=True)]
    return pl.DataFrame({"name": names, "cat": "critical_path", "ph": "X", "ts": s / 1e3, "dur": dur / 1e3,
                         "pid": PATH_PID, "tid": 1, "args": [{"rank": int(r)} for r in rank.tolist()]})


def metadata_events(graph: WhatIfGraph) -> list[dict]:
    """Process and thread names (and order) for :func:`perfetto_events`: a few per rank, plain dicts."""
    tid_of = _tids(graph)
    out = []
    for r in graph.ops["rank"].unique().sort().to_list():
        for pid, label in ((r, f"rank {r}"), (r + IDEAL_PID_OFFSET, f"rank {r} (ideal)")):
            out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}})
            out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
            for s, tid in tid_of.items():
                out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": s}})
    out.append({"name": "process_name", "ph": "M", "pid": PATH_PID, "tid": 0, "args": {"name": "critical path"}})
    out.append({"name": "process_sort_index", "ph": "M", "pid": PATH_PID, "tid": 0, "args": {"sort_index": -1}})
    return out


def _tids(graph: WhatIfGraph) -> dict[str, int]:
    streams = sorted(graph.ops["stream"].unique().to_list(), key=lambda s: (s != "compute", s))
    return {s: i + 1 for i, s in enumerate(streams)}
