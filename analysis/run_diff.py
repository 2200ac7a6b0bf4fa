"""What changed between two runs of a job: step time, phases, GEMM throughput, comm bandwidth, strategy.

Every row compares one item of a baseline run A with the current run B and
carries ``ratio`` = B's performance over A's (times: A/B; throughputs and
bandwidths: B/A), so a ratio below the threshold is a regression whatever the
unit. Regressions come first, worst first, each with its evidence.
"""

from __future__ import annotations

from dataclasses import field

import numpy as np
import polars as pl

from rankscope.analysis.kernels.alignment import alignment_findings
from rankscope.analysis.kernels.regressions import RegressionConfig, kernel_regressions
from rankscope.analysis.kernels.throughput import class_throughput
from rankscope.analysis.model.job_model import JobModel
from rankscope.analysis.report.codec import plain, to_json
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.job_frames import JobFrames
from rankscope.collectors.record_class import record

SIZE_BUCKETS = (64 << 10, 1 << 20, 16 << 20, 256 << 20)
"""Upper edges of the message size buckets (bytes): <64 KiB, <1 MiB, <16 MiB, <256 MiB, larger."""
_BUCKET_NAMES = ("<64KiB", "64KiB-1MiB", "1-16MiB", "16-256MiB", ">=256MiB")


@record
class DiffConfig:
    """Options of a run diff."""

    threshold: float = 0.9
    """a ratio (B's performance / A's) below this is a regression; above 1/threshold an improvement."""
    regressions: RegressionConfig = field(default_factory=RegressionConfig)
    """GEMM alignment and throughput rules used for the kernel findings."""

    def __post_init__(self):
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError(f"threshold must be in (0, 1], got {self.threshold}")


@record(frozen=False)
class RunDiff:
    """The diff of two runs: ``rows`` (aspect, item, baseline, current, unit, ratio, change, evidence),
    regressions first, and the current run's kernel findings against the baseline."""

    baseline_job: str
    job: str
    threshold: float
    rows: list[dict]
    kernel_findings: list[dict]

    @property
    def regressions(self) -> list[dict]:
        return [r for r in self.rows if r["change"] == "regression"]

    def to_dict(self) -> dict:
        return plain({"baseline_job": self.baseline_job, "job": self.job, "threshold": self.threshold,
                         "num_regressions": len(self.regressions), "rows": self.rows,
                         "kernel_findings": self.kernel_findings})


def diff_runs(ma: JobModel, mb: JobModel, config: DiffConfig | None = None) -> RunDiff:
    """Compare run B (model ``mb``) with run A (model ``ma``), both through the one job model: the same
    steps analyze reports, the labels it filled, the strategy it inferred.

    Reads any of: step_mark (``rank, step, start_ns, end_ns``; else steps are read from the ops' ``step``),
    compute_op (``rank, name, category, start_ns, end_ns, step`` and GEMM ``m, n, k, dtype``), comm_op
    (``rank, op, group_ranks, peer, size_bytes, start_ns, end_ns, state, step``). Returns a RunDiff.
    """
    cfg = config or DiffConfig()
    baseline, current = ma.frames, mb.frames
    rows: list[dict] = []
    rows += _step_rows(_step_frame(ma.steps), _step_frame(mb.steps))
    rows += _phase_rows(baseline, current)
    rows += _class_rows(baseline, current)
    rows += _alignment_rows(baseline, current, cfg)
    rows += _comm_rows(baseline, current)
    rows += _strategy_rows(ma, mb)
    for r in rows:
        r.setdefault("change", _change(r["ratio"], cfg.threshold))
    order = {"regression": 0, "new": 1, "changed": 1, "gone": 2, "improvement": 3, "same": 4}
    rows.sort(key=lambda r: (order.get(r["change"], 5), r["ratio"] if r["ratio"] is not None else 1.0))
    kernel = kernel_regressions(current, baseline, cfg.regressions)
    return RunDiff(baseline.job, current.job, cfg.threshold, rows, [to_json(r) for r in kernel])


def _change(ratio: float | None, thr: float) -> str:
    if ratio is None or not np.isfinite(ratio):
        return "changed"
    if ratio < thr:
        return "regression"
    if ratio > 1.0 / thr:
        return "improvement"
    return "same"


def _row(aspect, item, a, b, unit, higher_is_better, evidence="") -> dict:
    ratio = None
    if a is not None and b is not None and a > 0 and b > 0:
        ratio = float(b / a) if higher_is_better else float(a / b)
    return {"aspect": aspect, "item": item, "baseline": a, "current": b, "unit": unit, "ratio": ratio,
            "evidence": evidence}


def step_durations(model: JobModel) -> pl.DataFrame:
    """The job's steps by the one step definition (:mod:`rankscope.analysis.model.steps`), as analyze reports them.

    Returns ``step, start_ns, end_ns, dur_ns, warmup`` (dur_ns: the step time; warmup: left out of the median).
    """
    return _step_frame(model.steps)


def _step_frame(steps: pl.DataFrame) -> pl.DataFrame:
    return steps.select("step", "start_ns", "end_ns", pl.col("duration_ns").alias("dur_ns"), "warmup")


def _steady_median(t: pl.DataFrame) -> tuple[float, int]:
    steady = t.filter(~pl.col("warmup"))
    steady = steady if steady.height else t
    return float(steady["dur_ns"].median()), steady.height


def _step_rows(da: pl.DataFrame, db: pl.DataFrame) -> list[dict]:
    if da.height == 0 or db.height == 0:
        return []
    (ma, na), (mb, nb) = _steady_median(da), _steady_median(db)
    ev = (f"median of {na} vs {nb} steps (warm-up steps left out); "
          f"slowest {db['dur_ns'].max() / 1e6:.2f} ms in B")
    return [_row("step", "step time", ma / 1e6, mb / 1e6, "ms", False, ev)]


def _per_rank_step(df: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Mean time per (key) per rank per step, in ms, counting ops of labelled steps only."""
    d = df.filter(pl.col("end_ns").is_not_null()).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("d"))
    n = max(1, d.select(pl.struct("rank", "step").n_unique()).item()) if "step" in d.columns else 1
    return d.group_by(keys).agg((pl.col("d").sum() / n / 1e6).alias("ms"), pl.len().alias("calls"))


def _phase_rows(a: JobFrames, b: JobFrames) -> list[dict]:
    out = []
    for kind, key in (("compute_op", "category"), ("comm_op", "op")):
        fa, fb = getattr(a, kind), getattr(b, kind)
        if fa.height == 0 or fb.height == 0:
            continue
        pa_, pb_ = _per_rank_step(fa, [key]), _per_rank_step(fb, [key])
        j = pa_.join(pb_, on=key, how="full", suffix="_b", coalesce=True)
        for r in j.iter_rows(named=True):
            label = ("compute " if kind == "compute_op" else "comm ") + str(r[key])
            row = _row("phase", label, r["ms"], r["ms_b"], "ms/rank/step", False,
                       f"{r['calls'] or 0} vs {r['calls_b'] or 0} calls")
            if r["ms"] is None or r["ms_b"] is None:
                row["change"] = "new" if r["ms"] is None else "gone"
            out.append(row)
    return out


def _class_rows(a: JobFrames, b: JobFrames) -> list[dict]:
    ca, cb = class_throughput(a.compute_op), class_throughput(b.compute_op)
    if ca.height == 0 or cb.height == 0:
        return []
    j = ca.join(cb, on=["kernel_class", "dtype"], how="inner", suffix="_b")
    return [_row("gemm_throughput", f"{r['kernel_class']} {r['dtype']}", r["tflops"], r["tflops_b"], "TFLOP/s",
                 True, f"{r['flops'] / 1e9:,.1f} vs {r['flops_b'] / 1e9:,.1f} GFLOP in "
                       f"{r['time_ns'] / 1e6:,.2f} vs {r['time_ns_b'] / 1e6:,.2f} ms")
            for r in j.iter_rows(named=True)]


def _alignment_rows(a: JobFrames, b: JobFrames, cfg: DiffConfig) -> list[dict]:
    """Misaligned GEMM dims of B that A did not have (rule-based: reported whatever the timing says)."""
    acfg = cfg.regressions.alignment
    fa, fb = alignment_findings(a.compute_op, acfg), alignment_findings(b.compute_op, acfg)
    if fb.height == 0:
        return []
    key = ["kernel_class", "dtype", "dim", "value", "severity"]
    new = fb.join(fa.select(key).unique(), on=key, how="anti") if fa.height else fb
    new = new.group_by(["kernel_class", "dtype", "m", "n", "k", "batch", "severity"]).agg(
        pl.col("reason").unique().sort().str.join("; "), pl.col("kernel").first(),
        pl.col("time_ns").sum(), pl.col("ranks").first())
    tp_b = class_throughput(b.compute_op)
    out = []
    for r in new.iter_rows(named=True):
        evidence = (f"{r['kernel']} shape m={r['m']} n={r['n']} k={r['k']} on ranks {list(r['ranks'])}: "
                    f"{r['reason']}; {r['time_ns'] / 1e6:,.2f} ms in B")
        cls = tp_b.filter((pl.col("kernel_class") == r["kernel_class"]) & (pl.col("dtype") == r["dtype"]))
        row = _row("alignment", f"{r['kernel_class']} {r['dtype']} [{r['m']}, {r['n']}, {r['k']}]", None,
                   float(cls["tflops"][0]) if cls.height else None, "TFLOP/s", True, evidence)
        # Rule-based: a newly misaligned dim is a regression even where the CPU timing shows no loss.
        row["change"] = "regression"
        row["severity"] = r["severity"]
        out.append(row)
    return out


def size_bucket_expr(col: str = "size_bytes") -> pl.Expr:
    expr = pl.lit(_BUCKET_NAMES[-1])
    for edge, name in reversed(list(zip(SIZE_BUCKETS, _BUCKET_NAMES))):
        expr = pl.when(pl.col(col) < edge).then(pl.lit(name)).otherwise(expr)
    return expr


def comm_bandwidth(comm_op: pl.DataFrame) -> pl.DataFrame:
    """Bytes per second per (op, size bucket) of completed ops: ``op, bucket, calls, bytes, time_ns, gbps``
    (payload bytes over summed op time, in Gbit/s). Needs ``op, size_bytes, start_ns, end_ns, state``."""
    d = comm_op.filter(pl.col("end_ns").is_not_null() & (pl.col("state") == "completed")
                       & pl.col("size_bytes").is_not_null())
    return d.with_columns(size_bucket_expr().alias("bucket"),
                          (pl.col("end_ns") - pl.col("start_ns")).alias("d")).group_by(["op", "bucket"]).agg(
        pl.len().alias("calls"), pl.col("size_bytes").sum().alias("bytes"), pl.col("d").sum().alias("time_ns")
    ).filter(pl.col("time_ns") > 0).with_columns(
        (pl.col("bytes") * 8.0 / pl.col("time_ns")).alias("gbps")).sort(["op", "bucket"])


def _comm_rows(a: JobFrames, b: JobFrames) -> list[dict]:
    if a.comm_op.height == 0 or b.comm_op.height == 0:
        return []
    j = comm_bandwidth(a.comm_op).join(comm_bandwidth(b.comm_op), on=["op", "bucket"], how="inner", suffix="_b")
    return [_row("comm_bandwidth", f"{r['op']} {r['bucket']}", r["gbps"], r["gbps_b"], "Gbit/s", True,
                 f"{r['calls']} vs {r['calls_b']} calls, {r['bytes'] / 1e6:,.1f} vs {r['bytes_b'] / 1e6:,.1f} MB")
            for r in j.iter_rows(named=True)]


def _strategy_rows(a: JobModel, b: JobModel) -> list[dict]:
    """World size and parallel degrees from the collectives' groups; a change is reported as ``changed``."""
    if a.whitebox is None or b.whitebox is None:
        return []
    sa, sb = a.whitebox, b.whitebox
    out = []
    for name in ("world_size", "dp", "pp", "tp", "ep"):
        va, vb = getattr(sa, name), getattr(sb, name)
        row = {"aspect": "strategy", "item": name, "baseline": va, "current": vb, "unit": "", "ratio": None,
               "evidence": f"groups A {getattr(sa, name + '_groups', None) or ''} "
                           f"B {getattr(sb, name + '_groups', None) or ''}".strip(),
               "change": "same" if va == vb else "changed"}
        out.append(row)
    return out
