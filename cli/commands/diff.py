"""``rankscope diff``: what changed between two runs (regressions first)."""

from __future__ import annotations

import json

import click

from rankscope.cli.paths import output_file, pick_job, write_atomic
from rankscope.collectors.errors import RankscopeError


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def render(d) -> list[str]:
    """Text table of a RunDiff: one line per row, then the kernel findings."""
    lines = [f"diff {d.baseline_job} (baseline) -> {d.job}: {len(d.regressions)} regression(s), "
             f"threshold {d.threshold}"]
    head = f"{'change':<12}{'aspect':<16}{'item':<34}{'baseline':>12}{'current':>12}  {'unit':<13}{'ratio':>7}  evidence"
    lines += [head, "-" * len(head)]
    for r in d.rows:
        lines.append(f"{r['change']:<12}{r['aspect']:<16}{str(r['item'])[:33]:<34}{_fmt(r['baseline']):>12}"
                     f"{_fmt(r['current']):>12}  {r['unit']:<13}{_fmt(r['ratio']):>7}  {r['evidence']}")
    if d.kernel_findings:
        lines.append("")
        lines.append("kernel findings (this run vs baseline and across its ranks):")
        for f in d.kernel_findings:
            lines.append(f"  {f['kind']:<10} ratio {f['ratio']:.3f} ({f['ratio_basis']})  {f['kernel']}  "
                         f"shape {f['shape']} {f['dtype']} ranks {f['ranks']}: {f['reason']}")
    return lines


@click.command()
@click.option("--baseline", "baseline_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="trace store of the baseline run (A)")
@click.option("--store", "store_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="trace store of the run to check (B)")
@click.option("--job", default=None, help="job in --store (default: 'default' or the store's only job)")
@click.option("--baseline-job", default=None, help="job in --baseline (default: --job, else as for --job)")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None,
              help="also write the diff as JSON to this file")
@click.option("--threshold", type=float, default=0.9, show_default=True,
              help="a ratio (B's performance / A's) below this is a regression")
def diff(baseline_dir, store_dir, job, baseline_job, json_out, threshold):
    """Compare two runs: step time, per-phase time, GEMM throughput per kernel class and shape,
    tensor-core alignment, comm bandwidth per collective and size bucket, strategy.

    Regressions come first, each with its evidence. Exits 0 whatever it finds.

    \b
    Example:
      rankscope diff --baseline st-aligned --store st-resized --json diff.json
    """
    from rankscope.analysis.kernels import RegressionConfig, ThroughputConfig
    from rankscope.analysis.model import build_job_model
    from rankscope.analysis.run_diff import DiffConfig, diff_runs
    from rankscope.analysis.runner import ResultCache, result_key, store_version
    from rankscope.collectors.job_frames import load_job
    from rankscope.collectors.store import Store

    cfg = DiffConfig(threshold=threshold,
                     regressions=RegressionConfig(throughput=ThroughputConfig(threshold=threshold)))
    sb, sa = Store(store_dir), Store(baseline_dir)
    if json_out:  # hardstore: checked before the work; exit 1 naming the path
        output_file(json_out, "--json")
    jb = pick_job(sb, job, "--store")
    ja = pick_job(sa, baseline_job if baseline_job is not None else (job if job in sa.jobs() else None),
                  "--baseline")
    # unchanged stores, jobs and options: the diff of an earlier run, cached in the current store
    cache = ResultCache(sb)
    key = result_key("diff", [store_version(sa, [ja]), store_version(sb, [jb])], (ja, jb, cfg))
    got = cache.get_json(key)
    if got is None:
        a, b = load_job(sa, ja), load_job(sb, jb)
        if all(getattr(f, k).height == 0 for f in (a, b) for k in ("compute_op", "comm_op", "step_mark")):
            raise RankscopeError(f"nothing to compare: jobs {ja!r} and {jb!r} hold no compute_op, comm_op or "
                                 "step_mark records")
        d = diff_runs(build_job_model(a), build_job_model(b), cfg)
        got = {"lines": render(d), "report": d.to_dict()}
        cache.put_json(key, got)
    for line in got["lines"]:
        click.echo(line)
    if json_out:
        write_atomic(json_out, json.dumps(got["report"], indent=1, allow_nan=False), "--json")
        click.echo(f"wrote {json_out}")
    return 0
