"""Simulated MoE jobs with expert parallelism carved out of DP (SimConfig.ep_in_dp)."""

import polars as pl
import pytest

from rankscope.analysis.fabric.recognise import job_flows, recognise_jobs
from rankscope.analysis.strategy.flows.infer import infer_flows
from rankscope.analysis.strategy.whitebox import infer_whitebox
from rankscope.collectors.errors import ConfigError
from rankscope.datasets.sim.job_config import SimConfig
from rankscope.datasets.simulator import simulate


def _sets(gs):
    return sorted(sorted(map(str, g)) for g in gs)


@pytest.fixture(scope="module")
def moe():
    cfg = SimConfig(job="moe", dp=3, ep=3, pp=2, tp=2, gpus_per_host=2, ep_in_dp=True, steps=4,
                    microbatches=4, layers=4, hidden=1024, seed=3)
    return simulate(cfg)


def test_truth_and_records_follow_megatron(moe):
    t = moe.truth
    assert t["degrees"]["dp"] == 9 and t["degrees"]["ep"] == 3 and t["world_size"] == 36
    # every EP group lies inside one DP group; an expert-DP group holds one member of each of its EP groups
    dp_of = {r: i for i, g in enumerate(t["dp_groups"]) for r in g}
    ep_of = {r: i for i, g in enumerate(t["ep_groups"]) for r in g}
    assert all(len({dp_of[r] for r in g}) == 1 for g in t["ep_groups"] + t["expert_dp_groups"])
    assert all(len({ep_of[r] for r in g}) == len(g) == 3 for g in t["expert_dp_groups"])
    comm = pl.from_arrow(moe.tables["comm_op"])
    a2a = comm.filter(pl.col("op") == "all_to_all")
    # a dispatch and a combine per layer (2 per stage here), pass (2) and microbatch (4), per step
    assert a2a.filter((pl.col("rank") == 0) & (pl.col("step") == 0)).height == 2 * 2 * 2 * 4
    assert a2a["size_bytes"].n_unique() > a2a.height // 2  # routing: sizes change per call
    dense = comm.filter(pl.col("op") == "all_reduce").group_by("group_ranks").len()
    sizes = sorted({len(g) for g in dense["group_ranks"].to_list()})
    assert sizes == [2, 3, 9]  # TP, expert-DP, dense DP


def test_flows_and_comm_op_give_dp_and_ep(moe):
    t = moe.truth
    flow = pl.from_arrow(moe.tables["flow"])
    (job,) = recognise_jobs(flow, "fabric").jobs
    s = infer_flows(job_flows(flow, job.endpoints), one_job=True).strategy
    assert (s.dp, s.pp, s.ep) == (9, 2, 3)
    assert _sets(s.dp_groups) == _sets(t["dp_groups_by_address"])
    assert _sets(s.ep_groups) == _sets(t["ep_groups_by_address"])
    wb = infer_whitebox(pl.from_arrow(moe.tables["comm_op"]))
    assert (wb.dp, wb.pp, wb.tp, wb.ep) == (9, 2, 2, 3)
    assert _sets(wb.dp_groups) == _sets(t["dp_groups"]) and _sets(wb.ep_groups) == _sets(t["ep_groups"])


def test_ep_in_dp_needs_ep():
    with pytest.raises(ConfigError):
        SimConfig(dp=2, ep=1, ep_in_dp=True)
