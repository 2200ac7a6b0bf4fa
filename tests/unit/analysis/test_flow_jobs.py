"""Job recognition on a shared fabric (simulated jobs + storage/checkpoint/rendezvous traffic)."""

import polars as pl
import pytest

from rankscope.analysis.fabric.pair_graph import address_key
from rankscope.analysis.fabric.pair_traffic import pair_traffic
from rankscope.analysis.fabric.recognise import job_flows, recognise_jobs
from rankscope.analysis.strategy.flows.infer import infer_flows

sim = pytest.importorskip("rankscope.datasets.simulator")


@pytest.fixture(scope="module")
def fabric():
    cfgs = [sim.SimConfig(job="a", dp=4, pp=2, gpus_per_host=1, steps=4, seed=1),
            sim.SimConfig(job="b", dp=2, pp=2, tp=2, gpus_per_host=2, steps=4, seed=2, rank_order="tp-cp-ep-pp-dp")]
    return sim.simulate_fabric(cfgs, background=True)


def test_jobs_are_split_named_and_analysed(fabric):
    flow = pl.from_arrow(fabric.flow)
    found = recognise_jobs(flow, "fabric")
    truth = {n: sorted(t["endpoints"].values(), key=address_key) for n, t in fabric.truth["jobs"].items()}
    assert [j.name for j in found.jobs] == ["fabric-1", "fabric-2"]
    assert sorted(j.endpoints for j in found.jobs) == sorted(truth.values())
    # ordered by lowest endpoint address
    firsts = [address_key(j.endpoints[0]) for j in found.jobs]
    assert firsts == sorted(firsts)
    for j in found.jobs:
        name = next(n for n, eps in truth.items() if eps == j.endpoints)
        t = fabric.truth["jobs"][name]
        s = infer_flows(job_flows(flow, j.endpoints), one_job=True).strategy
        assert sorted(map(sorted, s.dp_groups)) == sorted(map(sorted, t["dp_groups_by_address"]))
        assert sorted(s.pp_groups) == sorted(t["pp_groups_by_address"])


def test_control_and_storage_traffic_is_counted_not_dropped(fabric):
    flow = pl.from_arrow(fabric.flow)
    found = recognise_jobs(flow, "fabric")
    q = found.quality
    assert q["control_records"] > 0 and 29500 in q["control_ports_seen"]
    assert q["records"] == flow.height
    storage = {s for b in fabric.truth["background"] for s in b.get("servers", [])}
    in_jobs = {a for j in found.jobs for a in j.endpoints}
    assert storage and not storage & in_jobs


def test_single_job_takes_the_capture_name():
    res = sim.simulate(sim.SimConfig(job="x", dp=4, pp=1, gpus_per_host=1, steps=2))
    found = recognise_jobs(pl.from_arrow(res.tables["flow"]), "cap")
    assert [j.name for j in found.jobs] == ["cap"]


def test_pairs_merge_queue_pairs_and_scale_sampling():
    f = pl.DataFrame({"exporter": ["e"] * 3, "src_addr": ["a"] * 3, "dst_addr": ["b"] * 3,
                      "src_port": [1, 2, 1], "dst_port": [4791] * 3, "size_bytes": [10, 20, 30],
                      "sampling_rate": [1, 10, 1], "start_ns": [5, 1, 9], "end_ns": [6, 3, 12]})
    p = pair_traffic(f).pairs
    assert p.height == 1 and p["bytes"][0] == 10 + 200 + 30
    assert (p["first_ns"][0], p["last_ns"][0], p["num_records"][0]) == (1, 12, 3)


def test_a_stray_small_connection_does_not_time_the_pair():
    # a 4 KB monitoring exchange at t=0 on its own ports, the pair's RoCE data from t=43
    f = pl.DataFrame({"exporter": ["e"] * 3, "src_addr": ["a"] * 3, "dst_addr": ["b"] * 3,
                      "src_port": [51989, 59960, 64363], "dst_port": [53116, 4791, 4791], "protocol": [6, 17, 17],
                      "size_bytes": [4148, 60_000_000, 60_000_000], "num_packets": [1, 15_000, 15_000],
                      "sampling_rate": [1, 1, 1], "start_ns": [0, 43, 43], "end_ns": [0, 550, 550]})
    p = pair_traffic(f).pairs
    assert (p["first_ns"][0], p["first_data_ns"][0]) == (0, 43)


def test_address_key_orders_numerically():
    assert sorted(["10.0.0.10", "10.0.0.9", "host-a"], key=address_key) == ["10.0.0.9", "10.0.0.10", "host-a"]


def test_one_job_keeps_every_rail_that_recognition_merged():
    """Rails are merged once, on the whole capture (where the rendezvous flows are); the job's own
    flows may not show what joined them. Here one rail's clock is an hour off, so its activity no
    longer lines up with the other's: alone, the flows read as two jobs and the smaller rail is left
    out; told they are one job, every address is in the strategy."""
    res = sim.simulate(sim.SimConfig(job="r", dp=4, pp=2, tp=2, gpus_per_host=2, steps=4, seed=5,
                                     rank_order="tp-cp-ep-pp-dp"))
    flow = pl.from_arrow(res.tables["flow"])
    rail1 = pl.col("src_addr").str.starts_with("10.1.")
    flow = flow.with_columns(pl.when(rail1).then(pl.col(c) + 3_600_000_000_000).otherwise(pl.col(c)).alias(c)
                             for c in ("start_ns", "end_ns"))
    addrs = set(flow["src_addr"].to_list()) | set(flow["dst_addr"].to_list())
    assert any(a.startswith("10.1.") for a in addrs) and any(a.startswith("10.0.") for a in addrs)
    alone = infer_flows(flow)
    assert alone.quality.get("endpoints_outside_main_job", 0) > 0
    s = infer_flows(flow, one_job=True).strategy
    inside = {a for g in s.dp_groups for a in g}
    truth = {a for g in res.truth["dp_groups_by_address"] for a in g}
    assert inside == truth
    assert sorted(map(sorted, s.dp_groups)) == sorted(map(sorted, res.truth["dp_groups_by_address"]))
