"""The OSDI'25 graph's per-op look-ups: template ids by a packed-key search (as a left join on the keys gives
them) and streams gathered per op type (as the when/then chain gives them)."""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.whatif.osdi import (
    COMM_TYPES,
    DP_COMM_TYPES,
    P2P_TYPES,
    _op_type_codes,
    _stream,
    _template_ids,
)

TYPES = ["forward-compute", "backward-compute", "forward-send", "backward-recv", "params-all-gather",
         "optimizer-clip-main-grad", "optimizer", "gc"]


def _ops(seed: int, n: int = 5000) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return pl.DataFrame({"optype": rng.choice([*TYPES, "not-in-template"], n).tolist(),
                         "seq": rng.integers(-1, 9, n), "stage": rng.integers(0, 5, n).astype(np.int32)})


def test_template_ids_are_the_left_joins():
    ops = _ops(3)
    t = (ops.filter((pl.col("optype") != "not-in-template") & (pl.col("seq") < 6) & (pl.col("stage") < 4))
         .unique(["optype", "seq", "stage"], keep="first", maintain_order=True).with_row_index("tid")
         .with_columns(pl.col("tid").cast(pl.Int64)))
    keys = ["optype", "seq", "stage"]
    want = ops.join(t.select(*keys, "tid"), on=keys, how="left", maintain_order="left")["tid"].fill_null(-1)
    got = _template_ids(ops, t, *_op_type_codes(ops["optype"]))
    assert (got >= 0).any() and (got < 0).any()
    assert got.tolist() == want.to_list()


def test_stream_is_the_when_then_chain():
    ops = _ops(4).with_columns(pl.when(pl.col("seq") == 0).then(None).otherwise(pl.col("optype")).alias("optype"))
    chain = (pl.when(pl.col("optype").is_in(list(P2P_TYPES))).then(pl.col("optype"))
             .when(pl.col("optype").is_in(list(DP_COMM_TYPES))).then(pl.lit("dp-comm"))
             .when(pl.col("optype").is_in(list(COMM_TYPES))).then(pl.lit("collective"))
             .otherwise(pl.lit("compute")))
    got = _stream(*_op_type_codes(ops["optype"]))
    assert got.dtype == pl.Categorical and got.name == "stream"  # a category an op, not a string
    assert got.to_list() == ops.select(chain)[:, 0].to_list()


def test_template_ids_of_keys_too_wide_to_pack_are_the_joins_too():
    ops = _ops(5).with_columns(pl.when(pl.col("seq") == 3).then(2**61).otherwise(pl.col("seq")).alias("seq"))
    t = ops.unique(["optype", "seq", "stage"], keep="first", maintain_order=True).head(40).with_row_index("tid") \
        .with_columns(pl.col("tid").cast(pl.Int64))
    keys = ["optype", "seq", "stage"]
    want = ops.join(t.select(*keys, "tid"), on=keys, how="left", maintain_order="left")["tid"].fill_null(-1)
    assert _template_ids(ops, t, *_op_type_codes(ops["optype"])).tolist() == want.to_list()


def test_step_and_seq_narrowed_only_where_they_fit():
    from rankscope.analysis.whatif.osdi import _narrowed

    ops = pl.DataFrame({"step": [0, 5, None], "seq": [1, 2**31, 3]})
    out = ops.with_columns(_narrowed(ops, "step", "seq"))
    assert out.schema == {"step": pl.Int32, "seq": pl.Int64}
    assert out.to_dict(as_series=False) == ops.to_dict(as_series=False)
