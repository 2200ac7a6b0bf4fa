"""Regression section of the report: GEMM alignment and throughput regressions.

Joins the alignment rules (:mod:`kernels.alignment`) and the throughput
comparisons (:mod:`kernels.throughput`) into the report's ``regressions`` list:
one dict per finding with at least ``kernel, shape, dtype, ratio, reason``
(report contract), worst ratio first.

Each dict also has the shape of a report ``finding`` (design.md): ``kind``
(``misaligned_gemm`` when a dim breaks the dtype's alignment rule, else
``kernel_regression``), ``culprit`` (the rank when one rank is slow, the list of
ranks when several are slow on nearly every shape, else the kernel), ``factor`` (how many times slower), ``steps`` and
``evidence``. ``check`` says which comparison found it (``throughput`` or
``alignment``). An alignment rule hit whose measured TFLOP/s is not below
``alignment_cost`` (0.97) of the job's aligned GEMMs of its class and size costs
nothing and is left out; one with nothing to measure against is kept on the rule alone.
"""

from __future__ import annotations

import re
from dataclasses import field

import numpy as np
import polars as pl

from rankscope.analysis.kernels.alignment import (
    AlignmentConfig,
    alignment_findings,
    element_bytes,
    gemm_rows,
)
from rankscope.analysis.kernels.throughput import (
    KEY,
    ThroughputConfig,
    baseline_findings,
    cross_rank_findings,
    name_throughput,
    rank_throughput,
)
from rankscope.analysis.model.job_model import JobModel
from rankscope.analysis.report.kernels import AlignmentCheck, Regression, ThroughputCheck
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.job_frames import JobFrames
from rankscope.collectors.record_class import record

SIMILAR_FLOPS = 4
"""An aligned GEMM is a like-for-like reference for a misaligned one within this factor of FLOPs per call."""


@record
class RegressionConfig:
    """Options of the regression section."""

    alignment: AlignmentConfig = field(default_factory=AlignmentConfig)
    """tensor-core alignment rules."""
    throughput: ThroughputConfig = field(default_factory=ThroughputConfig)
    """throughput thresholds (``threshold`` 0.9 by default)."""
    include_preferred: bool = True
    """also report dims that meet the 16-byte minimum but miss the 128-byte preferred alignment."""
    tp: int | None = None
    """tensor-parallel degree, when known, to name the unsplit size of a misaligned dim."""
    alignment_cost: float = 0.97
    """a misaligned GEMM is reported when its TFLOP/s is below this fraction of its aligned peers' (a cost of
    ~3% or more), or when there is nothing to measure it against; at or above it the dim costs nothing
    measurable. Kept apart from the throughput threshold so a small but real cost is still listed."""

    def __post_init__(self):
        if not isinstance(self.alignment, AlignmentConfig) or not isinstance(self.throughput, ThroughputConfig):
            raise ConfigError("alignment and throughput must be AlignmentConfig and ThroughputConfig")
        if not 0.0 < self.alignment_cost <= 1.0:
            raise ConfigError(f"alignment_cost must be in (0, 1], got {self.alignment_cost}")
        if self.tp is not None and self.tp < 1:
            raise ConfigError(f"tp must be >= 1, got {self.tp}")


def regression_section(model: JobModel, baseline: JobFrames | None = None,
                       config: RegressionConfig | None = None) -> list[Regression]:
    """The report's regressions: :func:`kernel_regressions` of the job model's compute records, against the
    baseline run's when given."""
    return kernel_regressions(model.frames, baseline, config)


def kernel_regressions(frames: JobFrames, baseline: JobFrames | None = None,
                       config: RegressionConfig | None = None) -> list[Regression]:
    """Kernel regressions of one job, optionally against a baseline run.

    Needs compute_op columns ``rank, name, category, start_ns, end_ns, m, n, k, dtype`` (``flops, batch,
    layout, step, grid`` optional) of GEMM rows. Returns dicts ``{check, kernel, kernel_class, shape, dtype,
    layout, ranks, ratio, ratio_basis, reason, severity, comparison}`` plus the findings keys ``{kind,
    culprit, factor, steps, evidence}`` (see the module docstring): ``check`` is ``throughput`` (a measured
    ratio below the threshold, against other ranks or the baseline) or ``alignment`` (a dim breaking
    the dtype's tensor-core alignment; its ``ratio`` is the shape's TFLOP/s over the median of the
    job's aligned GEMMs of the same class and dtype, 1.0 with ``ratio_basis`` ``none`` when there are
    none). Worst ratio first; alignment findings that explain a throughput finding are merged into it.
    """
    cfg = config or RegressionConfig()
    tp = rank_throughput(frames.compute_op, cfg.throughput)
    names = name_throughput(frames.compute_op, cfg.throughput)
    align = alignment_findings(frames.compute_op, cfg.alignment, cfg.tp)
    if not cfg.include_preferred:
        align = align.filter(pl.col("severity") == "min")
    found = [cross_rank_findings(tp, cfg.throughput, names)]
    if baseline is not None:
        base_tp = rank_throughput(baseline.compute_op, cfg.throughput)
        base_names = name_throughput(baseline.compute_op, cfg.throughput)
        found.append(baseline_findings(tp, base_tp, cfg.throughput, align, names, base_names))
    thr = pl.concat(found, how="vertical_relaxed")
    out: list[ThroughputCheck | AlignmentCheck] = [_throughput_check(r) for r in thr.iter_rows(named=True)]
    explained = thr.filter(pl.col("reason").str.contains("misaligned dim")).select(KEY).unique()
    out += [d for d in _alignment_checks(align, tp, explained)
            if d.ratio_basis == "none" or d.ratio < cfg.alignment_cost]
    steps = _steps_by_key(frames.compute_op)
    found = [_as_finding(d, steps) for d in out]
    return sorted(found, key=lambda r: (r.check.ratio, r.check.check != "throughput"))


def _steps_by_key(compute_op: pl.DataFrame) -> dict[tuple, list[int]]:
    g = gemm_rows(compute_op).filter(pl.col("step").is_not_null())
    if g.height == 0:
        return {}
    per = g.group_by(KEY).agg(pl.col("step").unique().sort())
    return {tuple(r[c] for c in KEY): [int(x) for x in r["step"]] for r in per.iter_rows(named=True)}


def _as_finding(d: ThroughputCheck | AlignmentCheck, steps: dict[tuple, list[int]]) -> Regression:
    """The check with the findings keys (kind, culprit, factor, steps, evidence)."""
    misaligned = d.check == "alignment" or "misaligned dim" in d.reason
    by_rank = d.check == "throughput" and d.comparison == "ranks"
    # Ranks slow on (nearly) every shape are the culprit themselves (a throttled GPU, a slow stage).
    several = by_rank and len(d.ranks) > 1 and d.reason.startswith("rank slow on")
    key = (d.kernel_class, *_mnk(d.shape), d.dtype)
    evidence = {k: getattr(d, k) for k in ("kernel", "kernel_class", "shape", "dtype", "ranks", "ratio",
                                           "ratio_basis", "reason", "comparison")}
    evidence.update({k: getattr(d, k) for k in ("tflops", "reference_tflops", "dims", "severity") if hasattr(d, k)})
    return Regression(check=d, kind="misaligned_gemm" if misaligned else "kernel_regression",
                      culprit=d.ranks[0] if by_rank and len(d.ranks) == 1 else list(d.ranks) if several else d.kernel,
                      factor=1.0 / d.ratio if d.ratio > 0 else None, steps=steps.get(key, []), evidence=evidence)


def _mnk(shape: list[int]) -> tuple[int, int, int, int]:
    """(m, n, k, batch) of a shape as :func:`_shape` writes it."""
    return (shape[-3], shape[-2], shape[-1], shape[0] if len(shape) == 4 else 1)


def _shape(r: dict) -> list[int]:
    return ([int(r["batch"])] if r["batch"] and r["batch"] > 1 else []) + [int(r["m"]), int(r["n"]), int(r["k"])]


def _kernel_alignment_note(kernel: str, dtype: str) -> str:
    """CUTLASS names say the alignment a kernel was built for (``align1``): below 16 bytes it is the
    fallback cuBLAS/CUTLASS pick for a misaligned operand."""
    m = re.search(r"align(\d+)", kernel or "")
    eb = element_bytes(dtype)
    if m is None or eb is None or int(m.group(1)) * eb >= 16:
        return ""
    return f"; {kernel} is built for {m.group(1)}-element alignment, below the 16-byte minimum"


def _throughput_check(r: dict) -> ThroughputCheck:
    return ThroughputCheck(
        check="throughput", kernel=r["kernel"], kernels=list(r["kernels"]), kernel_class=r["kernel_class"],
        shape=_shape(r), dtype=r["dtype"], layout=r["layout"], ranks=list(r["ranks"]), ratio=float(r["ratio"]),
        ratio_basis="baseline" if r["comparison"] == "baseline" else "other ranks", tflops=r["tflops"],
        reference_tflops=r["reference_tflops"], reason=r["reason"] + _kernel_alignment_note(r["kernel"], r["dtype"]),
        severity="regression", comparison=r["comparison"])


def _alignment_checks(align: pl.DataFrame, tp: pl.DataFrame, explained: pl.DataFrame) -> list[AlignmentCheck]:
    if align.height == 0:
        return []
    mis = align.group_by([*KEY, "kernel"]).agg(
        pl.col("reason").unique().sort().str.join("; "), pl.col("severity").min(),
        pl.col("layout").mode().sort().first(),
        pl.col("ranks").list.explode(keep_nulls=False, empty_as_null=False).unique().sort(), pl.col("dim"))
    mis = mis.join(explained, on=KEY, how="anti")
    ratios = _aligned_ratio(tp, mis)
    out = []
    for r in mis.join(ratios, on=KEY, how="left").iter_rows(named=True):
        basis = r["_basis"] if r["_ratio"] is not None else "none"
        out.append(AlignmentCheck(
            check="alignment", kernel=r["kernel"], kernel_class=r["kernel_class"], shape=_shape(r), dtype=r["dtype"],
            layout=r["layout"], ranks=list(r["ranks"]), ratio=float(r["_ratio"]) if r["_ratio"] is not None else 1.0,
            ratio_basis=basis, reason="misaligned dim: " + r["reason"], severity=r["severity"], dims=list(r["dim"]),
            comparison="rules"))
    return out


def _aligned_ratio(tp: pl.DataFrame, mis: pl.DataFrame) -> pl.DataFrame:
    """TFLOP/s of each misaligned key over the median TFLOP/s of the aligned keys of its class and dtype,
    taken from those of a similar size (FLOPs per call within ``SIMILAR_FLOPS`` times) when there are any:
    small GEMMs run at a lower TFLOP/s than big ones whatever their alignment. Returns KEY, ``_ratio``,
    ``_basis``."""
    if tp.height == 0:
        return pl.DataFrame(schema={**{c: tp.schema[c] for c in KEY}, "_ratio": pl.Float64, "_basis": pl.String})
    per_key = tp.group_by(KEY).agg(pl.col("tflops").median().alias("_tf"),
                                   (pl.col("flops") / pl.col("num_calls")).median().log().alias("_lf"))
    flagged = per_key.join(mis.select(KEY), on=KEY, how="semi")
    aligned = per_key.join(mis.select(KEY), on=KEY, how="anti").select(
        "kernel_class", "dtype", pl.col("_tf").alias("_rtf"), pl.col("_lf").alias("_rlf"))
    pairs = flagged.join(aligned, on=["kernel_class", "dtype"], how="inner")
    near = (pl.col("_lf") - pl.col("_rlf")).abs() <= float(np.log(SIMILAR_FLOPS))
    ref = pairs.group_by(KEY).agg(pl.col("_rtf").filter(near).median().alias("_near"),
                                  pl.col("_rtf").median().alias("_all"))
    out = flagged.join(ref, on=KEY, how="left")
    return out.select(
        *KEY, (pl.col("_tf") / pl.coalesce("_near", "_all")).alias("_ratio"),
        pl.when(pl.col("_near").is_not_null()).then(pl.lit(f"aligned GEMMs of this job within {SIMILAR_FLOPS}x "
                                                            "its FLOPs per call"))
        .when(pl.col("_all").is_not_null()).then(pl.lit("aligned GEMMs of this job"))
        .otherwise(pl.lit("none")).alias("_basis"))
