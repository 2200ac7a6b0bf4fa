"""model.sort_key: one packed int64 key must order rows exactly as the sort on its columns, or decline."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.model.sort_key import packed_sort_key, sort_by_columns


def _frame(rng: np.random.Generator, n: int) -> pl.DataFrame:
    return pl.DataFrame({
        "rank": rng.integers(0, 7, n).astype(np.int32),
        "step": rng.integers(-3, 4, n),
        "start_ns": rng.integers(0, 50, n).astype(np.float64) * 1e3,  # whole numbers held as floats
        "row": np.arange(n),
    })


@pytest.mark.parametrize("seed", range(40))
def test_packed_key_sorts_as_the_columns_do_ties_and_descending_included(seed):
    rng = np.random.default_rng(seed)
    df = _frame(rng, int(rng.integers(1, 300)))
    cols = ["rank", "step", "start_ns"][: int(rng.integers(1, 4))]
    desc = [bool(x) for x in rng.integers(0, 2, len(cols))]
    key = packed_sort_key(df, cols, desc)
    assert key is not None
    want = df.sort(cols, descending=desc, maintain_order=True)["row"]
    got = df.sort(key, maintain_order=True)["row"]
    assert got.to_list() == want.to_list()


def test_declines_what_it_cannot_pack():
    df = pl.DataFrame({"a": [1, 2, None], "b": [0.5, 1.0, 2.0], "c": [0, 2**62, 1], "s": ["x", "y", "z"]})
    assert packed_sort_key(df, ["a"]) is None  # a null
    assert packed_sort_key(df, ["b"]) is None  # a fraction
    assert packed_sort_key(df, ["c"]) is None  # a range past 2**62
    assert packed_sort_key(df, ["s"]) is None  # not a number
    wide = pl.DataFrame({"x": [0, 2**40], "y": [0, 2**40]})
    assert packed_sort_key(wide, ["x", "y"]) is None  # ranges that multiply past 2**62
    nan = pl.DataFrame({"f": [1.0, float("nan")]})
    assert packed_sort_key(nan, ["f"]) is None


@pytest.mark.parametrize("seed", range(10))
def test_sort_by_columns_is_the_polars_sort_whether_packed_or_not(seed):
    rng = np.random.default_rng(100 + seed)
    df = _frame(rng, 200)
    if seed % 2:  # a fraction: the columns cannot be packed, the plain sort runs
        df = df.with_columns(pl.col("start_ns") + 0.5)
    cols, desc = ["step", "start_ns", "rank"], [True, False, False]
    want = df.sort(cols, descending=desc, maintain_order=True)["row"].to_list()
    assert sort_by_columns(df, cols, desc, maintain_order=True)["row"].to_list() == want
