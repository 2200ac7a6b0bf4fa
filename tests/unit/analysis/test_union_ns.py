"""Union length per group: the banded running max equals interval merging, and falls back when it cannot band."""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.model.timelines import union_ns


def _merged(rows) -> dict:
    rows = list(rows)
    out: dict = {}
    for key in {(r, s) for r, s, _, _ in rows}:
        iv = sorted((a, b) for r, s, a, b in rows if (r, s) == key)
        total, cur_a, cur_b = 0, None, None
        for a, b in iv:
            if cur_b is None or a > cur_b:
                total += max(cur_b - cur_a, 0) if cur_b is not None else 0
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        total += max(cur_b - cur_a, 0)
        out[key] = total
    return out


def test_union_equals_interval_merging_and_the_windowed_fallback():
    rng = np.random.default_rng(7)
    n = 3000
    start = rng.integers(-10**6, 10**6, n)
    df = pl.DataFrame({"rank": rng.integers(0, 7, n), "step": rng.integers(0, 4, n), "start_ns": start,
                       "end_ns": start + rng.integers(-50, 5 * 10**4, n)})
    want = _merged(df.iter_rows())
    got = {(r, s): u for r, s, u in union_ns(df, ["rank", "step"]).iter_rows()}
    assert got == want
    # ends so far apart that the bands would overflow int64: the windowed form gives the same
    wide = df.with_columns(pl.when(pl.col("rank") == 0).then(pl.lit(2**61)).otherwise(pl.col("end_ns")).alias("end_ns"))
    got = {(r, s): u for r, s, u in union_ns(wide, ["rank", "step"]).iter_rows()}
    assert got == _merged(wide.iter_rows())
