"""``rankscope sql``: DuckDB SQL over the store's record-kind views."""

from __future__ import annotations

import csv
import sys

import click

from rankscope.cli.paths import existing_store
from rankscope.collectors.errors import StoreError, UsageError


@click.command()
@click.argument("query")
@click.option("--store", "store_dir", required=True, type=click.Path(file_okay=False),
              help="trace store directory")
@click.option("--job", default=None, help="restrict every view to one job")
@click.option("--csv", "as_csv", is_flag=True, help="print a header line and rows as CSV, nothing else")
@click.option("--limit", default=50, show_default=True, help="rows shown in table mode")
def sql(query, store_dir, job, as_csv, limit):
    """Run DuckDB SQL over views named after the record kinds.

    Views: comm_op, compute_op, flow, step_mark, batch_meta, endpoint_map,
    interface_counter (each exists, possibly empty).

    \b
    Example:
      rankscope sql --store st "select op, count(*) n from comm_op group by op" --csv
    """
    import duckdb

    from rankscope.collectors.store import check_job_name

    store = existing_store(store_dir)
    if job is not None and check_job_name(job) not in store.jobs():
        raise UsageError(f"--job {job!r}: not in the store (jobs: {store.jobs()})")
    con = store.duckdb(job)
    try:
        cur = con.execute(query)
    except (duckdb.IOException, duckdb.InvalidInputException) as e:
        # the query was fine; a store file was not (a part damaged past what the read-time check sees)
        raise StoreError(f"SQL could not read the store {store.root}: {str(e).splitlines()[0]}; "
                         f"`rankscope check --store {store.root}` names what is damaged") from e
    except duckdb.Error as e:
        raise UsageError(f"SQL failed: {e}") from e
    cols = [d[0] for d in cur.description] if cur.description else []
    if as_csv:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(cols)
        while rows := cur.fetchmany(10_000):
            w.writerows(rows)
        return
    rows = cur.fetchmany(limit + 1)
    shown = rows[:limit]
    widths = [max([len(str(c))] + [len(str(r[i])) for r in shown]) for i, c in enumerate(cols)]
    click.echo("  ".join(str(c).ljust(w) for c, w in zip(cols, widths)))
    click.echo("  ".join("-" * w for w in widths))
    for r in shown:
        click.echo("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    if len(rows) > limit:
        click.echo("... (more rows; use --limit or --csv)")
