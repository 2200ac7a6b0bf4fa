"""Kernel traits for the analysis: class (from the one table in
:mod:`rankscope.collectors.vocab`, which the importers use too), and the layout,
alignment and tile a kernel name was built for.
"""

from __future__ import annotations

import polars as pl

from rankscope.collectors.vocab import GEMM_CLASSES, KERNEL_CLASSES, kernel_class_expr

__all__ = ["GEMM_CLASSES", "KERNEL_CLASSES", "class_of", "classify", "kernel_class_expr", "kernel_traits"]

_LAYOUT = r"(?:^|_)(nn|nt|tn|tt)(?:_|$)"
_ALIGN = r"align(\d+)"
_TILE = r"(\d+x\d+(?:x\d+)?)"


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
