import polars as pl
import pytest

from rankscope.analysis.strategy.pipelines import order_path, p2p_votes
from rankscope.analysis.strategy.whitebox import group_families, infer_whitebox

from .wb_frames import build_job, layout


def truth(dp, pp, tp, order):
    lay = layout(dp, pp, tp, order)
    inv = {v: r for r, v in lay.items()}
    dpg = sorted(sorted(inv[(s, d, t)] for d in range(dp)) for s in range(pp) for t in range(tp))
    ppg = sorted([inv[(s, d, t)] for s in range(pp)] for d in range(dp) for t in range(tp))
    tpg = sorted(sorted(inv[(s, d, t)] for t in range(tp)) for s in range(pp) for d in range(dp))
    return dpg, ppg, tpg


@pytest.mark.parametrize("dp,pp,tp", [(2, 2, 1), (4, 1, 1), (1, 4, 1), (2, 2, 2), (2, 3, 2), (3, 2, 1)])
@pytest.mark.parametrize("order", ["dp-first", "pp-first"])
def test_groups_and_stage_order_match_the_layout(dp, pp, tp, order):
    comm, _, _ = build_job(dp=dp, pp=pp, tp=tp, order=order, steps=2, microbatches=3)
    s = infer_whitebox(comm)
    dpg, ppg, tpg = truth(dp, pp, tp, order)
    assert (s.dp, s.pp, s.tp, s.world_size) == (dp, pp, tp, dp * pp * tp)
    assert sorted(s.dp_groups) == dpg
    assert sorted(s.pp_groups) == ppg  # ordered first stage -> last
    assert sorted(s.tp_groups) == tpg
    assert s.confidence == 1.0


def test_degree_one_gives_singletons_never_empty():
    comm, _, _ = build_job(dp=4, pp=1, steps=1)
    s = infer_whitebox(comm)
    assert s.pp_groups == [[0], [1], [2], [3]]
    comm, _, _ = build_job(dp=1, pp=4, steps=1)
    s = infer_whitebox(comm)
    assert s.dp_groups == [[0], [1], [2], [3]]


def test_stage_order_follows_the_first_message_not_rank_numbers():
    # relabel ranks so the first stage has the higher rank number
    comm, _, _ = build_job(dp=1, pp=3, steps=2)
    relabel = {0: 2, 1: 0, 2: 1}
    m = pl.DataFrame({"old": list(relabel), "new": list(relabel.values())}, schema={"old": pl.Int32, "new": pl.Int32})
    comm = (comm.join(m, left_on="rank", right_on="old").drop("rank").rename({"new": "rank"})
            .join(m.rename({"new": "np"}), left_on="peer", right_on="old", how="left")
            .drop("peer").rename({"np": "peer"}))
    s = infer_whitebox(comm)
    assert s.pp_groups == [[2, 0, 1]]


def test_world_group_is_not_taken_for_data_parallel():
    comm, _, _ = build_job(dp=2, pp=2, steps=1)
    world = pl.DataFrame([dict(job="j", rank=r, op="barrier", group_ranks=[0, 1, 2, 3], start_ns=1, end_ns=2,
                               seq=0, state="completed") for r in range(4)],
                         schema_overrides={"group_ranks": pl.List(pl.Int32), "rank": pl.Int32})
    comm = pl.concat([comm, world], how="diagonal_relaxed")
    s = infer_whitebox(comm)
    assert sorted(s.dp_groups) == [[0, 1], [2, 3]]


def test_order_path_flags_unconfirmed_direction():
    order, ok = order_path([5, 6], {(5, 6): 1.0, (6, 5): -1.0})
    assert order == [5, 6] and ok
    order, ok = order_path([5, 6], {})
    assert not ok


def test_group_families_counts_calls_per_member():
    comm, _, _ = build_job(dp=2, pp=1, steps=3)
    g = group_families(comm)
    assert g.height == 1 and g["calls"][0] == 6.0  # 2 buckets x 3 steps
    assert p2p_votes(comm) == {}


def test_empty_input_is_not_evaluated():
    comm, _, _ = build_job(dp=2, pp=1, steps=1)
    s = infer_whitebox(comm.head(0))
    assert s.evaluated is False and s.confidence == 0.0


def test_without_member_lists_the_calls_places_are_not_read():
    """Collectives that name no members (OSDI'25 traces): the pass spans change nothing, so they are skipped."""
    from rankscope.analysis.strategy.call_positions import pass_spans

    comm, comp, _ = build_job(dp=2, pp=2)
    bare = comm.with_columns(pl.lit(None, dtype=comm.schema["group_ranks"]).alias("group_ranks"))
    assert group_families(bare).height == 0
    spans = pass_spans(comp)
    assert infer_whitebox(bare, passes=spans) == infer_whitebox(bare, passes=None)
    assert infer_whitebox(comm, passes=spans).dp == 2
