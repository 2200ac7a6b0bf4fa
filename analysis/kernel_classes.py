"""Kernel classification: one regex table, HTA style.

Every analysis that needs to know what a kernel or op name *is* (a cuBLAS
GEMM, a CUTLASS GEMM, an aten matmul on CPU, a NCCL kernel, ...) asks this
module, so the patterns live in exactly one place. The table is ordered: the
first pattern that matches a name wins.
"""

from __future__ import annotations

import polars as pl

KERNEL_CLASSES: tuple[tuple[str, str, str], ...] = (
    # (class, compute category, case-insensitive regex on the kernel or op name)
    ("nccl", "other", r"^nccl|ncclDevKernel|ncclKernel|c10d::|gloo:"),
    ("memcpy", "memory", r"^memcpy|^memset|Memcpy [DHP]to[DHP]|Memset|cudaMemcpy"),
    ("flash_attention", "attention", r"flash_?fwd|flash_?bwd|flash_attn|fmha|_scaled_dot_product_flash"),
    ("attention", "attention", r"scaled_dot_product|attention|softmax_warp"),
    ("gemm_cutlass", "gemm", r"cutlass.*gemm|cutlass_\d+x\d+|sm\d+_xmma_gemm|gemm.*cutlass"),
    ("gemm_cublas", "gemm", r"^(ampere|volta|turing|hopper|sm\d+)_.*gemm|cublas|gemvx?|s\d+gemm|"
                            r"gemmSN|gemmk1|splitKreduce"),
    ("gemm_triton", "gemm", r"triton.*(mm|matmul|gemm)"),
    ("gemm_aten", "gemm", r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|addbmm)$"),
    ("gemm_other", "gemm", r"gemm|matmul"),
    ("optimizer", "optimizer", r"multi_tensor_apply|adam|sgd|optimizer\.step|Optimizer\.step"),
    ("reduction", "reduction", r"reduce_kernel|reduction|layer_?norm|rms_?norm|batch_norm"),
    ("elementwise", "elementwise", r"elementwise|vectorized_elementwise|unrolled_elementwise|"
                                   r"aten::(add|mul|relu|gelu|silu|copy_|fill_)"),
)
"""Ordered (class, category, regex); the first match names a kernel's class."""

GEMM_CLASSES = tuple(c for c, cat, _ in KERNEL_CLASSES if cat == "gemm")

_LAYOUT = r"(?:^|_)(nn|nt|tn|tt)(?:_|$)"
_ALIGN = r"align(\d+)"
_TILE = r"(\d+x\d+(?:x\d+)?)"


def kernel_class_expr(name: str = "name") -> pl.Expr:
    """A polars expression giving the class of each name in column ``name`` (``other`` if none match)."""
    expr = pl.lit("other")
    # when/then chains evaluate in order, so build it from the last entry backwards.
    for cls, _, pattern in reversed(KERNEL_CLASSES):
        expr = pl.when(pl.col(name).str.contains("(?i)" + pattern)).then(pl.lit(cls)).otherwise(expr)
    return expr


def classify(names: pl.Series | list[str]) -> pl.Series:
    """Kernel class of each name, vectorised. Returns a string Series of the same length."""
    s = names if isinstance(names, pl.Series) else pl.Series("name", names, dtype=pl.String)
    return pl.DataFrame({"name": s}).select(kernel_class_expr("name").alias("kernel_class"))["kernel_class"]


def class_of(name: str) -> str:
    """Kernel class of one name (convenience for messages and tests)."""
    return classify([name])[0]


def kernel_traits(df: pl.DataFrame, name: str = "name") -> pl.DataFrame:
    """Add ``kernel_class``, ``name_layout`` (nn/nt/tn/tt from the name), ``name_align`` (CUTLASS alignN,
    elements) and ``name_tile`` (e.g. 128x128) parsed from kernel names.

    Needs: a string column ``name``. Returns the frame with those four columns appended.
    """
    return df.with_columns(
        kernel_class_expr(name).alias("kernel_class"),
        pl.col(name).str.to_lowercase().str.extract(_LAYOUT, 1).alias("name_layout"),
        pl.col(name).str.extract(_ALIGN, 1).cast(pl.Int64, strict=False).alias("name_align"),
        pl.col(name).str.extract(_TILE, 1).alias("name_tile"),
    )
