"""Where collectives sit tells TP from DP: inside forward and backward passes, or after the last backward."""

import polars as pl

from rankscope.analysis.strategy.call_positions import pass_spans, position_role, with_pass
from rankscope.analysis.strategy.whitebox import infer_whitebox


def _comm(rows):
    return pl.DataFrame([{"op": "all_reduce", "peer": None, "size_bytes": 4096, "microbatch": None, **r} for r in rows],
                        schema_overrides={"group_ranks": pl.List(pl.Int32), "peer": pl.Int32,
                                          "microbatch": pl.Int32, "rank": pl.Int32})


def _spans(ranks, passes):
    return pl.DataFrame([{"rank": r, "category": c, "start_ns": s, "end_ns": e, "name": c}
                         for r in ranks for c, s, e in passes])


ONE_STEP = (("forward", 0, 100), ("backward", 100, 300), ("optimizer", 310, 320))


def test_a_lone_family_inside_forward_and_backward_is_tp_outside_is_dp():
    ranks = list(range(4))
    tp_rows = [{"rank": r, "group_ranks": ranks, "start_ns": t, "end_ns": t + 5} for r in ranks for t in (10, 50, 150)]
    spans = pass_spans(_spans(ranks, ONE_STEP))
    s = infer_whitebox(_comm(tp_rows), passes=spans)
    assert (s.tp, s.dp, s.tp_groups) == (4, 1, [ranks])
    # without the passes, one family of one step has no yardstick: it was read as data parallel
    assert infer_whitebox(_comm(tp_rows)).dp == 4
    dp_rows = [{"rank": r, "group_ranks": ranks, "start_ns": 305, "end_ns": 308} for r in ranks]
    s = infer_whitebox(_comm(dp_rows), passes=spans)
    assert (s.dp, s.tp) == (4, 1)


def test_two_families_are_placed_by_position_not_by_how_often():
    # TP [0,1],[2,3] reduce in forward and backward; DP [0,2],[1,3] reduce after the backward, and more often
    rows = [{"rank": r, "group_ranks": g, "start_ns": t, "end_ns": t + 2}
            for g in ([0, 1], [2, 3]) for r in g for t in (10, 150)]
    rows += [{"rank": r, "group_ranks": g, "start_ns": t, "end_ns": t + 1}
             for g in ([0, 2], [1, 3]) for r in g for t in (301, 303, 305, 307)]
    s = infer_whitebox(_comm(rows), passes=pass_spans(_spans(range(4), ONE_STEP)))
    assert sorted(s.tp_groups) == [[0, 1], [2, 3]] and sorted(s.dp_groups) == [[0, 2], [1, 3]]


def test_fsdp_gathers_in_forward_are_not_tensor_parallel():
    counts = {"n_fwd_reduce": 0, "n_fwd": 4, "n_bwd": 8, "n_placed": 12}
    assert position_role(counts) is None
    assert position_role({"n_fwd_reduce": 2, "n_fwd": 2, "n_bwd": 2, "n_placed": 4}) == "tp"
    assert position_role({"n_fwd_reduce": 0, "n_fwd": 0, "n_bwd": 3, "n_placed": 4}) == "dp"
    assert position_role({"n_fwd_reduce": 0, "n_fwd": 0, "n_bwd": 0, "n_placed": 0}) is None


def test_calls_of_ranks_without_spans_are_not_placed():
    comm = _comm([{"rank": 0, "group_ranks": [0, 1], "start_ns": 10, "end_ns": 11},
                  {"rank": 1, "group_ranks": [0, 1], "start_ns": 10, "end_ns": 11},
                  {"rank": 0, "group_ranks": [0, 1], "start_ns": 200, "end_ns": 201}])
    out = with_pass(comm, pass_spans(_spans([0], (("forward", 0, 100),))))
    assert out["_pass"].to_list() == ["forward", None, "outside"]
