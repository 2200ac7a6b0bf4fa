"""The placement audit's proposal: a local search over the job's own hosts, and its replayed step time,
checked against a re-simulation of the job with the proposed mapping."""

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.network.proposal import host_units, local_search
from rankscope.analysis.network.topology import Topology


def _topo(rows):
    return Topology(tuple((e, h, f"{p}-leaf", p, None) for e, h, p in rows), "test")


def test_local_search_puts_a_pipeline_that_alternates_pods_back_in_two():
    # pipeline a -> b -> c -> d, one endpoint per host, stages alternating between pods p0 and p1
    topo = _topo([("a", "h0", "p0"), ("b", "h1", "p1"), ("c", "h2", "p0"), ("d", "h3", "p1")])
    links = [("a", "b"), ("b", "c"), ("c", "d")]
    pair_bytes = {(x, y): 10.0 for x, y in links} | {(y, x): 10.0 for x, y in links}
    units = host_units(topo, {"a", "b", "c", "d"})
    pod = {h: es and topo.column("pod")[es[0]] for h, es in units.items()}
    found = local_search(units, pod, pair_bytes)
    assert found.cross_before == 60.0 and found.cross_after == 20.0  # three crossing links down to one
    new_pod = {e: topo.column("pod")[found.moves.get(e, e)] for e in "abcd"}
    assert sum(new_pod[x] != new_pod[y] for x, y in links) == 1
    assert sorted(found.moves) == sorted(found.moves.values())  # a permutation of the job's own places


def test_local_search_moves_whole_hosts_of_equal_size_only():
    # h0 holds two endpoints, h1 and h2 one each: h0 can swap with no one; h1 <-> h2 fixes the pair
    topo = _topo([("a1", "h0", "p0"), ("a2", "h0", "p0"), ("b", "h1", "p1"), ("c", "h2", "p0"),
                  ("d", "h3", "p1")])
    pair_bytes = {("a1", "b"): 5.0, ("b", "d"): 1.0}
    units = host_units(topo, {"a1", "a2", "b", "c", "d"})
    found = local_search(units, {h: topo.column("pod")[es[0]] for h, es in units.items()}, pair_bytes)
    assert set(found.moves) == {"b", "c"} and found.cross_after == 1.0


def test_one_pod_or_nothing_to_gain_is_not_evaluated():
    from rankscope.analysis.network.placement import placement_section
    from rankscope.analysis.report import Strategy

    s = Strategy(world_size=2, dp=1, pp=2, dp_groups=[["a"], ["b"]], pp_groups=[["a", "b"]])
    obs = pl.DataFrame({"src": ["a", "b"], "dst": ["b", "a"], "observed": [1.0, 1.0]})
    flows = pl.DataFrame({"src_addr": ["a"], "dst_addr": ["b"], "start_ns": [0], "end_ns": [10], "size_bytes": [1]})
    one = placement_section(s, obs, _topo([("a", "h0", "p0"), ("b", "h1", "p0")]), flows, 1)
    assert not one.proposal.evaluated and "one pod" in one.proposal.why
    two = placement_section(s, obs, _topo([("a", "h0", "p0"), ("b", "h1", "p1")]), flows, 1)
    assert not two.proposal.evaluated and "no swap" in two.proposal.why
    assert placement_section(s, obs, _topo([("a", "h0", "p0"), ("b", "h1", "p1")])).proposal is None


HPP = 4


def _cfg(host_map, idle_timeout_s=1e-5):
    from rankscope.datasets.simulator import Realism, SimConfig

    # DP 4 x PP 4 on 8 hosts of 2 GPUs, 4 hosts per pod; pod uplinks at 1/8 of the NIC rate. Short idle
    # timeout: one flow record per transfer (the replay needs transfers, not whole-second aggregates)
    return SimConfig(job="j", dp=4, pp=4, gpus_per_host=2, steps=6, microbatches=8, hidden=1024, layers=8,
                     seq_len=1024, host_map=host_map, pod_uplink_gbps=50.0, idle_timeout_s=idle_timeout_s,
                     realism=Realism(hosts_per_pod=HPP))


def _host(addr: str) -> int:
    o = addr.split(".")
    return int(o[2]) * 250 + int(o[3]) - 1


def _topology_file(res, path):
    from rankscope.analysis.network import read_topology

    ends = sorted({a for g in res.truth["dp_groups_by_address"] for a in g})
    rows = [f"{a},host{_host(a)},p{_host(a) // HPP}-r{a.split('.')[1]},p{_host(a) // HPP}\n" for a in ends]
    path.write_text("endpoint,host,leaf,pod\n" + "".join(rows))
    return read_topology(path)


def test_bad_mapping_proposal_is_confirmed_by_a_resimulation(tmp_path):
    from rankscope.analysis.diagnose import DiagnoseConfig, analyze_job
    from rankscope.collectors.job_frames import JobFrames
    from rankscope.datasets.simulator import simulate

    bad = (0, 1, 4, 5, 2, 3, 6, 7)  # stage s on hosts of pod s % 2: every pipeline link crosses pods
    res = simulate(_cfg(bad))
    frames = JobFrames.from_frames("j", flow=pl.from_arrow(res.tables["flow"]))
    d, _ = analyze_job(frames, DiagnoseConfig(topology=_topology_file(res, tmp_path / "topo.csv")))
    p = d.placement.proposal
    assert p.evaluated, p.why
    assert p.reduction >= 0.2 and p.proposed_across_pods_bytes <= 0.8 * p.across_pods_bytes
    assert {c.name: c.across_pods for c in d.placement.classes}["pp_activation"] == pytest.approx(1.0)
    # the rates are the job's own: in-pod near the NIC's 400 Gbit/s, across pods near the uplink's 50
    assert 0.8 < p.rate_in_pod * 8 / 400e9 < 1.05 and 0.8 < p.rate_across_pods * 8 / 50e9 < 1.05
    move = {_host(m.endpoint): _host(m.takes_place_of) for m in p.moves}
    again = simulate(_cfg(tuple(move.get(h, h) for h in bad)))
    before, after = np.median(res.truth["step_times_ns"]), np.median(again.truth["step_times_ns"])
    assert abs(p.proposed_step_ns / after - 1) <= 0.05
    assert abs(p.gain - (1 - after / before)) <= 0.05


def test_records_that_merge_a_steps_transfers_leave_the_proposal_unknown(tmp_path):
    """An exporter whose idle timeout outlasts the gaps merges a pipeline link's transfers and the compute
    between into one record: its duration is no transfer time, so no step time is predicted from it."""
    from rankscope.analysis.diagnose import DiagnoseConfig, analyze_job
    from rankscope.collectors.job_frames import JobFrames
    from rankscope.datasets.simulator import simulate

    bad = (0, 1, 4, 5, 2, 3, 6, 7)
    res = simulate(_cfg(bad, idle_timeout_s=1.0))
    frames = JobFrames.from_frames("j", flow=pl.from_arrow(res.tables["flow"]))
    d, _ = analyze_job(frames, DiagnoseConfig(topology=_topology_file(res, tmp_path / "topo.csv")))
    p = d.placement.proposal
    assert not p.evaluated and "merge a pipeline link's transfers" in p.why
