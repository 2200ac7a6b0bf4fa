"""``rankscope analyze``: one report (JSON + HTML) per job of a trace store."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from rankscope.cli.paths import existing_store, output_dir, write_atomic
from rankscope.collectors.errors import StoreError, UsageError


def _summary(d) -> str:
    s = d.strategy
    order = ""
    if (s.pp or 1) > 1 and s.pp_groups:
        known = s.stage_order_known
        order = f", pipeline {(' > ' if known else ' - ').join(map(str, s.pp_groups[0]))}"
        order += "" if known else " (direction unknown)"
    step = f"{d.steps.median_ns / 1e6:,.1f} ms x {d.steps.count} steps" if d.steps.count else "steps unknown"
    if d.steps.warmup:
        step += f" ({len(d.steps.warmup)} warm-up left out of the median)"
    if d.steps.ambiguous:
        step += " (ambiguous: may be a multiple of the step)"
    from rankscope.analysis.report import degree_text, summary_text
    from rankscope.dashboard.report_text import tied_labellings

    tied = tied_labellings(s)
    tied = f", ambiguous: or {tied}" if tied else ""
    return (f"{d.job}: {s.world_size} endpoints, dp={degree_text(s.dp)} pp={degree_text(s.pp)} tp={degree_text(s.tp)} "
            f"(confidence {s.confidence:.2f}{order}{tied}); {step}; {summary_text(d)}")


def _results(store, plan, config, engine: str, address: str | None, fresh=None):
    """(planned job, Diagnosis, tables) per planned job, from the chosen engine.

    ``fresh``: the rows ``--ingest`` just wrote, analysed from memory instead of re-read (embedded engine)."""
    if engine == "ray":
        from rankscope.analysis.runner import analyse_with_ray

        yield from analyse_with_ray(str(store.root), plan, config, address)
        return
    from rankscope.analysis.runner import ResultCache, analyse_planned, cached_analysis

    cache = ResultCache(store)
    for planned in plan:
        def compute(planned=planned):
            return analyse_planned(store, planned, config, fresh)

        # an unchanged store (same parts, options and code) is answered from the cache
        d, tables, _hit = cached_analysis(store, planned, config, compute, cache)
        yield planned, d, tables


def _load(with_ingest: bool, inputs=()) -> None:
    """The command's libraries, loaded once and kept out of the garbage collector's way (cli/startup.py).

    ``inputs``: the files and directories the command reads (store, --ingest paths), to size its allocators."""
    from rankscope.cli.startup import (
        big_blocks_returned,
        blas_without_threads,
        import_frozen,
        lean_allocators,
    )

    blas_without_threads()
    lean_allocators(inputs)
    big_blocks_returned(inputs)
    modules = ["polars", "numpy", "pyarrow.parquet", "rankscope.analysis.diagnose", "rankscope.analysis.runner.plan",
               "rankscope.analysis.report.summary", "rankscope.dashboard.report_text"]
    if with_ingest:
        if "pyarrow" not in sys.modules:
            # Arrow buffers on this path are conversion copies freed within each file's ingest. Arrow's own
            # pool (jemalloc/mimalloc, set up when pyarrow loads) keeps their pages beside polars' allocator
            # for the rest of the analysis: ~40 MB more peak RSS on the OSDI AR trace (1.1 MB of Parquet);
            # malloc hands them back, at no CPU cost measured. A user's own choice of pool is kept.
            os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
        modules += ["rankscope.collectors.ingest.files", "rankscope.collectors.fresh_rows", "rankscope.cli.commands.ingest"]
    import_frozen(*modules)


def _ingest_first(store_dir, paths, job, engine: str = "embedded", address: str | None = None):
    """``rankscope ingest PATHS --store [--job J]`` in this process; the rows written, kept for the analysis.
    With ``engine`` ray, ``ingest --engine ray``: the rows are in the store only (None).

    ``job``: analyze's --job, which names the job of the ingested records too (the job analysed is the
    one stored: ``--ingest DIR --job J`` stores and analyses J)."""
    from rankscope.cli.commands.ingest import echo_summary, ingest_on_ray
    from rankscope.collectors.fresh_rows import FreshRows
    from rankscope.collectors.importers import contract
    from rankscope.collectors.ingest.files import ingest
    from rankscope.collectors.store import Store

    store = Store(output_dir(store_dir, "--store"))
    opts = contract.ImportOptions(job=job)
    if engine == "ray":
        summary = ingest_on_ray(store, paths, "auto", opts, contract.Limits(), address)
    else:
        summary = ingest(store, paths, opts=opts, keep_rows=True)
    if not echo_summary(summary):
        # a failed file is not analysed around: the reports would silently miss its records
        raise click.exceptions.Exit(1)
    return None if engine == "ray" else FreshRows.from_summary(summary)


@click.command()
@click.option("--store", "store_dir", required=True, type=click.Path(file_okay=False),
              help="trace store directory (created by --ingest if missing)")
@click.option("--ingest", "ingest_paths", multiple=True, type=click.Path(exists=True),
              help="trace file or directory to ingest into --store first, as `rankscope ingest PATH --store` "
                   "does, in this process (repeatable); its rows are analysed from memory, not read back")
@click.option("--job", default=None, help="analyse only this job (a training job, a flow capture, or a "
                                          "job recognised in one, e.g. fabric-2); with --ingest, also the job "
                                          "the ingested records are stored under")
@click.option("--flow-job", default=None, help="flow capture to compare with the job's comm_op records "
                                               "(needs an endpoint_map)")
@click.option("--out-dir", required=True, type=click.Path(file_okay=False), help="where reports go")
@click.option("--no-html", is_flag=True, help="write only the JSON reports")
@click.option("--none-below", type=float, default=1.05, show_default=True,
              help="straggler verdict is 'none' when the what-if slowdown S is below this")
@click.option("--regression-threshold", type=float, default=0.9, show_default=True,
              help="flag a GEMM whose throughput ratio (vs peers or baseline) is below this")
@click.option("--engine", type=click.Choice(["embedded", "ray"]), default="embedded", show_default=True,
              help="where the jobs are analysed: in this process, or on Ray (a flow capture's job "
                   "recognition split into tasks per part file, then one task per job)")
@click.option("--address", default=None, help="Ray cluster to use with --engine ray (default: start a local "
                                              "one on 127.0.0.1 for this run)")
@click.option("--partition-rows", type=click.IntRange(min=1), default=None,
              help="with --engine ray: most flow records one recognition task reads; larger part files are "
                   "cut into equal row ranges (default 1000000; a task's memory grows with it)")
@click.option("--format", "fmt", type=click.Choice(["summary", "text"]), default="summary", show_default=True,
              help="what to print per job: one summary line, or the report's key sections as text")
@click.option("--control-port", "control_ports", multiple=True, type=click.IntRange(1, 65535),
              help="a job's rendezvous port other than 29500 (torchrun --master_port), repeatable: flows on it "
                   "are control traffic, not training links, and join the ranks that talk to it into one job")
@click.option("--topology", "topology_path", default=None, type=click.Path(dir_okay=False),
              help="CSV endpoint,host,leaf,pod[,spine]: where each NIC address (or rank) hangs, for the traffic "
                   "section (default: inferred from the flow exporters, one per leaf)")
def analyze(store_dir, ingest_paths, job, flow_job, out_dir, no_html, none_below, regression_threshold, engine,
            address, partition_rows, fmt, control_ports, topology_path):
    """Diagnose every job of a store: strategy, steps, stragglers, regressions, hangs.

    Writes OUT/<job>.json (the report contract) and OUT/<job>.html per job.
    Flow captures without other records are split into the jobs found in
    them (named <capture> when there is one, else <capture>-1, -2, ...).
    With --ingest, the files are first ingested into the store (the store
    stays the record), and the reports equal those of `rankscope ingest`
    followed by `rankscope analyze`, in one process instead of two.

    \b
    Example:
      rankscope analyze --store st --out-dir reports
      rankscope analyze --ingest traces/ --store st --out-dir reports --no-html
      rankscope analyze --store st --out-dir reports --format text
      rankscope analyze --store st --job fabric --out-dir reports
      rankscope analyze --store st --out-dir reports --control-port 29671
      rankscope analyze --store st --out-dir reports --topology topo.csv
      rankscope analyze --store st --out-dir reports --engine ray --address 10.0.0.5:6379
    """
    _load(with_ingest=bool(ingest_paths), inputs=[p for p in (store_dir, *ingest_paths) if os.path.exists(p)])
    if engine == "ray" and ingest_paths:
        from rankscope.analysis.runner import ray_session

        # one Ray session for the ingest's tasks and the analysis' (the later ray_session joins this one)
        click.get_current_context().with_resource(ray_session(address))
    fresh = _ingest_first(store_dir, ingest_paths, job, engine, address) if ingest_paths else None
    from rankscope.analysis.diagnose import DiagnoseConfig
    from rankscope.analysis.network import read_topology

    topology = read_topology(topology_path) if topology_path else None
    for note in topology.notes if topology else ():
        click.echo(f"warning: {note}", err=True)

    store = existing_store(store_dir)  # hardstore: missing store is a usage error (2) everywhere
    if not store.jobs():
        raise StoreError(f"--store {store_dir}: expected a trace store with records, found none")
    if flow_job is not None and flow_job not in store.jobs("flow"):
        raise UsageError(f"--flow-job {flow_job!r}: expected a flow capture, one of {store.jobs('flow')}")
    from rankscope.analysis.fabric import FlowConfig
    from rankscope.analysis.kernels import RegressionConfig, ThroughputConfig
    from rankscope.analysis.stragglers import StragglerConfig

    config = DiagnoseConfig(
        stragglers=StragglerConfig(none_below=none_below),
        regressions=RegressionConfig(throughput=ThroughputConfig(threshold=regression_threshold)),
        flow=FlowConfig.with_rendezvous(*control_ports), topology=topology)
    if address is not None and engine != "ray":
        raise UsageError("--address names a Ray cluster: use it with --engine ray")
    if partition_rows is not None and engine != "ray":
        raise UsageError("--partition-rows sizes the Ray engine's recognition tasks: use it with --engine ray")
    if engine == "ray":
        from rankscope.analysis.runner import plan_with_ray, ray_session

        # one Ray session for the plan (a flow capture's job recognition split into tasks) and the job tasks
        click.get_current_context().with_resource(ray_session(address))
        plan = plan_with_ray(str(store.root), job, flow_job, config.flow, partition_rows=partition_rows)
    else:
        from rankscope.analysis.runner import plan_jobs

        plan = plan_jobs(store, job, flow_job, config.flow)
    if not plan:
        if job:
            raise UsageError(f"--job {job!r}: no such job (training jobs and captures: {store.jobs()})")
        from rankscope.analysis.runner import why_no_jobs

        why = why_no_jobs(store, config.flow)
        raise UsageError(f"--store {store_dir}: no training job or flow capture with a job in it"
                         + ("; " + "; ".join(why) if why else ""))
    out = output_dir(out_dir, "--out-dir")  # hardstore: exit 1 naming the path, no traceback
    render = None
    if not no_html:
        try:
            from rankscope.dashboard.report_html import render_report as render
        except ImportError:
            click.echo("note: HTML report unavailable (rankscope.dashboard.report_html missing)", err=True)
    from rankscope.cli.progress import bar as progress_bar
    from rankscope.dashboard.report_text import render_text

    # a bar only on a terminal: scripts and CI read the summary lines alone
    with progress_bar(total=len(plan), desc="analyse", unit="job") as bar:
        for planned, d, tables in _results(store, plan, config, engine, address, fresh):
            name = planned.name
            write_atomic(out / f"{name}.json", d.to_json(), "--out-dir")
            if render is not None:
                write_atomic(out / f"{name}.html", render(d, tables), "--out-dir")
            bar.update(1)
            bar.clear()
            click.echo(render_text(d) if fmt == "text" else _summary(d))


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="YAML job: tp, dp, pp, ep, cp, microbatches, virtual_stages, activation_bytes, gradient_bytes, "
                   "data_parallel (ring, zero, fsdp), expert_bytes, moe_layers, expert_gradient_bytes, "
                   "rank_order (fastest axis first), endpoints (one per rank)")
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False),
              help="CSV to write (default: standard output)")
def expect(config_path, out_path):
    """Expected bytes per endpoint pair per step of a declared job, per traffic class.

    \b
    Example:
      rankscope expect --config job.yaml --out expected.csv
    """
    import csv
    import io

    import yaml

    from rankscope.analysis.network import declared_traffic

    try:
        config = yaml.safe_load(open(config_path).read()) or {}
    except yaml.YAMLError as e:
        raise UsageError(f"--config {config_path}: not YAML ({e})") from e
    if not isinstance(config, dict):
        raise UsageError(f"--config {config_path}: expected a mapping of job keys, got {type(config).__name__}")
    rows = declared_traffic(config, f"--config {config_path}")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["src", "dst", "class", "bytes_per_step"], lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    if out_path:
        write_atomic(Path(out_path), buf.getvalue(), "--out")
        click.echo(f"{len(rows)} pair classes -> {out_path}", err=True)
    else:
        click.echo(buf.getvalue(), nl=False)
