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
              help="output file: .json, or .json.gz to compress")
def perfetto(store_dir: str, job: str, out: str):
    """Real and ideal (what-if) timeline as a Chrome JSON trace, for ui.perfetto.dev.

    One process per rank and timeline (``rank N`` and ``rank N (ideal)``), one track per stream.
    """
    from rankscope.analysis.model import build_job_model
    from rankscope.analysis.runner import ResultCache, result_key, store_version
    from rankscope.analysis.whatif import ideal_durations, metadata_events, model_graph, perfetto_events
    from rankscope.collectors.job_frames import load_job
    from rankscope.collectors.store import Store

    if not Path(store_dir).is_dir():
        raise UsageError(f"--store {store_dir!r}: no such store directory")
    store = Store(store_dir)
    output_file(out, "--out")  # hardstore: checked before the work; exit 1 naming the path
    job = pick_job(store, job, "--store")
    cache = ResultCache(store)
    key = result_key("perfetto", [store_version(store, [job])], job)
    data, info = cache.get_bytes(key), cache.get_json(key + "-info")
    if data is None or info is None:
        # the job model's completed frames and layout: what the straggler section replays
        graph = model_graph(build_job_model(load_job(store, job)))
        events = perfetto_events(graph, ideal_durations(graph))
        buf = io.BytesIO()
        events.write_json(buf)
        body = buf.getvalue().strip()
        meta = json.dumps(metadata_events(graph)).encode()
        # one JSON array: metadata first, then the events (polars writes a row-oriented array)
        data = meta[:-1] + (b"," + body[1:] if len(body) > 2 else b"]")
        info = {"events": events.height, "ranks": graph.ops["rank"].n_unique()}
        cache.put_bytes(key, data)
        cache.put_json(key + "-info", info)
    path = Path(out)
    write_atomic(path, data, "--out", gzip_level=5 if path.name.endswith(".gz") else None)
    click.echo(f"wrote {info['events']:,} events ({info['ranks']} ranks, real + ideal) to {path}")
