"""_prepare keeps one row per (source, rank, group, seq, op): the most advanced state, when a rank is dumped twice."""
import polars as pl

from rankscope.analysis.hangs import _prepare, _state_order


def _comm(rows):
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "op": pl.String, "group_id": pl.String,
                                      "group_ranks": pl.List(pl.Int32), "peer": pl.Int32, "size_bytes": pl.Int64,
                                      "dtype": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                      "state": pl.String, "seq": pl.Int64, "step": pl.Int64, "source": pl.String,
                                      "microbatch": pl.Int32})


def _base(group_ranks):
    """The fields every row of these tests shares: one all_reduce of the group."""
    return dict(op="all_reduce", group_id="g", group_ranks=group_ranks, peer=None, size_bytes=4, dtype="f32",
                step=0, source="hook", microbatch=None)


def test_duplicate_dump_keeps_the_completed_row_and_keys_are_spelled_once():
    base = _base([1, 0])
    df, members = _prepare(_comm([
        {**base, "rank": 0, "start_ns": 5, "end_ns": None, "state": "pending", "seq": 1},
        {**base, "rank": 0, "start_ns": 5, "end_ns": 9, "state": "completed", "seq": 1},
        {**base, "rank": 1, "start_ns": 6, "end_ns": 9, "state": "completed", "seq": 1},
        {**base, "op": "send", "group_ranks": None, "peer": 1, "rank": 0, "start_ns": 10, "end_ns": 11,
         "state": "completed", "seq": 2},
        {**base, "op": "recv", "group_ranks": None, "peer": 0, "rank": 1, "start_ns": 10, "end_ns": 11,
         "state": "completed", "seq": 2},
    ]))
    assert df.height == 4
    assert df.filter(pl.col("rank") == 0, pl.col("seq") == 1)["state"].to_list() == ["completed"]
    assert set(df["_gkey"].to_list()) == {"ranks 0,1", "p2p 0->1"}
    # members are kept once per key, not per op
    assert dict(members.iter_rows()) == {"ranks 0,1": [0, 1], "p2p 0->1": [0, 1]}
    assert "_members" not in df.columns and "group_ranks" not in df.columns
    assert "microbatch" not in df.columns  # only the columns the section reads are carried


def test_no_duplicates_keeps_every_row_and_state_order_sorts_them():
    base = _base([0, 1])
    df, _ = _prepare(_comm([
        {**base, "rank": 0, "start_ns": 7, "end_ns": None, "state": "pending", "seq": 3},
        {**base, "rank": 1, "start_ns": 6, "end_ns": 9, "state": "completed", "seq": 3},
        {**base, "rank": 0, "start_ns": 2, "end_ns": 3, "state": "completed", "seq": 2},
    ]))
    # every row kept, in input order (no copy); the stuck-point report reads them in state order
    assert df["start_ns"].to_list() == [7, 6, 2]
    assert _state_order(df)["start_ns"].to_list() == [2, 6, 7]


def test_most_advanced_is_the_ordered_de_duplication_or_the_frame_itself():
    from rankscope.analysis.hangs import _most_advanced

    key = ["source", "rank", "_gkey", "seq", "op"]
    df = pl.DataFrame({"source": ["h"] * 5, "rank": [0, 0, 1, 0, 1], "_gkey": ["g"] * 5, "seq": [1, 1, 1, 2, 1],
                       "op": ["ar"] * 5, "_state_rank": [1, 3, 2, 1, 3], "start_ns": [5, 7, 6, 2, 6],
                       "x": ["a", "b", "c", "d", "e"]})
    expected = _state_order(df).unique(key, keep="first", maintain_order=True)
    assert _most_advanced(df, key).equals(expected)
    distinct = df.filter(pl.col("x").is_in(["a", "c", "d"]))
    assert _most_advanced(distinct, key) is distinct  # no exact duplicate: kept as is, unsorted
