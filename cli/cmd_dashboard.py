"""``rankscope dashboard``: serve the Dash app over a trace store."""

from __future__ import annotations

import click


@click.command()
@click.option("--store", "store_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="trace store to show (can be changed in the page)")
@click.option("--port", default=8050, show_default=True, type=click.IntRange(1, 65535))
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--baseline", "baseline_dir", type=click.Path(exists=True, file_okay=False),
              help="store of a baseline run for the run diff")
@click.option("--refresh", "refresh_s", default=15.0, show_default=True, type=click.FloatRange(1.0, 3600.0),
              help="seconds between re-reads of the store (a live store shows fresh data)")
def dashboard(store_dir, port, host, baseline_dir, refresh_s):
    """Serve the rankscope dashboard: strategy, timelines, stragglers, regressions, hangs, run diff.

    \b
    Example:
      rankscope dashboard --store st --port 8050
      # then open http://127.0.0.1:8050
    """
    from rankscope.dashboard.app import serve

    click.echo(f"rankscope dashboard on http://{host}:{port} (store {store_dir}); Ctrl-C to stop", err=True)
    serve(store_dir, host=host, port=port, interval_s=refresh_s, baseline_dir=baseline_dir)
