"""The what-if metrics' op codes: the table look-ups give what a sort and a search give."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.whatif.metrics import _op_codes, rank_index


@pytest.mark.parametrize("rank", [
    np.array([3, 0, 7, 7, 3, 12], dtype=np.int32),  # gaps between ranks
    np.array([5], dtype=np.int64),
    np.array([-2, 4, -2, 9], dtype=np.int64),  # negative: sorted and searched
    np.array([2, 10**12, 2], dtype=np.int64),  # far apart: no table that big
])
def test_rank_index_is_unique_and_searchsorted(rank):
    ranks, idx = rank_index(rank)
    want = np.unique(rank)
    np.testing.assert_array_equal(ranks, want)
    assert ranks.dtype == rank.dtype
    np.testing.assert_array_equal(idx, np.searchsorted(want, rank))


def test_op_codes_group_pipeline_sends_and_recvs():
    ops = pl.DataFrame({"rank": [2, 0, 2, 1], "optype": ["forward-send", "gemm", "forward-recv", "gc"],
                        "dp_rank": [0, 0, 0, 1], "stage": [1, 0, 1, 0]},
                       schema_overrides={"rank": pl.Int32, "dp_rank": pl.Int32, "stage": pl.Int32})
    codes = _op_codes(ops)
    assert codes.og_names == ["forward-pp-comm", "gc", "gemm"]
    np.testing.assert_array_equal(codes.ranks, [0, 1, 2])
    np.testing.assert_array_equal(codes.og_i, [0, 2, 0, 1])
    np.testing.assert_array_equal(codes.labels, np.array([2, 0, 2, 1]) * 3 + np.array([0, 2, 0, 1]))
    np.testing.assert_array_equal(codes.r_dp, [0, 1, 0])
    np.testing.assert_array_equal(codes.r_st, [0, 0, 1])
