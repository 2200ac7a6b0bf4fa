"""Columns null in every row: held as broadcast nulls, with the same values and types as the stored ones."""

from __future__ import annotations

import polars as pl

from rankscope.collectors.fresh_rows import FreshRows
from rankscope.collectors.job_frames import load_job, nulls_unstored
from rankscope.collectors.schema import validate
from rankscope.collectors.store import ManifestEntry, Store


def test_all_null_columns_keep_their_type_and_values():
    df = pl.DataFrame({"a": [1, 2, 3], "b": pl.Series([None, None, None], dtype=pl.Int64),
                       "c": pl.Series([None, None, None], dtype=pl.List(pl.Int32)), "d": ["x", None, "z"]})
    out = nulls_unstored(df)
    assert out.schema == df.schema and out.equals(df)
    assert nulls_unstored(df.head(0)).schema == df.schema


def test_rows_handed_over_equal_the_rows_read_back(tmp_path):
    """analyze --ingest's frames (FreshRows, which drops the all-null columns before converting) equal the
    frames read back from the store, column by column and type by type."""
    store = Store(tmp_path / "st")
    rows = pl.DataFrame({"job": ["j"] * 4, "rank": [0, 1, 0, 1], "name": ["gemm"] * 4, "start_ns": [0, 0, 10, 10],
                         "end_ns": [5, 6, 15, 16], "source": ["t"] * 4})
    with store.transaction("cd" * 16, keep_rows=True) as tx:
        tx.write("compute_op", validate(rows, "compute_op").table)
        kept = tx.kept
        tx.commit(ManifestEntry(key="cd" * 16, source="x", format="t", job="j", sha256="0"))
    fresh = load_job(store, "j", fresh=FreshRows(kept)).compute_op
    stored = load_job(store, "j").compute_op
    assert fresh.schema == stored.schema
    assert fresh.equals(stored)
    assert stored["m"].null_count() == stored.height  # a schema column this format does not fill
