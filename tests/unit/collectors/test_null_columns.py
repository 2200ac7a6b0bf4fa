"""Columns null in every row: held as broadcast nulls, with the same values and types as the stored ones."""

from __future__ import annotations

import polars as pl

from rankscope.collectors.fresh_rows import FreshRows
from rankscope.collectors.job_frames import constants_unstored, load_job
from rankscope.collectors.schema import validate
from rankscope.collectors.store import ManifestEntry, Store


def test_all_null_columns_keep_their_type_and_values():
    df = pl.DataFrame({"a": [1, 2, 3], "b": pl.Series([None, None, None], dtype=pl.Int64),
                       "c": pl.Series([None, None, None], dtype=pl.List(pl.Int32)), "d": ["x", None, "z"]})
    out = constants_unstored(df)
    assert out.schema == df.schema and out.equals(df)
    assert constants_unstored(df.head(0)).schema == df.schema


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


def test_one_value_columns_are_broadcast_with_their_values_and_types():
    """A column with one value in every row is held as a broadcast (no per-row buffer) and reads back the same;
    a column that differs anywhere, bit for bit, is left as it is."""
    n = 1000
    df = pl.DataFrame({
        "job": ["j"] * n, "rank": list(range(n)), "pid": [7] * n,
        "ranks": pl.Series([[0, 1, 2]] * n, dtype=pl.List(pl.Int32)),
        "mixed_lists": pl.Series([[0, 1]] * (n - 1) + [[0, 2]], dtype=pl.List(pl.Int32)),
        "zeros": pl.Series([0.0] * (n - 1) + [-0.0]), "half": pl.Series([None] * (n - 1) + [1], dtype=pl.Int64),
        "last_differs": ["a"] * (n - 1) + ["b"],
    })
    out = constants_unstored(df)
    per_row = {c: df.select(c).estimated_size() for c in df.columns}
    held = {c: out.select(c).estimated_size() for c in df.columns}  # before a comparison materialises them
    assert {c for c in df.columns if held[c] < per_row[c] // 10} == {"job", "pid", "ranks"}
    assert out.schema == df.schema and out.equals(df)
    assert str(out["zeros"].to_list()[-1]) == "-0.0"


def test_validated_null_columns_share_one_zeroed_buffer(tmp_path):
    """The kind's columns a format leaves out come out of validate as Arrow nulls of their declared types, over
    one shared buffer (not a zeroed buffer of 8 bytes a row each), and read back from the store as nulls."""
    import pyarrow as pa

    n = 5000
    rows = pl.DataFrame({"job": ["j"] * n, "rank": [0] * n, "name": ["gemm"] * n, "category": ["gemm"] * n,
                         "start_ns": list(range(n)),
                         "end_ns": list(range(1, n + 1)), "source": ["t"] * n})
    table = validate(rows, "compute_op").table
    empty = [f for f in table.schema if table.column(f.name).null_count == n]
    assert {f.name for f in empty} >= {"m", "n", "k", "flops", "host", "grid"}
    for f in empty:
        col = table.column(f.name).combine_chunks()
        col.validate(full=True)
        assert col.equals(pa.nulls(n, type=f.type))
    # values of numbers, offsets of strings and lists alike: one buffer (a cast of a string null column from
    # polars' export would allocate its own offsets)
    held = {table.column(f.name).chunk(0).buffers()[1].address for f in empty}
    assert {pa.types.is_string(f.type) for f in empty} == {True, False} and len(held) == 1
    store = Store(tmp_path / "st")
    with store.transaction("ef" * 16) as tx:
        tx.write("compute_op", table)
        tx.commit(ManifestEntry(key="ef" * 16, source="x", format="t", job="j", sha256="0"))
    back = store.read("compute_op", "j")
    assert all(back[f.name].null_count() == n for f in empty) and back["end_ns"].to_list() == list(range(1, n + 1))
