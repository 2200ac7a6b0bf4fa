"""truth.json: groups for both rank orders, endpoints, step times, and what the records show."""

from __future__ import annotations

import polars as pl
import pytest

from rankscope.collectors.errors import ConfigError
from rankscope.datasets.sim.job_config import parse_fault
from rankscope.datasets.simulator import SimConfig, simulate

from .conftest import frames

KW = dict(dp=2, pp=2, tp=2, steps=2, microbatches=2, layers=4, flows=False, gemm_records=False)


@pytest.mark.parametrize("order,expect", [
    ("tp-cp-ep-dp-pp", {"tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
                        "pp": [[0, 4], [1, 5], [2, 6], [3, 7]]}),
    ("tp-cp-ep-pp-dp", {"tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
                        "dp": [[0, 4], [1, 5], [2, 6], [3, 7]]}),
    ("dp-tp-cp-ep-pp", {"dp": [[0, 1], [2, 3], [4, 5], [6, 7]], "tp": [[0, 2], [1, 3], [4, 6], [5, 7]],
                        "pp": [[0, 4], [1, 5], [2, 6], [3, 7]]}),
])
def test_truth_groups_for_rank_orders_match_the_records(order, expect):
    res = simulate(SimConfig(rank_order=order, **KW))
    t = res.truth
    for axis, groups in expect.items():
        assert t[f"{axis}_groups"] == groups
    assert t["ep_groups"] == [[r] for r in range(8)] and t["cp_groups"] == [[r] for r in range(8)]
    # the groups the comm_ops use are exactly the truth groups
    comm = frames(res)["comm_op"]
    for axis in ("dp", "tp", "pp"):
        used = {tuple(g) for g in comm.filter(pl.col("stream") == axis)["group_ranks"].to_list()}
        assert used == {tuple(g) for g in t[f"{axis}_groups"]}
    ep = t["endpoints"]
    assert t["pp_groups_by_address"] == [[ep[str(r)] for r in g] for g in t["pp_groups"]]
    # pipelines are ordered first stage -> last: the first member sends forward activations first
    first_send = comm.filter(pl.col("op") == "send").sort("start_ns").row(0, named=True)
    assert first_send["rank"] in [g[0] for g in t["pp_groups"]]


def test_step_times_match_step_marks():
    res = simulate(SimConfig(**KW))
    sm = frames(res)["step_mark"]
    ends = sm.group_by("step").agg(pl.col("end_ns").max()).sort("step")["end_ns"].to_list()
    start = sm["start_ns"].min()
    assert res.truth["step_times_ns"] == [ends[0] - start] + [b - a for a, b in zip(ends, ends[1:])]


def test_endpoints_hosts_and_addresses_are_rail_optimised():
    res = simulate(SimConfig(dp=4, pp=4, tp=1, steps=1, microbatches=4, layers=4, flows=False))
    ep = frames(res)["endpoint_map"]
    assert ep.height == 16 and ep["address"].n_unique() == 16
    for r in ep.iter_rows(named=True):
        host = r["rank"] // 8
        assert r["host"] == f"host{host:04d}" and r["gpu"] == r["rank"] % 8
        assert r["address"] == f"10.{r['gpu']}.0.{host + 1}"
    assert res.truth["hosts"] == {"host0000": list(range(8)), "host0001": list(range(8, 16))}


@pytest.mark.parametrize("schedule,extra", [("gpipe", {}), ("1f1b", {}), ("interleaved", {"virtual_stages": 2})])
def test_schedules_run_each_forward_before_its_backward(schedule, extra):
    res = simulate(SimConfig(dp=1, pp=4, steps=1, microbatches=4, layers=8, schedule=schedule, flows=False,
                             gemm_records=False, **extra))
    c = frames(res)["compute_op"].filter(pl.col("category").is_in(["forward", "backward"]))
    f = c.filter(pl.col("category") == "forward").select("stage", "microbatch", pl.col("end_ns").alias("fe"))
    b = c.filter(pl.col("category") == "backward").select("stage", "microbatch", pl.col("start_ns").alias("bs"))
    j = f.join(b, on=["stage", "microbatch"])
    assert j.height == 4 * 4 * (2 if schedule == "interleaved" else 1)
    assert (j["bs"] >= j["fe"]).all()
    # a later virtual stage's forward starts after the earlier one's ended (activations flow down)
    fs = f.sort("microbatch", "stage")
    starts = c.filter(pl.col("category") == "forward").select("stage", "microbatch", "start_ns")
    k = fs.with_columns(next_stage=pl.col("stage") + 1).join(
        starts, left_on=["next_stage", "microbatch"], right_on=["stage", "microbatch"])
    assert (k["start_ns"] > k["fe"]).all()


def test_parse_fault_and_bad_values():
    f = parse_fault("slow-worker:rank=5,factor=1.5")
    assert f.kind == "slow-worker" and f.params == {"rank": 5, "factor": 1.5} and f.verdict == "worker"
    assert parse_fault("gc").params == {}
    for bad in ("nope", "gc:pause", "gc:colour=red", "slow-worker:rank=5,=2"):
        with pytest.raises(ConfigError):
            parse_fault(bad)
    for kw in (dict(dp=0), dict(schedule="zigzag"), dict(rank_order="tp-dp-pp"), dict(layers=7, pp=2),
               dict(job="bad name"), dict(sampling=0)):
        with pytest.raises(ConfigError):
            SimConfig(**kw)
