"""``rankscope metrics``: Prometheus series of a store's jobs, served over HTTP or written as a textfile."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from rankscope.collectors.errors import StoreError, UsageError


@click.command()
@click.option("--store", "store_dirs", required=True, multiple=True,
              help="trace store to analyse (repeat for several stores)")
@click.option("--job", default=None, help="only this job (default: every job the store holds)")
@click.option("--port", type=click.IntRange(0, 65535), default=9464, show_default=True,
              help="HTTP port of the /metrics endpoint (0 picks a free one)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind the endpoint to")
@click.option("--textfile", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the series to this file once (node-exporter textfile collector) and exit")
@click.option("--settle-s", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="a job `rankscope watch` follows is analysed whole only once its records were still this long")
def metrics(store_dirs, job, port, host, textfile, settle_s):
    """Prometheus metrics: step time, slowdown S, per-rank straggler scores, bytes, collector counts.

    Each job is analysed once per version of its records (re-analysed when records land). A job that
    `rankscope watch` follows is not re-analysed while it runs: its window series update once per window,
    and it is analysed whole once its records have been still for --settle-s.

    \b
    Example:
      rankscope metrics --store st --port 9464
      rankscope metrics --store st --textfile /var/lib/node_exporter/textfile/rankscope.prom
    """
    from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile

    from rankscope.collectors.store import Store
    from rankscope.dashboard.prometheus_metrics import StoreCollector

    stores = []
    for d in store_dirs:
        if not Path(d).is_dir():
            raise UsageError(f"--store {d}: no such store directory")
        stores.append(Store(d))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(stores, job, settle_s=settle_s))
    if textfile is not None:
        try:
            write_to_textfile(str(textfile), registry)
        except OSError as e:
            raise StoreError(f"--textfile {textfile}: cannot write ({e.strerror or e})") from e
        click.echo(f"wrote {textfile}")
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise StoreError(f"cannot listen on {host}:{port} ({e.strerror or e})") from e
    click.echo(f"serving metrics on http://{host}:{server.server_port}/metrics", err=True)
    stop.wait()
    server.shutdown()
