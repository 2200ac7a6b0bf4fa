"""White-box expert parallelism: the groups that run all_to_all, carved out of DP (Megatron)."""

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.strategy.whitebox import infer_whitebox
from rankscope.collectors.schema import conform
from rankscope.collectors.vocab import normalise_op

from .test_strategy_whitebox import truth
from .wb_frames import MS, build_job, layout


def moe_job(dp=4, pp=2, tp=1, ep=2, steps=2, microbatches=3, with_groups=True):
    """build_job's DP x PP (x TP) job plus, per microbatch, a dispatch and a combine all_to_all among
    each EP group (ep consecutive DP ranks of one stage and TP rank) with sizes that vary per call, and
    per step an all_reduce of the expert gradients over each expert-DP group (the same index in every
    EP block of one DP group)."""
    comm, _, _ = build_job(dp=dp, pp=pp, tp=tp, steps=steps, microbatches=microbatches)
    lay = layout(dp, pp, tp)
    inv = {v: r for r, v in lay.items()}
    rng = np.random.default_rng(1)
    t0 = int(comm["start_ns"].min())
    rows = []
    # each EP group leaves each call at its own time (its members' arrival): groups drift apart
    late = rng.uniform(0, MS // 4, size=(len(lay), steps, microbatches, 2))
    for r, (s, d, t) in lay.items():
        block = d // ep
        ep_group = sorted(inv[(s, block * ep + x, t)] for x in range(ep))
        edp_group = sorted(inv[(s, b * ep + d % ep, t)] for b in range(dp // ep))
        for step in range(steps):
            base = t0 + step * 100 * MS
            for mb in range(microbatches):
                for i in range(2):
                    st = base + (mb * 4 + i) * MS
                    rows.append(dict(job="j", rank=r, op="all_to_all", group_id=f"ep{ep_group[0]}" if with_groups else None,
                                     group_ranks=ep_group if with_groups else None,
                                     size_bytes=int((1 << 20) * rng.uniform(0.7, 1.3)), start_ns=st,
                                     end_ns=st + MS // 2 + int(late[ep_group[0], step, mb, i]), step=step, microbatch=mb, state="completed", source="test"))
            st = base + 90 * MS
            rows.append(dict(job="j", rank=r, op="all_reduce", group_id=f"edp{edp_group[0]}", group_ranks=edp_group,
                             size_bytes=1 << 23, start_ns=st, end_ns=st + 2 * MS, step=step, state="completed",
                             source="test"))
    extra = pl.from_arrow(conform(pl.DataFrame(rows, infer_schema_length=None), "comm_op"))
    return pl.concat([comm, extra], how="diagonal_relaxed"), lay, inv


@pytest.mark.parametrize("dp,pp,tp,ep", [(4, 2, 1, 2), (8, 1, 1, 4), (4, 2, 2, 2), (4, 1, 2, 4)])
def test_all_to_all_groups_give_ep_and_dp_stays_whole(dp, pp, tp, ep):
    comm, lay, inv = moe_job(dp=dp, pp=pp, tp=tp, ep=ep)
    s = infer_whitebox(comm)
    dpg, ppg, tpg = truth(dp, pp, tp, "dp-first")
    want_ep = sorted(sorted(inv[(st, b * ep + x, t)] for x in range(ep))
                     for st in range(pp) for t in range(tp) for b in range(dp // ep))
    assert s.ep == ep and sorted(s.ep_groups) == want_ep
    # the expert-DP all_reduce is neither the DP nor the TP family
    assert (s.dp, s.pp, s.tp) == (dp, pp, tp)
    assert sorted(s.dp_groups) == dpg and sorted(s.pp_groups) == ppg and sorted(s.tp_groups) == tpg
    if ep < dp:
        assert any("expert-data-parallel" in n for n in s.notes)


@pytest.mark.parametrize("dp,pp,tp,ep", [(4, 2, 1, 2), (8, 1, 1, 4)])
def test_all_to_all_without_group_members_gets_them_from_end_times(dp, pp, tp, ep):
    # Kineto of gloo jobs names no group; all_to_all sizes change with every call (routing)
    comm, lay, inv = moe_job(dp=dp, pp=pp, tp=tp, ep=ep, with_groups=False)
    s = infer_whitebox(comm)
    want_ep = sorted(sorted(inv[(st, b * ep + x, t)] for x in range(ep))
                     for st in range(pp) for t in range(tp) for b in range(dp // ep))
    assert s.ep == ep and sorted(s.ep_groups) == want_ep
    assert s.dp == dp and sorted(s.dp_groups) == truth(dp, pp, tp, "dp-first")[0]


def test_without_all_to_all_there_is_no_ep():
    comm, _, _ = build_job(dp=4, pp=2)
    s = infer_whitebox(comm)
    assert s.ep is None and s.ep_groups is None


@pytest.mark.parametrize("raw", ["all_to_all", "alltoall", "c10d::alltoall_", "c10d::alltoall_base_",
                                 "nccl:all_to_all", "gloo:all_to_all", "all_to_all_single", "ALLTOALL"])
def test_every_source_spelling_of_all_to_all_is_one_op(raw):
    # hooks (all_to_all_single), Kineto (c10d::alltoall_base_), flight recorder (nccl:all_to_all), NCCL logs
    assert normalise_op(raw) == "all_to_all"


def _launch_timed_a2a(groups, calls=24, seed=0):
    """all_to_all records without a group as gloo's Kineto gives them: each call timed at its launch
    (20 us), members of one EP group launching within ~0.1 ms of each other, groups on their own pace."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in groups:
        t = 1_700_000_000_000_000_000 + np.cumsum(rng.uniform(1, 6, calls) * MS).astype(np.int64)
        for r in g:
            for c, st in enumerate(t + rng.integers(0, MS // 10, calls)):
                rows.append(dict(job="j", rank=r, op="all_to_all", size_bytes=None, start_ns=int(st),
                                 end_ns=int(st) + 20_000, step=c // 8, state="completed", source="test"))
    return pl.from_arrow(conform(pl.DataFrame(rows, infer_schema_length=None), "comm_op"))


def test_launch_timed_all_to_all_gets_groups_from_launch_drift():
    from rankscope.analysis.strategy.expert_groups import all_to_all_groups_by_timing

    groups = [[0, 2, 4], [1, 3, 5], [6, 7, 8]]
    out = all_to_all_groups_by_timing(_launch_timed_a2a(groups))
    got = {tuple(sorted(g)) for g in out["group_ranks"].to_list()}
    assert got == {tuple(g) for g in groups}
    # one group only: nothing to split, nothing claimed beyond what end times say
    one = all_to_all_groups_by_timing(_launch_timed_a2a([[0, 1, 2, 3]]))
    assert {tuple(sorted(g)) for g in one["group_ranks"].drop_nulls().to_list()} <= {(0, 1, 2, 3)}
