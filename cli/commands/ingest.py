"""``rankscope ingest``: import files into the trace store."""

from __future__ import annotations

import click

from rankscope.cli.paths import output_dir
from rankscope.collectors.errors import UsageError

# The importers pull in polars and pyarrow; they load when ingest runs, not when `rankscope --help` lists it.


def echo_rejects(rejects) -> None:
    """Rejected records by reason, most frequent first (ingest and collect print the same block)."""
    if rejects:
        click.echo(f"rejected {sum(rejects.values()):,} record(s):")
        for reason, n in rejects.most_common():
            click.echo(f"  {n:>8,}  {reason}")


def parse_opts(items: tuple[str, ...]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--opt {item!r}: expected key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = v
    return out


def _list_formats(ctx, _param, value) -> None:
    if value:
        from rankscope.collectors.ingest import registry

        click.echo("\n".join(registry.names()))
        ctx.exit()


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--store", "store_dir", required=True, type=click.Path(file_okay=False),
              help="trace store directory (created if missing)")
@click.option("--job", default=None, help="job name for the records (default: 'default'; flows: 'fabric')")
@click.option("--format", "fmt", default="auto", show_default=True,
              help="input format; 'auto' detects each file (see `rankscope ingest --list-formats`)")
@click.option("--kind", default=None, help="record kind for generic CSV/Parquet whose name does not tell")
@click.option("--opt", "opts", multiple=True, help="importer option key=value (repeatable)")
@click.option("--list-formats", is_flag=True, is_eager=True, expose_value=False, callback=_list_formats,
              help="print the known formats and exit")
@click.option("--max-bytes", type=click.IntRange(min=1), default=None,
              # contract.MAX_RATIO and MIN_EXPANDED_BYTES, written out so that `ingest --help` loads no importer;
              # tests/unit/cli/test_cli_startup_imports.py fails if they drift apart
              help="most bytes one file may hold after decompression (default: a compressed file may "
                   "expand 50x, at least 64 MiB)")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
@click.option("--engine", type=click.Choice(["embedded", "ray"]), default="embedded", show_default=True,
              help="ray: decode and write each file in a Ray task (the store must be on a path every node sees)")
@click.option("--address", "--ray-address", "address", default=None,
              help="Ray cluster to use with --engine ray (default: start a local one for the command)")
def ingest(paths, store_dir, job, fmt, kind, opts, max_bytes, quiet, engine, address):
    """Import trace files (and directories of them) into a trace store.

    Each file's format is detected, its records validated, and bad records
    counted by reason; a file already ingested for the same job adds nothing.
    A file that cannot be read (or whose records are all rejected) is named
    and stores nothing; the others still load, and the command exits 1.

    \b
    Example:
      rankscope ingest rank0.json.gz rank1.json.gz --store st --job llama
    """
    from rankscope.cli.progress import bar
    from rankscope.cli.startup import import_frozen

    import_frozen("polars", "numpy", "pyarrow.parquet", "rankscope.collectors.ingest.files")
    from rankscope.collectors.importers import contract
    from rankscope.collectors.ingest import registry
    from rankscope.collectors.ingest.files import ingest as run_ingest
    from rankscope.collectors.orphans import REMOVED_LOG
    from rankscope.collectors.store import Store, check_job_name

    if fmt != "auto" and fmt not in registry.names():
        raise UsageError(f"--format {fmt!r}: expected auto or one of {registry.names()}")
    if job is not None:
        check_job_name(job)
    store = Store(output_dir(store_dir, "--store"))
    opt = contract.ImportOptions(job=job, kind=kind, extra=parse_opts(opts))

    def progress(files, total=None):
        return bar(files, hidden=quiet, desc="ingest", unit="file", total=total)

    if address is not None and engine != "ray":
        raise UsageError("--address names a Ray cluster: use it with --engine ray")
    lim = contract.Limits(max_bytes=max_bytes)
    if engine == "ray":
        summary = ingest_on_ray(store, paths, fmt, opt, lim, address, progress)
    else:
        summary = run_ingest(store, paths, fmt, opt, progress=progress, lim=lim)
    if store.removed["parts"]:
        click.echo(f"  note: removed {store.removed['parts']:,} orphan part(s) no manifest entry commits "
                   f"(listed in {store.root / REMOVED_LOG})", err=True)
    if not echo_summary(summary):
        raise click.exceptions.Exit(1)


def ingest_on_ray(store, paths, fmt: str, opt, lim, address: str | None, progress=None):
    """The ingest as Ray tasks (analysis.runner.ingest_on_ray); says which files had to go one by one.
    ``progress``: a bar over the files' commits."""
    from rankscope.analysis.runner import ingest_with_ray

    done = ingest_with_ray(str(store.root), paths, fmt, opt, lim, address, progress=progress)
    if done.in_order:
        click.echo(f"  note: {len(done.in_order):,} flow file(s) ingested one after another: their exporters' "
                   "templates came from earlier files", err=True)
    return done.summary


def echo_summary(summary) -> bool:
    """Print what an ingest did (failures and notes on stderr); False when it failed (exit 1)."""
    from rankscope.collectors.ingest import registry

    unknown = [f.path for f in summary.files if f.status == "unknown"]
    for f in summary.files:
        if f.status == "failed":
            click.echo(f"  failed: {f.error}", err=True)
        for w in f.warnings:
            click.echo(f"  note: {f.path}: {w}", err=True)
    if unknown:
        # One line for a folder of unrelated files, not the format list once per file.
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3:,} more" if len(unknown) > 3 else "")
        click.echo(f"  unknown: {len(unknown):,} file(s) no importer recognises ({shown}); name one with "
                   f"--format, known: {', '.join(registry.names())}", err=True)
    recs = ", ".join(f"{k} {v:,}" for k, v in sorted(summary.records.items())) or "no records"
    click.echo(f"ingested {summary.count('ingested')} file(s), skipped {summary.count('skipped')} "
               f"already in the store, {summary.count('failed')} failed"
               + (f", {summary.count('unknown'):,} not recognised" if summary.count("unknown") else "") + f": {recs}")
    echo_rejects(summary.rejects)
    return not (summary.count("failed") or (summary.files and all(f.status == "unknown" for f in summary.files)))
