"""Tensor-core alignment rules for GEMM shapes.

Tensor cores want every GEMM dimension to span whole 16-byte chunks (the
minimum: below it cuBLAS/CUTLASS fall back to ``align1``/``align2`` kernels or
to no tensor cores at all) and preferably whole 128-byte cache lines. In
elements that is 8 / 64 for fp16/bf16, 16 / 128 for fp8/int8, 4 / 32 for
tf32 (NVIDIA "Matrix Multiplication Background" guide). Only dtypes that run
on tensor cores, only contiguous dims, and only GEMMs big enough to fill a
tile are checked: elsewhere alignment does not change the time. A model whose
dims are aligned can still lose alignment when tensor parallelism splits a dim
across ranks (an FFN of 18,432 split 32 ways is 576, not a multiple of 128).
"""

from __future__ import annotations

import functools

import polars as pl

from rankscope.analysis.kernels.classes import GEMM_CLASSES, kernel_traits
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.record_class import record
from rankscope.collectors.vocab import dtype_name, dtype_size

TENSOR_CORE_DTYPES: dict[str, str] = {
    # canonical dtype -> why its GEMMs have an alignment rule (the bytes come from AlignmentConfig)
    "float16": "HMMA tensor cores load 16-byte fragments (8 elements); cuBLAS falls back to align1/2 kernels",
    "bfloat16": "HMMA tensor cores load 16-byte fragments (8 elements); cuBLAS falls back to align1/2 kernels",
    "tf32": "TF32 tensor cores load 16-byte fragments (4 elements)",
    "float8_e4m3fn": "FP8 tensor cores (Hopper+) need 16-byte fragments (16 elements); cuBLASLt refuses others",
    "float8_e5m2": "FP8 tensor cores (Hopper+) need 16-byte fragments (16 elements); cuBLASLt refuses others",
    "int8": "IMMA tensor cores need 16-byte fragments (16 elements)",
}
"""Dtypes whose GEMMs run on tensor cores, so a misaligned dim costs throughput.

Not listed, on purpose: ``float32`` (IEEE fp32 GEMMs run on CUDA cores; PyTorch leaves TF32 off for
matmul by default and a trace does not say it was on, so 4-element alignment buys little), ``float64``
(DMMA exists, but fp64 training GEMMs are rare and its tiles differ), and integer types other than int8.
"""

@record
class AlignmentConfig:
    """Alignment rule thresholds (bytes) for the tensor-core dtypes; elements follow from the element size."""

    min_bytes: int = 16
    """a dim below this alignment loses tensor-core kernels (severity ``min``)."""
    preferred_bytes: int = 128
    """a dim not a multiple of this wastes memory transactions (severity ``preferred``)."""
    dims: tuple[str, ...] = ("m", "n", "k")
    """GEMM dims that may be checked."""
    by_layout: bool = True
    """check only the dims that are the contiguous (leading) dimension of an operand, since only those
    set a vector-load alignment. In PyTorch's row-major GEMMs C[M,N] = A @ B that is N (of C), K of A
    (M when A is a transposed view, layout ``t?``) and N of B (K when B is transposed, ``?t``); with the
    layout unknown, N and K (``x @ W.T`` and ``dY @ W``). M, usually tokens, is then not checked, nor is
    the token dim a weight-gradient GEMM reduces over."""
    min_gemm_dim: int = 16
    """a GEMM with any dim below this (a batch of 1 or 2, an outer product with k of 1) is memory-bound:
    it is a GEMV or a rank-k update, never fills one 16-row tensor-core tile, and alignment does not
    change its time, so none of its dims are checked."""

    def __post_init__(self):
        if self.min_bytes <= 0 or self.preferred_bytes <= 0:
            raise ConfigError(f"alignment bytes must be > 0, got {self.min_bytes}/{self.preferred_bytes}")
        if self.preferred_bytes % self.min_bytes:
            raise ConfigError(f"preferred_bytes {self.preferred_bytes} must be a multiple of "
                              f"min_bytes {self.min_bytes}")
        if self.min_gemm_dim < 1:
            raise ConfigError(f"min_gemm_dim must be >= 1, got {self.min_gemm_dim}")
        bad = [d for d in self.dims if d not in ("m", "n", "k")]
        if bad or not self.dims:
            raise ConfigError(f"dims must be a non-empty subset of ('m','n','k'), got {self.dims!r}")


def element_bytes(dtype: str | None) -> int | None:
    """Bytes per element of a dtype name (``torch.bfloat16``, ``bf16``, ``c10::Half``...), None if unknown."""
    return dtype_size(dtype)


def required_elements(dtype: str | None, config: AlignmentConfig | None = None) -> tuple[int, int] | None:
    """(minimum, preferred) alignment in elements for a dtype, None when its GEMMs have no tensor-core
    alignment rule (see TENSOR_CORE_DTYPES) or its size is unknown."""
    cfg = config or AlignmentConfig()
    eb = dtype_size(dtype)
    if eb is None or dtype_name(dtype) not in TENSOR_CORE_DTYPES:
        return None
    return max(1, cfg.min_bytes // eb), max(1, cfg.preferred_bytes // eb)


def check_dim(value: int, dtype: str, config: AlignmentConfig | None = None) -> str | None:
    """``min``, ``preferred`` or None (aligned / unknown dtype) for one dimension."""
    req = required_elements(dtype, config)
    if req is None:
        return None
    if value % req[0]:
        return "min"
    if value % req[1]:
        return "preferred"
    return None


def tp_split_findings(dims: dict[str, int], dtype: str, tp_degrees=(2, 4, 8, 16, 32, 64),
                      config: AlignmentConfig | None = None) -> list[dict]:
    """Model dims that are aligned whole but lose alignment (or do not divide) when split tp ways.

    ``dims`` maps a label (``ffn``, ``hidden``, ``heads*head_dim``...) to its full size. Returns one dict
    per (dim, tp) that breaks: {dim, value, tp, split, severity, reason}.
    """
    out = []
    for label, value in dims.items():
        whole = check_dim(int(value), dtype, config)
        for tp in tp_degrees:
            if value % tp:
                out.append({"dim": label, "value": int(value), "tp": int(tp), "split": value / tp,
                            "severity": "min",
                            "reason": f"{label} {value:,} does not divide across {tp} tensor-parallel ranks"})
                continue
            split = value // tp
            sev = check_dim(split, dtype, config)
            if sev is not None and sev != whole:
                out.append({"dim": label, "value": int(value), "tp": int(tp), "split": int(split),
                            "severity": sev, "reason": split_reason(label, int(value), tp, split, dtype, sev,
                                                                    config)})
    return out


def split_reason(label: str, value: int, tp: int, split: int, dtype: str, severity: str,
                 config: AlignmentConfig | None = None) -> str:
    req = required_elements(dtype, config) or (1, 1)
    need = req[0] if severity == "min" else req[1]
    return (f"{label} {value:,} split {tp} ways = {split:,}, not a multiple of {need} elements "
            f"({dtype}, {'16-byte minimum' if severity == 'min' else '128-byte preferred'})")


def _requirements(dtypes: pl.Series, config: AlignmentConfig) -> pl.DataFrame:
    uniq = dtypes.drop_nulls().unique().to_list()
    rows = [(d, *(required_elements(d, config) or (None, None))) for d in uniq]
    return pl.DataFrame(rows, schema={"dtype": pl.String, "min_elems": pl.Int64, "pref_elems": pl.Int64},
                        orient="row")


def alignment_findings(compute_op: pl.DataFrame, config: AlignmentConfig | None = None,
                       tp: int | None = None) -> pl.DataFrame:
    """Misaligned GEMM dims of one job, one row per (kernel, shape, dtype, layout, dim).

    Needs compute_op columns ``rank, name, category, start_ns, end_ns, m, n, k, dtype`` (``layout``, ``batch``
    optional). GEMMs are rows with category ``gemm`` or a GEMM kernel class, with m, n, k and a dtype of
    known size. ``tp``, when the strategy knows it, adds the unsplit size (``value * tp``) to the reason.
    Returns columns ``kernel, kernel_class, m, n, k, batch, dtype, layout, dim, value, min_elems,
    pref_elems, severity, ranks, num_calls, time_ns, reason``; empty when nothing is misaligned.
    """
    cfg = config or AlignmentConfig()
    g = gemm_rows(compute_op)
    if g.height == 0:
        return _empty_findings()
    req = _requirements(g["dtype"], cfg)
    g = g.join(req, on="dtype", how="inner").filter(
        pl.col("min_elems").is_not_null() & (pl.min_horizontal("m", "n", "k") >= cfg.min_gemm_dim))
    if g.height == 0:
        return _empty_findings()
    long = pl.concat([
        g.with_columns(pl.lit(d).alias("dim"), pl.col(d).alias("value")) for d in cfg.dims])
    if cfg.by_layout:
        long = long.filter(_leading_dim())
    long = long.with_columns(
        pl.when(pl.col("value") % pl.col("min_elems") != 0).then(pl.lit("min"))
        .when(pl.col("value") % pl.col("pref_elems") != 0).then(pl.lit("preferred"))
        .otherwise(None).alias("severity")).filter(pl.col("severity").is_not_null())
    if long.height == 0:
        return _empty_findings()
    keys = ["kernel", "kernel_class", "m", "n", "k", "batch", "dtype", "layout", "dim", "value",
            "min_elems", "pref_elems", "severity"]
    agg = long.group_by(keys).agg(
        pl.col("rank").unique().sort().alias("ranks"), pl.len().alias("num_calls"),
        pl.col("dur_ns").sum().alias("time_ns"))
    need = pl.when(pl.col("severity") == "min").then(pl.col("min_elems")).otherwise(pl.col("pref_elems"))
    unsplit = (pl.lit(f" (unsplit {tp}x: ") + (pl.col("value") * tp).cast(pl.String) + pl.lit(")")
               if tp and tp > 1 else pl.lit(""))
    agg = agg.with_columns(
        (pl.col("dim").str.to_uppercase() + pl.lit("=") + pl.col("value").cast(pl.String) + unsplit
         + pl.lit(" is not a multiple of ") + need.cast(pl.String) + pl.lit(" elements (")
         + pl.col("dtype") + pl.lit(", ")
         + pl.when(pl.col("severity") == "min").then(pl.lit(f"{cfg.min_bytes}-byte minimum"))
         .otherwise(pl.lit(f"{cfg.preferred_bytes}-byte preferred")) + pl.lit(" alignment)")).alias("reason"))
    return agg.sort(["severity", "time_ns"], descending=[False, True])


def _leading_dim() -> pl.Expr:
    """Whether ``dim`` is the contiguous dim of A, B or C for the row's ``layout`` (see AlignmentConfig)."""
    lay = pl.col("layout").str.to_lowercase()
    a_t, b_t = lay.str.slice(0, 1) == "t", lay.str.slice(1, 1) == "t"
    d = pl.col("dim")
    return ((d == "n") | ((d == "k") & (~a_t | b_t)) | ((d == "m") & a_t))


def gemm_rows(compute_op: pl.DataFrame) -> pl.DataFrame:
    """GEMM rows with a known shape: adds ``kernel`` (name), kernel traits, ``dur_ns``, and fills
    ``batch`` (1) and ``layout`` (``?`` when the source does not say). Needs compute_op columns
    ``rank, name, category, start_ns, end_ns, m, n, k, dtype``."""
    if compute_op.height == 0 or not {"m", "n", "k"} <= set(compute_op.columns):
        return _empty_gemms()
    n = compute_op.height
    df = None if any(compute_op[c].null_count() == n for c in "mnk") else compute_op.filter(
        pl.col("m").is_not_null() & pl.col("n").is_not_null() & pl.col("k").is_not_null())
    if df is None or df.height == 0:
        # no shapes (traces without GEMM records): the name patterns are not evaluated on no rows, in each of
        # the section's four calls (~1.5 ms each on the OSDI'25 traces)
        return _no_shaped_gemms(tuple(compute_op.schema.items())).clone()
    return _gemms_of(df)


@functools.lru_cache(maxsize=8)
def _no_shaped_gemms(schema: tuple) -> pl.DataFrame:
    """:func:`gemm_rows` of compute_op rows with this schema of which none has a shape: no rows, its columns."""
    return _gemms_of(pl.DataFrame(schema=dict(schema)))


def _gemms_of(df: pl.DataFrame) -> pl.DataFrame:
    """:func:`gemm_rows` of compute_op rows that have a shape."""
    df = kernel_traits(df, "name")
    df = df.filter((pl.col("category") == "gemm") | pl.col("kernel_class").is_in(list(GEMM_CLASSES)))
    for col, dtype in (("batch", pl.Int64), ("layout", pl.String), ("flops", pl.Float64),
                       ("step", pl.Int64)):
        if col not in df.columns:
            df = df.with_columns(pl.lit(None, dtype=dtype).alias(col))
    return df.with_columns(
        pl.col("name").alias("kernel"),
        pl.col("batch").fill_null(1),
        # Only the op's own layout keys a GEMM: a layout parsed from a kernel name changes with the
        # kernel chosen, which is one of the things being compared.
        pl.col("layout").fill_null("?"),
        pl.col("dtype").fill_null("?"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
    )


def _empty_gemms() -> pl.DataFrame:
    return pl.DataFrame(schema={"rank": pl.Int32, "kernel": pl.String, "kernel_class": pl.String,
                                "m": pl.Int64, "n": pl.Int64, "k": pl.Int64, "batch": pl.Int64,
                                "dtype": pl.String, "layout": pl.String, "dur_ns": pl.Int64,
                                "flops": pl.Float64, "name_align": pl.Int64, "step": pl.Int64,
                                "start_ns": pl.Int64, "end_ns": pl.Int64})


def _empty_findings() -> pl.DataFrame:
    return pl.DataFrame(schema={
        "kernel": pl.String, "kernel_class": pl.String, "m": pl.Int64, "n": pl.Int64, "k": pl.Int64,
        "batch": pl.Int64, "dtype": pl.String, "layout": pl.String, "dim": pl.String, "value": pl.Int64,
        "min_elems": pl.Int64, "pref_elems": pl.Int64, "severity": pl.String, "ranks": pl.List(pl.Int32),
        "num_calls": pl.UInt32, "time_ns": pl.Int64, "reason": pl.String})
