"""The leave-one-out peer median of persistent_links equals the self-join it replaced."""

import numpy as np
import polars as pl

from rankscope.analysis.whatif.evidence import _median_of_others


def test_equals_the_self_join_on_random_groups_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, steps = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        rows = [(r, st, op, float(rng.integers(0, 5))) for st in range(steps) for op in ("a", "b") for r in range(n)]
        per = pl.DataFrame(rows, schema=["rank", "step", "optype", "x"], orient="row")
        old = per.join(per.select("step", "optype", pl.col("rank").alias("peer"), pl.col("x").alias("px")),
                       on=["step", "optype"]).filter(pl.col("peer") != pl.col("rank")).group_by(
            "rank", "step", "optype").agg(pl.col("px").median())
        srt = per.sort("step", "optype", "x")
        new = srt.with_columns(px=pl.Series(_median_of_others(srt))).filter(pl.col("px").is_not_nan())
        assert old.sort("rank", "step", "optype").equals(
            new.select("rank", "step", "optype", "px").sort("rank", "step", "optype"))
