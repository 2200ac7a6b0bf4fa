"""REAL reroute: a gloo DP2 x PP2 job on two leaves, one node's link to its leaf dead, its traffic via the other.

The fabric (``run_placed_netns_job(..., reroute=REROUTED)``): four namespaces, each cabled to bridge A
(leaf A) by a veth pair; bridge B (leaf B) is joined to bridge A by an inter-switch veth link. Namespace
``REROUTED`` is dual-homed: it also has a second NIC cabled to bridge B. Before the job starts its link to
leaf A goes down (the switch port down, the NIC without carrier); the namespace skips routes over a link
without carrier (``ignore_routes_with_linkdown``), so its subnet's backup route over the NIC to leaf B
carries everything it sends, with the node's own address as source. Its peers reach it through leaf A,
the inter-switch link and leaf B (ARP answers from the backup NIC). That is a dead link whose traffic
reroutes through another leaf, with the endpoint unchanged in the flow records.

Each leaf meters what enters it from its host ports (tc ``mirred`` mirrors every host port's ingress to
a port where the leaf's softflowd listens, as a switch's ingress flow metering sees it; the inter-switch
link is not metered, so nothing is counted twice). Each leaf's softflowd runs in a namespace of its own
and exports from its own management address, so the collector holds two exporters (softflowd 1.1.0's
IPFIX observation domain is always 0; the exporter's address is what tells them apart).

The topology file says what was planned: every node on leaf A, pod p0. The report's traffic section calls
a pair ``rerouted`` when it was seen at an exporter its sender's leaf does not own (leaf A's exporter is
the one that saw most of leaf A's endpoints' bytes: A's meter, three senders of four). So the pairs the
rerouted node sends are ``rerouted``, and no other pair is: its peers' traffic to it enters at leaf A,
where it is metered. The control is the same two-leaf fabric without the dead link: no ``rerouted`` pair.
"""

from __future__ import annotations

import pytest

from tests.integration.netns_job import netns_skip_reason, run_placed_netns_job

pytestmark = [pytest.mark.netns, pytest.mark.torchjob, pytest.mark.slow]

REROUTED = 2
"""the namespace (node rank) whose link to leaf A is dead; not 0, the rendezvous master."""

JOB = dict(nodes=4, pp=2, steps=4, hidden=256, microbatch_size=32, step_sleep_ms=2500,
           flow_timeouts=("tcp=1", "general=1", "maxlife=60", "expint=1"))


def _topology(res, path):
    path.write_text("endpoint,host,leaf,pod\n"
                    + "".join(f"{a},node{k},A,p0\n" for k, a in enumerate(res.address_ranks)))
    return path


def _analyse(res, tmp_path):
    from rankscope.analysis.diagnose import DiagnoseConfig, analyze_job
    from rankscope.analysis.fabric.config import FlowConfig
    from rankscope.analysis.network import read_topology
    from rankscope.analysis.runner.plan import load_planned, plan_jobs
    from rankscope.collectors.store import Store

    store = Store(res.store)
    flow = FlowConfig.with_rendezvous(res.master_port)
    topo = read_topology(_topology(res, tmp_path / "topo.csv"))
    (planned,) = [p for p in plan_jobs(store, None, None, flow) if p.kind == "capture"]
    d, _ = analyze_job(load_planned(store, planned), DiagnoseConfig(flow=flow, topology=topo))
    return d


def _run(tmp_path_factory, name, reroute):
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp(name)
    res = run_placed_netns_job(work, second_bridge=True, reroute=reroute, **JOB)
    return res, _analyse(res, work)


@pytest.fixture(scope="module")
def rerouted(tmp_path_factory):
    return _run(tmp_path_factory, "reroute", REROUTED)


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    return _run(tmp_path_factory, "reroute-control", None)


def _show(d):
    t = d.traffic
    print("strategy dp", d.strategy.dp_groups, "pp", d.strategy.pp_groups, "steps", d.steps.count)
    print("traffic", t.topology, t.kinds)
    for p in t.pairs:
        print(f"  {p.src} -> {p.dst} {p.classes} {p.kind} ratio={p.ratio} exporters={p.exporters}")
    print("findings", [(f.kind, f.culprit) for f in d.findings])


def _exporter_addr(x: str) -> str:
    return x.rsplit("/", 1)[0]


def test_rerouted_node_sends_every_pair_through_the_other_leaf(rerouted):
    res, d = rerouted
    _show(d)
    k = res.rerouted
    assert k == list(res.address_ranks)[REROUTED]
    assert d.strategy.dp == 2 and d.strategy.pp == 2, d.strategy
    t = d.traffic
    assert t.evaluated and t.topology.startswith("file: "), t
    # every exporter of the store is one of the two leaves' meters; k's sends were metered at leaf B only
    leaf_of_exporter = {a: leaf for leaf, a in res.leaf_exporters.items()}
    seen = {p.src: {leaf_of_exporter[_exporter_addr(x)] for x in p.exporters} for p in t.pairs if p.exporters}
    assert seen[k] == {"B"}, seen
    assert all(v == {"A"} for src, v in seen.items() if src != k), seen
    sent = [p for p in t.pairs if p.src == k and p.expected]
    assert sent, "the rerouted node sends no expected pair"
    assert all(p.kind == "rerouted" for p in sent), [(p.dst, p.kind) for p in sent]
    others = [p for p in t.pairs if p.src != k and p.kind == "rerouted"]
    assert not others, [(p.src, p.dst) for p in others]
    top = next(p for p in t.pairs if p.kind == "rerouted")
    assert top.src == k
    (f,) = [f for f in d.findings if f.kind == "traffic_rerouted"]
    assert f.culprit.startswith(f"{k} -> ") and f.evidence["src"] == k, f
    assert f.evidence["pairs_of_this_kind"] == len(sent)
    assert {_exporter_addr(x) for x in f.evidence["exporters"]} == {res.leaf_exporters["B"]}


def test_control_without_the_dead_link_has_no_rerouted_pair(control):
    res, d = control
    _show(d)
    assert res.rerouted is None
    assert d.strategy.dp == 2 and d.strategy.pp == 2, d.strategy
    t = d.traffic
    assert t.evaluated and t.kinds.get("rerouted", 0) == 0, t.kinds
    assert not [f for f in d.findings if f.kind == "traffic_rerouted"]
    # leaf B's meter saw none of the job: every pair was metered at leaf A
    assert all({_exporter_addr(x) for x in p.exporters} == {res.leaf_exporters["A"]}
               for p in t.pairs if p.exporters), [(p.src, p.dst, p.exporters) for p in t.pairs]
