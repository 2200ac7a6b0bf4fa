"""The Perfetto export as Perfetto's own protobuf trace (``.pftrace``), written with the ``perfetto`` package.

The events are those of the Chrome JSON export (``rankscope.analysis.whatif``: the real and ideal slices, the
flow arrows, the critical-path track and the metadata naming processes and tracks); here each process becomes
a track descriptor, each of its tracks a child track, each slice a begin/end pair of TrackEvents, and each
arrow a flow id on its source slice that its destination slice terminates. The types are Perfetto's
(``perfetto_trace_pb2``, from the optional ``rankscope[perfetto]`` extra), so any Perfetto tool reads the file.
"""

from __future__ import annotations

import polars as pl

from rankscope.collectors.errors import UsageError


def _pb2():
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
    except ImportError as e:
        raise UsageError("--out *.pftrace needs the perfetto package: pip install 'rankscope[perfetto]' "
                         f"({e}); or write .json / .json.gz") from e
    return perfetto_trace_pb2


def _track_names(meta: list[dict]) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    procs = {m["pid"]: m["args"]["name"] for m in meta if m.get("name") == "process_name"}
    threads = {(m["pid"], m["tid"]): m["args"]["name"] for m in meta if m.get("name") == "thread_name"}
    return procs, threads


def trace_bytes(meta: list[dict], slices: list[pl.DataFrame], flows: pl.DataFrame) -> bytes:
    """One serialised ``Trace``: ``meta`` the metadata events, ``slices`` frames of X events (name, ts, dur,
    pid, tid in microseconds), ``flows`` the s/f events (pid, tid, ts, id) bound to the slice starting there."""
    pb = _pb2()
    trace = pb.Trace()
    procs, threads = _track_names(meta)
    events = pl.concat([f.select("name", pl.col("ts", "dur").cast(pl.Float64), pl.col("pid", "tid").cast(pl.Int64))
                        for f in slices if f.height])
    keys = events.select("pid", "tid").unique().sort("pid", "tid").rows()
    uuid = {k: i + 1 for i, k in enumerate(keys)}
    proc_uuid = {p: len(keys) + 1 + i for i, p in enumerate(sorted({k[0] for k in keys}))}
    for p, u in proc_uuid.items():
        d = trace.packet.add().track_descriptor
        d.uuid = u
        d.process.pid = int(p)
        d.process.process_name = procs.get(p, f"process {p}")
    for (p, t), u in uuid.items():
        d = trace.packet.add().track_descriptor
        d.uuid, d.parent_uuid = u, proc_uuid[p]
        d.name = threads.get((p, t), f"track {t}")
    out_of: dict[tuple, list[int]] = {}
    into: dict[tuple, list[int]] = {}
    for p, t, ts, i, ph in flows.select("pid", "tid", "ts", "id", "ph").iter_rows():
        (out_of if ph == "s" else into).setdefault((p, t, ts), []).append(int(i))
    for name, ts, dur, p, t in events.sort("ts").iter_rows():
        start_ns = int(round(ts * 1e3))
        begin = trace.packet.add()
        begin.timestamp, begin.trusted_packet_sequence_id = start_ns, 1
        ev = begin.track_event
        ev.type, ev.track_uuid, ev.name = pb.TrackEvent.TYPE_SLICE_BEGIN, uuid[(p, t)], str(name)
        ev.flow_ids.extend(out_of.get((p, t, ts), []))
        ev.terminating_flow_ids.extend(into.get((p, t, ts), []))
        end = trace.packet.add()
        end.timestamp, end.trusted_packet_sequence_id = start_ns + int(round(dur * 1e3)), 1
        end.track_event.type, end.track_event.track_uuid = pb.TrackEvent.TYPE_SLICE_END, uuid[(p, t)]
    return trace.SerializeToString()
