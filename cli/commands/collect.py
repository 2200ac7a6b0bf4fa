"""``rankscope collect``: live collectors; ``collect flows`` receives switch flow exports over UDP."""

from __future__ import annotations

import click

from rankscope.cli.commands.ingest import echo_rejects
from rankscope.cli.paths import output_dir
from rankscope.collectors.errors import UsageError


@click.group()
def collect():
    """Run a live collector that writes into a trace store.

    \b
    Example:
      rankscope collect flows --listen 0.0.0.0:4739 --listen 0.0.0.0:6343 --store st
    """


@collect.command()
@click.option("--listen", "listen", multiple=True, required=True, metavar="ADDR:PORT",
              help="UDP address:port to receive IPFIX / NetFlow v9 / v5 / sFlow on (repeatable)")
@click.option("--store", "store_dir", required=True, type=click.Path(file_okay=False),
              help="trace store directory (created if missing)")
@click.option("--job", default="fabric", show_default=True, help="capture name the flows are stored under")
@click.option("--roll-seconds", default=5.0, show_default=True, type=float,
              help="write a Parquet part at least this often")
@click.option("--roll-records", default=200_000, show_default=True, type=int,
              help="write a part once this many records are buffered (bounds memory)")
@click.option("--max-seconds", default=None, type=float, help="stop after this long (default: until SIGTERM/SIGINT)")
@click.option("--rcvbuf-mb", default=64, show_default=True, type=int, help="socket receive buffer per port, MiB")
def flows(listen, store_dir, job, roll_seconds, roll_records, max_seconds, rcvbuf_mb):
    """Receive flow exports from switches and store them as flow records.

    Every datagram's protocol is detected, so IPFIX, NetFlow and sFlow may
    share a port. SIGTERM or SIGINT writes everything received, then exits.

    \b
    Example:
      rankscope collect flows --listen 0.0.0.0:4739 --store st --job fabric --roll-seconds 2
    """
    from rankscope.collectors.flows.udp_collector import CollectorConfig, FlowCollector, parse_listen

    if rcvbuf_mb < 1:
        raise UsageError(f"--rcvbuf-mb {rcvbuf_mb}: expected >= 1")
    config = CollectorConfig(listen=tuple(parse_listen(x) for x in listen), store=store_dir, job=job,
                             roll_seconds=roll_seconds, roll_records=roll_records, max_seconds=max_seconds,
                             rcvbuf_bytes=rcvbuf_mb << 20)
    output_dir(store_dir, "--store")  # hardstore: a bad store path exits 1 naming it
    coll = FlowCollector(config)
    coll.install_signal_handlers()  # before "listening": a SIGTERM right after it must stop us gracefully
    bound = coll.open()
    for (addr, port), granted in zip(bound, coll.stats.rcvbuf_bytes.values()):
        click.echo(f"listening on udp {addr}:{port} (receive buffer {granted:,} bytes)")
    click.echo(f"writing to {store_dir} as job {job!r}; SIGTERM/SIGINT to stop", nl=True)
    import sys

    sys.stdout.flush()
    coll.run()
    click.echo(coll.summary_line())
    echo_rejects(coll.all_rejects)
