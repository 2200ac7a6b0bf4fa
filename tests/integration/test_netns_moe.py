"""REAL Mixture-of-Experts job: gloo in network namespaces with softflowd, expert parallelism carved out of DP.

``tests/jobs/train_dp_pp.py --ep 3`` on nine namespaces (one rank each, dp=9, pp=1): every forward and
backward pass of every microbatch does a dispatch and a combine ``dist.all_to_all_single`` among its EP
group (three consecutive DP ranks) with token counts that change per call; dense gradients are
all-reduced over the DP group of nine, the expert layer's over the expert-DP groups of three (the same
position in every EP group). The rankscope hook is attached to every rank (``rankscope attach``'s
environment) and torch.profiler writes Kineto traces, so one run gives every side:

- from the flows alone: one job, its DP group, ``ep`` = 3 and the three EP groups as address sets;
- from the hook's comm_op records: the same, by rank, and the expert-DP all_reduce taken for neither DP
  nor TP;
- from the Kineto traces (gloo: no process group named, each call timed at its launch): the EP groups
  from the drift of the ranks' all_to_all launches, exact or not claimed, never wrong.

Run under the integration lock (network namespaces, torchrun).
"""

from __future__ import annotations

import os

import pytest

from tests.integration.netns_job import netns_skip_reason, run_placed_netns_job

pytestmark = [pytest.mark.netns, pytest.mark.torchjob, pytest.mark.slow]

DP, EP = 9, 3


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    from rankscope.cli.commands.attach import attach_env
    from rankscope.collectors.hooks.hook_config import HookConfig

    work = tmp_path_factory.mktemp("moe")
    hooks = work / "hooks"
    env = attach_env(HookConfig(store=str(hooks), job="moe", flush_interval_s=0.5))
    saved = dict(os.environ)
    os.environ.update(env)  # the namespaced ranks inherit the hook's bootstrap and config
    try:
        res = run_placed_netns_job(work, nodes=DP, pp=1, steps=4, hidden=256, microbatch_size=32,
                                   job_args=("--ep", str(EP), "--microbatches", "4", "--profile", str(work / "prof")),
                                   timeout_s=400)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return res, hooks, work / "prof"


def _truth(res):
    out = next(iter(res.ranks.values()))
    addr_of = {r: a for a, rs in res.address_ranks.items() for r in rs}
    return out, addr_of


def test_flows_give_the_dp_group_and_ep(moe):
    from rankscope.analysis.fabric.config import FlowConfig
    from rankscope.analysis.strategy.flows.infer import infer_flows
    from rankscope.collectors.store import Store

    res, _, _ = moe
    out, addr_of = _truth(res)
    assert out["ep"] == EP and len(out["ep_groups"]) == DP // EP
    flows = Store(res.store).read("flow", res.flow_job)
    assert flows.height > 0, res.collector_output
    s = infer_flows(flows, FlowConfig.with_rendezvous(res.master_port)).strategy
    print("moe flows:", s.dp, s.pp, s.ep, s.dp_groups, s.ep_groups, s.notes, s.undecided)
    assert (s.dp, s.pp) == (DP, 1)
    assert sorted(map(sorted, s.dp_groups)) == sorted(sorted(addr_of[r] for r in g) for g in out["dp_groups"])
    assert s.ep == EP
    assert sorted(map(sorted, s.ep_groups)) == sorted(sorted(addr_of[r] for r in g) for g in out["ep_groups"])


def test_hooks_give_the_dp_group_and_ep(moe):
    from rankscope.analysis.strategy.whitebox import infer_whitebox
    from rankscope.collectors.job_frames import load_job
    from rankscope.collectors.store import Store

    res, hooks, _ = moe
    out, _ = _truth(res)
    comm = load_job(Store(hooks), "moe").comm_op
    assert comm.filter(comm["op"] == "all_to_all").height > 0
    s = infer_whitebox(comm)
    print("moe hooks:", s.dp, s.pp, s.tp, s.ep, s.dp_groups, s.ep_groups, s.notes)
    assert (s.dp, s.pp, s.tp, s.ep) == (DP, 1, 1, EP)
    assert sorted(s.dp_groups) == sorted(out["dp_groups"])
    assert sorted(s.ep_groups) == sorted(out["ep_groups"])
    assert any("expert-data-parallel" in n for n in s.notes)


def test_kineto_gives_ep_or_leaves_it_open(moe, tmp_path):
    from rankscope.analysis.strategy.whitebox import infer_whitebox
    from rankscope.collectors.importers.contract import ImportOptions
    from rankscope.collectors.ingest.files import ingest
    from rankscope.collectors.job_frames import load_job
    from rankscope.collectors.store import Store

    res, _, prof = moe
    out, _ = _truth(res)
    st = Store(tmp_path / "k")
    ingest(st, [prof], opts=ImportOptions(job="k"))
    comm = load_job(st, "k").comm_op
    assert comm.filter(comm["op"] == "all_to_all").height > 0
    s = infer_whitebox(comm)
    print("moe kineto:", s.dp, s.pp, s.tp, s.ep, s.dp_groups, s.ep_groups, s.notes, s.undecided)
    assert s.ep in (None, EP)
    if s.ep is not None:
        assert sorted(s.ep_groups) == sorted(out["ep_groups"])
    if s.dp is not None:
        assert s.dp == DP and sorted(s.dp_groups) == sorted(out["dp_groups"])
