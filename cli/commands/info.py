"""``rankscope info``: what a trace store holds."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from rankscope.cli.paths import existing_store

if TYPE_CHECKING:
    from rankscope.collectors.store import Store


def store_summary(store: Store) -> dict:
    """Jobs x kinds with counts and time ranges, plus manifest totals."""
    import polars as pl

    from rankscope.collectors.schema import SCHEMAS

    store = store.snapshot()  # one set of commits for every count, scan and the manifest
    out: dict = {"store": str(store.root), "jobs": {}}
    for job in store.jobs():
        kinds = {}
        for kind in SCHEMAS:
            n = store.count(kind, job)
            if not n:
                continue
            entry = {"rows": n}
            tcol = "time_ns" if kind == "interface_counter" else "start_ns"
            if tcol in SCHEMAS[kind].names:
                lf = store.scan(kind, job).select(lo=pl.col(tcol).min(), hi=pl.col(tcol).max()).collect()
                entry["first_ns"], entry["last_ns"] = lf["lo"][0], lf["hi"][0]
            kinds[kind] = entry
        out["jobs"][job] = kinds
    man = store.manifest()
    rejects = Counter()
    for m in man:
        rejects.update(m.rejects)
    out["sources"] = len(man)
    out["relative_time_jobs"] = sorted(store.relative_jobs())
    out["rejects"] = dict(rejects.most_common())
    out["orphan_parts"] = [str(p) for p in store.orphans()]
    return out


def time_text(ns: int, relative: bool) -> str:
    """A record time for people: a UTC date, or the offset from the start for relative-time sources."""
    if relative:
        return f"t+{duration_text(ns)}"
    when = datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC)
    return f"{when:%Y-%m-%d %H:%M:%S}.{ns % 1_000_000_000 // 1_000_000:03d} UTC"


def duration_text(ns: int) -> str:
    """5 h 03 min, 2 min 07.5 s, 3.250 s, 12.5 ms."""
    s = ns / 1e9
    if s < 1:
        return f"{ns / 1e6:,.1f} ms"
    if s < 60:
        return f"{s:.3f} s"
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{int(h)} h {int(m):02d} min" if h else f"{int(m)} min {sec:04.1f} s"


@click.command()
@click.option("--store", "store_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="trace store directory")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def info(store_dir, as_json):
    """Summarise a trace store: jobs, record kinds, counts, time range, rejects.

    \b
    Example:
      rankscope info --store st
    """
    s = store_summary(existing_store(store_dir))
    if as_json:
        click.echo(json.dumps(s, indent=2, default=str))
        return
    click.echo(f"store {s['store']}: {len(s['jobs'])} job(s), {s['sources']} ingested source(s)")
    for job, kinds in s["jobs"].items():
        rel = " (relative time)" if job in s["relative_time_jobs"] else ""
        click.echo(f"job {job}{rel}")
        for kind, e in kinds.items():
            span = ""
            if e.get("first_ns") is not None:
                span = f"  {duration_text(e['last_ns'] - e['first_ns'])} from {time_text(e['first_ns'], bool(rel))}"
            click.echo(f"  {kind:<18}{e['rows']:>12,} rows{span}")
    if s["orphan_parts"]:
        click.echo(f"note: {len(s['orphan_parts']):,} orphan part(s) no manifest entry commits are not read "
                   f"(a crashed ingest or a lost entry; `rankscope check --store {s['store']}` lists them)", err=True)
    if s["rejects"]:
        click.echo(f"rejected records: {sum(s['rejects'].values()):,}")
        for reason, n in s["rejects"].items():
            click.echo(f"  {n:>8,}  {reason}")


@click.command()
@click.option("--store", "store_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="trace store directory")
@click.option("--quick", is_flag=True, help="compare part sizes with the manifest instead of hashing every part")
def check(store_dir, quick):
    """Verify every part and manifest entry of a store; list what a repair would do. Changes nothing.

    Exit 0 when the store is whole, 1 when something is damaged, orphaned or missing.

    \b
    Example:
      rankscope check --store st
    """
    from rankscope.collectors.store_check import check_store

    res = check_store(existing_store(store_dir), full=not quick)
    for line in res.problems:
        click.echo(line)
    how = "sizes" if quick else "sha256 hashes"
    click.echo(f"checked {res.entries:,} manifest entr{'y' if res.entries == 1 else 'ies'} and {res.parts:,} "
               f"part(s) by {how}: {len(res.problems):,} problem(s)")
    if res.repairs:
        click.echo("a repair would:")
        for line in res.repairs:
            click.echo(f"  {line}")
        raise SystemExit(1)
