"""One int64 sort key for a sort on several integer columns.

polars sorts on several columns by row-encoding every row; a sort on one int64 column is ~5x faster
(0.5 s against 0.1 s for 1.9 M ops at 1,024 workers). When the columns are integers (or floats that
hold whole numbers, as replay times in ns do) without nulls and their ranges multiply to under 2**62,
each column gets its own range of the key's values (mixed radix, the first column most significant), so
the key orders the rows exactly as the columns do, ties included: a stable sort on it keeps tied rows in
the same order as the stable sort on the columns.
"""

from __future__ import annotations

import polars as pl

_LIMIT = 2**62
"""the packed key's values stay below this (and each column's within +-this): no int64 overflow."""


def packed_sort_key(df: pl.DataFrame, cols: list[str], descending: list[bool] | None = None) -> pl.Expr | None:
    """An int64 expression that sorts ``df`` (ascending) as ``df.sort(cols, descending=descending)`` does,
    or None when the columns cannot be packed (not all integers, a null, or ranges too wide)."""
    descending = descending or [False] * len(cols)
    if not cols or not all(df.schema[c].is_integer() or df.schema[c].is_float() for c in cols):
        return None
    floats = [c for c in cols if df.schema[c].is_float()]
    # a float column packs when every value is a whole number (NaN and inf are not): its int64 cast then
    # orders and ties exactly as the floats do
    b = df.select(*[pl.col(c).min().alias(f"lo{i}") for i, c in enumerate(cols)],
                  *[pl.col(c).max().alias(f"hi{i}") for i, c in enumerate(cols)],
                  *[pl.col(c).null_count().alias(f"n{i}") for i, c in enumerate(cols)],
                  *[(~pl.col(c).is_finite() | (pl.col(c) != pl.col(c).floor())).sum().alias(f"f{i}")
                    for i, c in enumerate(floats)]).row(0)
    los, his = b[:len(cols)], b[len(cols):2 * len(cols)]
    nulls, fractions = b[2 * len(cols):3 * len(cols)], b[3 * len(cols):]
    if any(nulls) or any(fractions) or any(lo is None for lo in los):
        return None
    if min(los) < -_LIMIT or max(his) >= _LIMIT:
        return None
    key, total = pl.lit(0, pl.Int64), 1
    for c, lo, hi, desc in zip(cols, los, his, descending, strict=True):
        width = int(hi) - int(lo) + 1
        total *= width
        if total >= _LIMIT:
            return None
        digit = (int(hi) - pl.col(c).cast(pl.Int64)) if desc else (pl.col(c).cast(pl.Int64) - int(lo))
        key = key * width + digit
    return key


def sort_by_columns(df: pl.DataFrame, cols: list[str], descending: list[bool] | None = None,
                    maintain_order: bool = False) -> pl.DataFrame:
    """``df.sort(cols, descending=descending, maintain_order=maintain_order)``, on the packed key where the
    columns allow it (:func:`packed_sort_key`: the same order, ties included)."""
    key = packed_sort_key(df, cols, descending)
    if key is None:
        return df.sort(cols, descending=descending or False, maintain_order=maintain_order)
    return df.sort(key, maintain_order=maintain_order)
