"""One row per (rank, step, microbatch, pass) for the sequence what-if: a frame whose groups are single ops is
taken as it is, and gives what the group-by gives."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.whatif.graph import BWD, FWD
from rankscope.analysis.whatif.sequence import _one_op_each, fwd_bwd_pearson, per_microbatch

KEY = ["rank", "step", "microbatch", "optype"]


def _cops(n_ranks=3, steps=2, mbs=4, repeat=1, seed=0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [(r, s, m, o) for r in range(n_ranks) for s in range(steps) for m in range(mbs) for o in (FWD, BWD)
            for _ in range(repeat)]
    rng.shuffle(rows)
    r, s, m, o = zip(*rows, strict=True)
    return pl.DataFrame({
        "row": pl.Series(range(len(rows)), dtype=pl.UInt32), "rank": pl.Series(r, dtype=pl.Int32),
        "dp_rank": pl.Series([x % 2 for x in r], dtype=pl.Int32), "stage": pl.Series([x // 2 for x in r], dtype=pl.Int32),
        "step": pl.Series(s, dtype=pl.Int32), "microbatch": pl.Series(m, dtype=pl.Int32),
        "optype": pl.Series(o, dtype=pl.Enum([FWD, BWD])), "a": rng.uniform(1e6, 2e6, len(rows)),
        "start_ns": rng.uniform(0, 1e9, len(rows)).round()})


def _grouped(cops: pl.DataFrame) -> pl.DataFrame:
    return cops.group_by(*KEY).agg(pl.col("a").sum(), pl.col("dp_rank").first().alias("pipe"),
                                   pl.col("stage").first(), pl.col("start_ns").min())


@pytest.mark.parametrize("repeat", [1, 3])
def test_per_microbatch_equals_the_group_by(repeat):
    cops = _cops(repeat=repeat)
    assert _one_op_each(cops, KEY) == (repeat == 1)
    got, want = per_microbatch(cops).sort(KEY), _grouped(cops).sort(KEY)
    assert got.columns == want.columns
    assert got.height == cops.height // repeat
    assert got.equals(want) if repeat == 1 else np.allclose(got["a"], want["a"], rtol=1e-12)
    assert got.drop("a").equals(want.drop("a"))


def test_one_op_each_needs_packable_keys():
    cops = _cops()
    assert _one_op_each(cops, KEY)
    # a null key cannot be packed: the group-by decides
    assert not _one_op_each(cops.with_columns(pl.when(pl.col("row") == 0).then(None).otherwise(pl.col("step"))
                                              .alias("step")), KEY)
    dup = pl.concat([cops, cops.head(1)])
    assert not _one_op_each(dup, KEY)
    assert per_microbatch(dup).height == cops.height


def test_pearson_is_the_same_from_either_path():
    cops = _cops(n_ranks=4, steps=3, mbs=6, seed=3)
    fast = fwd_bwd_pearson(cops)
    slow = fwd_bwd_pearson(cops, _grouped(cops))
    assert np.isfinite(fast) and fast == pytest.approx(slow, rel=1e-12)
