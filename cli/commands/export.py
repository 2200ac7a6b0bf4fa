"""``rankscope export``: write a job's data for other tools (``perfetto``: real + ideal timeline)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import click

from rankscope.cli.paths import output_file, pick_job, write_atomic
from rankscope.collectors.errors import UsageError


@click.group()
def export():
    """Export a job's timelines for other tools.

    \b
    Example:
      rankscope export perfetto --store st --job AR --out ar.json.gz
    """


@export.command()
@click.option("--store", "store_dir", required=True, type=click.Path(file_okay=False), help="trace store directory")
@click.option("--job", default=None, help="job to export (default: 'default' or the store's only job)")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False),
              help="output file: .json, .json.gz to compress, or .pftrace (Perfetto protobuf)")
def perfetto(store_dir: str, job: str, out: str):
    """Real and ideal (what-if) timeline as a Chrome JSON trace, for ui.perfetto.dev.

    One process per rank and timeline (``rank N`` and ``rank N (ideal)``), one track per stream; flow
    arrows between the members of each matched collective and each send/recv pair; a ``critical path``
    track of the steps' critical paths. ``--out *.pftrace`` writes Perfetto's protobuf format instead
    (needs the ``rankscope[perfetto]`` extra).
    """
    from rankscope.analysis.runner import ResultCache, result_key, store_version
    from rankscope.collectors.store import Store

    if not Path(store_dir).is_dir():
        raise UsageError(f"--store {store_dir!r}: no such store directory")
    store = Store(store_dir)
    output_file(out, "--out")  # hardstore: checked before the work; exit 1 naming the path
    job = pick_job(store, job, "--store")
    path = Path(out)
    if path.name.endswith(".pftrace"):
        from rankscope.cli.perfetto_trace import trace_bytes

        meta, parts, info = _event_parts(store, job)
        write_atomic(path, trace_bytes(meta, [parts[0], parts[2]], parts[1]), "--out")
        click.echo(f"wrote {info['events']:,} events ({info['ranks']} ranks, real + ideal, flows, critical path) "
                   f"to {path} (Perfetto protobuf)")
        return
    cache = ResultCache(store)
    key = result_key("perfetto-flows", [store_version(store, [job])], job)
    data, info = cache.get_bytes(key), cache.get_json(key + "-info")
    if data is None or info is None:
        meta, parts, info = _event_parts(store, job)
        # one JSON array: metadata first, then each frame's events (polars writes a row-oriented array;
        # the frames differ in columns, so each is written on its own)
        bodies = [json.dumps(meta).encode()[1:-1]]
        for frame in parts:
            buf = io.BytesIO()
            frame.write_json(buf)
            body = buf.getvalue().strip()[1:-1]
            if body:
                bodies.append(body)
        data = b"[" + b",".join(bodies) + b"]"
        cache.put_bytes(key, data)
        cache.put_json(key + "-info", info)
    write_atomic(path, data, "--out", gzip_level=5 if path.name.endswith(".gz") else None)
    click.echo(f"wrote {info['events']:,} events ({info['ranks']} ranks, real + ideal, flows, critical path) to {path}")


def _event_parts(store, job: str) -> tuple[list[dict], list, dict]:
    """(metadata events, [slices, flow arrows, critical-path track] frames, counts) of one job."""
    from rankscope.analysis.critical_path import path_delays, step_paths
    from rankscope.analysis.model import build_job_model
    from rankscope.analysis.whatif import (
        flow_events,
        ideal_durations,
        metadata_events,
        model_graph,
        path_track_events,
        perfetto_events,
    )
    from rankscope.collectors.job_frames import load_job

    # the job model's completed frames and layout: what the straggler section replays
    graph = model_graph(build_job_model(load_job(store, job)))
    ideal = ideal_durations(graph)
    paths = step_paths(graph, graph.actual, path_delays(graph))
    parts = [perfetto_events(graph, ideal), flow_events(graph, ideal),
             path_track_events(graph, ideal, paths.op, paths.kind, paths.dur)]
    info = {"events": sum(f.height for f in parts), "ranks": graph.ops["rank"].n_unique()}
    return metadata_events(graph), parts, info
