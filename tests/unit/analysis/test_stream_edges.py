"""The sorted-input stream edges equal the general struct-rank and lexsort construction."""

import numpy as np
import polars as pl

from rankscope.analysis.replay.engine import chain_edges
from rankscope.analysis.whatif.generic import _stream_edges


def _ops(rng, n=3000):
    return pl.DataFrame({
        "step": rng.integers(0, 4, n), "rank": rng.integers(0, 6, n),
        "stream": rng.choice(["compute", "dp", "send", "recv", "tp"], n),
        # coarse start times: ties inside a stream keep their order in both constructions
        "start_ns": rng.integers(0, 200, n).astype(float),
    }).sort("step", "rank", "start_ns")


def _edge_set(src, dst):
    return set(zip(np.asarray(src).tolist(), np.asarray(dst).tolist()))


def test_fast_stream_edges_equal_the_general_ones():
    rng = np.random.default_rng(4)
    for _ in range(5):
        ops = _ops(rng)
        key = ops.select(pl.struct("step", "rank", "stream").rank("dense"))[:, 0].to_numpy()
        expected = _edge_set(*chain_edges(key, ops["start_ns"].to_numpy()))
        got = _stream_edges(ops)
        assert _edge_set(*got) == expected and len(got[0]) == len(expected) > 0


def test_null_start_takes_the_general_path():
    rng = np.random.default_rng(5)
    ops = _ops(rng, 200).with_columns(pl.when(pl.int_range(pl.len()) == 7).then(None)
                                      .otherwise(pl.col("start_ns")).alias("start_ns"))
    key = ops.select(pl.struct("step", "rank", "stream").rank("dense"))[:, 0].to_numpy()
    assert _edge_set(*_stream_edges(ops)) == _edge_set(*chain_edges(key, ops["start_ns"].to_numpy()))
