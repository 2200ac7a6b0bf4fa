"""``rankscope dashboard``: serve the Dash app over one or more trace stores."""

from __future__ import annotations

import click


@click.command()
@click.option("--store", "store_dirs", required=True, multiple=True, type=click.Path(exists=True, file_okay=False),
              help="trace store to show (repeat for several; the page chooses only among these)")
@click.option("--port", default=8050, show_default=True, type=click.IntRange(1, 65535),
              help="HTTP port of the dashboard")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to listen on (beyond loopback needs --auth)")
@click.option("--baseline", "baseline_dirs", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="store of a baseline run for the run diff (repeatable)")
@click.option("--refresh", "refresh_s", default=15.0, show_default=True, type=click.FloatRange(1.0, 3600.0),
              help="seconds between re-reads of the store (a live store shows fresh data)")
@click.option("--auth", default=None, envvar="RANKSCOPE_DASHBOARD_AUTH", metavar="USER:PASSWORD",
              help="require HTTP basic auth (env RANKSCOPE_DASHBOARD_AUTH); needed with a non-loopback --host")
@click.option("--warm/--no-warm", default=True, show_default=True,
              help="analyse each store's first job at start, so the first page view comes from the cache")
@click.option("--topology", "topology_path", default=None, type=click.Path(dir_okay=False),
              help="CSV endpoint,host,leaf,pod[,spine]: where each NIC (or rank) hangs, for the network view "
                   "(as analyze --topology)")
def dashboard(store_dirs, port, host, baseline_dirs, refresh_s, auth, warm, topology_path):
    """Serve the rankscope dashboard: strategy, timelines, stragglers, regressions, hangs, run diff.

    \b
    Example:
      rankscope dashboard --store st --port 8050
      rankscope dashboard --store st --topology topo.csv
      # then open http://127.0.0.1:8050
    """
    from rankscope.dashboard.app import serve
    from rankscope.dashboard.security import check_bind, parse_auth

    if topology_path:
        from rankscope.analysis.diagnose import DiagnoseConfig
        from rankscope.analysis.network import read_topology
        from rankscope.dashboard.analysis_source import use_config

        topology = read_topology(topology_path)
        for note in topology.notes:
            click.echo(f"warning: {note}", err=True)
        use_config(DiagnoseConfig(topology=topology))

    creds = parse_auth(auth)
    check_bind(host, creds)
    shown = ", ".join(store_dirs)
    click.echo(f"rankscope dashboard on http://{host}:{port} (store {shown}); Ctrl-C to stop", err=True)
    serve(list(store_dirs), host=host, port=port, interval_s=refresh_s, baseline_dir=list(baseline_dirs),
          auth=creds, warm=warm)
