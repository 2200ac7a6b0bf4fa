"""Issue 38's simulated network faults against the traffic section: each fault's pair is the top pair of its
kind, a fault-free job has no pair of that kind, and where a fault cannot be seen the section says nothing.

The topology is the fabric's wiring plan (each NIC on its rail's leaf), as an operator's inventory gives it,
not what the exporters show: a dead link's NIC is still wired to its own leaf.
"""

import polars as pl
import pytest

from rankscope.analysis.diagnose import model_of
from rankscope.analysis.network import network_view, traffic_findings
from rankscope.analysis.network.topology import Topology
from rankscope.analysis.report import Strategy
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.job_frames import JobFrames
from rankscope.datasets.sim.realism import exporter_name
from rankscope.datasets.sim.topology import build_topology
from rankscope.datasets.simulator import SimConfig, parse_fault, simulate

TWO_RAILS = dict(dp=4, pp=2, tp=2, gpus_per_host=2, steps=3, microbatches=4)
"""two DP groups per stage (one per rail), so a rank can join the other; two NICs per host for a backup port."""
SHORT_IDLE = dict(dp=4, pp=2, gpus_per_host=1, steps=3, microbatches=4, idle_timeout_s=0.0002)
"""records cut at every pause (idle timeout 0.2 ms): a record spans one transfer, so its rate is the link's."""


def _wiring(cfg: SimConfig) -> Topology:
    topo = build_topology(cfg)
    hpp = cfg.realism.hosts_per_pod
    rows = {a: (a, topo.host_name(int(h)), exporter_name(int(r), int(h), hpp), "0", None)
            for a, h, r in zip(topo.addresses, topo.host, topo.rail)}
    return Topology(tuple(rows.values()), "file: simulator wiring plan")


def _traffic(faults=(), intended=False, **kw):
    cfg = SimConfig(job="j", faults=tuple(parse_fault(f) for f in faults), **kw)
    res = simulate(cfg)
    model = model_of(JobFrames.from_frames("fabric", flow=pl.from_arrow(res.tables["flow"])))
    s = model.strategy
    if intended:  # the declared job: the groups the job was meant to have
        t = res.truth
        s = Strategy(world_size=t["world_size"], dp=t["degrees"]["dp"], pp=t["degrees"]["pp"],
                     dp_groups=t["dp_groups_by_address"], pp_groups=t["pp_groups_by_address"])
    traffic, _, _ = network_view(s, model.flows.inference.job_flows, model.steps_section.count, _wiring(cfg))
    truth = res.truth["faults"][0]["params"] if res.truth["faults"] else None
    return traffic, truth


def _of(traffic, kind):
    return [p for p in traffic.pairs if p.kind == kind]


def test_dead_link_reroutes_the_nic_sent_traffic_through_another_leaf():
    t, truth = _traffic(["dead-link:rank=2"], **TWO_RAILS)
    nic = truth["address"]
    assert truth["rerouted_to"] != truth["exporter"]
    moved = _of(t, "rerouted")
    assert moved and moved[0].src == nic  # the top rerouted pair is the dead link's
    # every pair the NIC sends is metered at the backup leaf, and nothing else moved
    assert {p.src for p in moved} == {nic} and all(p.exporters == [truth["rerouted_to"]] for p in moved)
    assert set(t.kinds) == {"ok", "rerouted"}
    (f,) = [f for f in traffic_findings(t) if f.kind == "traffic_rerouted"]
    assert f.culprit.startswith(f"{nic} -> ")
    clean, _ = _traffic(**TWO_RAILS)
    assert set(clean.kinds) == {"ok"}


def test_misgrouped_rank_is_the_top_unexpected_pair_against_the_declared_groups():
    t, truth = _traffic(["misgrouped:rank=2"], intended=True, **TWO_RAILS)
    nic = truth["address"]
    odd = _of(t, "unexpected")
    assert odd and nic in (odd[0].src, odd[0].dst)
    assert {(p.src, p.dst) for p in odd} == {tuple(x) for x in truth["unexpected_pairs"]}
    assert {(p.src, p.dst) for p in _of(t, "missing")} == {tuple(x) for x in truth["missing_pairs"]}
    clean, _ = _traffic(intended=True, **TWO_RAILS)
    assert set(clean.kinds) == {"ok"}


def test_bad_nic_is_the_top_slow_pair_where_its_links_are_timed_alone():
    t, truth = _traffic(["bad-nic:rank=1"], **SHORT_IDLE)
    nic = truth["address"]
    slow = _of(t, "slow")
    assert slow and nic in (slow[0].src, slow[0].dst)
    assert all(nic in (p.src, p.dst) for p in slow)
    (f,) = [f for f in traffic_findings(t) if f.kind == "traffic_slow"]
    assert f.factor == pytest.approx(2.5, rel=0.05)
    # the NIC's ring is paced alike (one ring per stage): its links are not slow against each other
    assert not [p for p in slow if "dp" in p.classes]
    assert any(n.startswith("dp@0: 1 ring(s)") for n in t.slow_not_evaluated)
    clean, _ = _traffic(**SHORT_IDLE)
    assert "slow" not in clean.kinds


def test_bad_nic_is_not_named_where_the_flows_cannot_show_it():
    """Honest outcomes: (1) with the default 15 s idle timeout a pipeline record spans many microbatches and
    the compute between them, so its rate says nothing of the NIC: no slow pair. (2) With four rings of one
    stage, the bad NIC's ring is slow as a whole, every link alike: its links are named, but no endpoint is
    (each member is on two slow links), so the finding names none rather than a wrong one."""
    t, _ = _traffic(["bad-nic:rank=1"], **{**SHORT_IDLE, "idle_timeout_s": 15.0})
    assert "slow" not in t.kinds
    t, truth = _traffic(["bad-nic:rank=1"], dp=4, tp=4, gpus_per_host=4, steps=3, microbatches=4,
                        idle_timeout_s=0.0002)
    ring = next(g for g in _ring_of(truth["address"], t))
    slow = _of(t, "slow")
    assert slow and all(p.src in ring and p.dst in ring for p in slow)
    (f,) = [f for f in traffic_findings(t) if f.kind == "traffic_slow"]
    assert f.evidence["shared_endpoint"] is None


def _ring_of(address, traffic):
    ring = {address}
    for p in traffic.pairs:
        if "dp" in p.classes and (p.src in ring or p.dst in ring):
            ring |= {p.src, p.dst}
    yield ring


def test_bad_nic_is_slow_link_keyed_by_the_nic():
    """One rank per NIC: the two faults are the same physical thing, and give the same records."""
    a = simulate(SimConfig(job="j", faults=(parse_fault("bad-nic:rank=1,factor=3"),), **SHORT_IDLE))
    b = simulate(SimConfig(job="j", faults=(parse_fault("slow-link:rank=1,factor=3"),), **SHORT_IDLE))
    assert a.tables["flow"].equals(b.tables["flow"])
    assert a.truth["faults"][0]["kind"] == b.truth["faults"][0]["kind"] == "communication"


def test_fault_kinds_parse_and_bad_parameters_are_named():
    f = parse_fault("dead-link:rank=2,via=1")
    assert f.kind == "dead-link" and f.params == {"rank": 2, "via": 1} and f.verdict == "traffic_rerouted"
    assert parse_fault("misgrouped:rank=3").verdict == "traffic_unexpected"
    assert parse_fault("bad-nic:rank=1,factor=2").verdict == "communication"
    # checked against the job's topology when it is simulated
    with pytest.raises(ConfigError, match="via must be another rail"):
        simulate(SimConfig(faults=(parse_fault("dead-link:rank=0,via=0"),), **TWO_RAILS))
    with pytest.raises(ConfigError, match="backup port"):
        simulate(SimConfig(faults=(parse_fault("dead-link:rank=0"),), dp=2, gpus_per_host=1))
    with pytest.raises(ConfigError, match="another DP group"):
        simulate(SimConfig(faults=(parse_fault("misgrouped:rank=0"),), dp=4, gpus_per_host=1))


def test_a_tree_all_reduce_is_not_judged_against_a_ring():
    """NCCL's tree all-reduce sends along tree edges, not ring links: its pairs are no missing or unexpected
    traffic. Each group whose members send to more members than their ring links reach is listed, and its
    pairs are not_judged; the pipeline's pairs are still judged. The same job on rings lists no group."""
    tree, _ = _traffic(algorithm="tree", dp=8, pp=2, gpus_per_host=1, steps=3, microbatches=4)
    assert tree.dp_groups_not_ring == [0, 1]
    assert set(tree.kinds) <= {"ok", "not_judged"} and tree.kinds["not_judged"] > 0
    assert all(p.kind == "ok" for p in tree.pairs if p.classes and "dp" not in p.classes)
    assert not [f for f in traffic_findings(tree)]
    ring, _ = _traffic(algorithm="ring", dp=8, pp=2, gpus_per_host=1, steps=3, microbatches=4)
    assert ring.dp_groups_not_ring == [] and "not_judged" not in ring.kinds
