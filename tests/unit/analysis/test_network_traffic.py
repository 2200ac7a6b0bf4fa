"""The network view on a small hand-built job: topology input, expected links and the pair kinds."""

import polars as pl
import pytest

from rankscope.analysis.network import (
    expected_traffic,
    infer_topology,
    read_topology,
    traffic_findings,
    traffic_section,
)
from rankscope.analysis.report import Strategy
from rankscope.collectors.errors import UsageError

# DP 4 x PP 2: pipeline i is (s0_i, s1_i); DP rings per stage
S0 = [f"10.0.0.{i}" for i in range(1, 5)]
S1 = [f"10.0.1.{i}" for i in range(1, 5)]
STRATEGY = Strategy(world_size=8, dp=4, pp=2, dp_groups=[S0, S1], pp_groups=[list(p) for p in zip(S0, S1)])
LEAF = {a: f"leaf{a.split('.')[-1]}" for a in S0 + S1}  # rail-optimised: NIC i of each host on leaf i


def _flows(skip=(), extra=(), slow=(), metered_at=None, steps=4):
    """Every expected link carries 1 GB per step at 10 GB/s (slow: 2.5x longer), on its sender's leaf."""
    rows = []
    links = list(expected_traffic(STRATEGY)) + list(extra)
    for a, b in links:
        if (a, b) in skip:
            continue
        for s in range(steps):
            dur = int(0.1e9 * (2.5 if (a, b) in slow else 1.0))
            rows.append({"src_addr": a, "dst_addr": b, "exporter": (metered_at or {}).get((a, b), LEAF[a]),
                         "est_bytes": 1e9, "size_bytes": 10**9, "num_packets": 250_000, "sampling_rate": 1,
                         "is_data": True, "start_ns": s * 10**9, "end_ns": s * 10**9 + dur})
    return pl.DataFrame(rows)


def _topology(tmp_path):
    p = tmp_path / "topo.csv"
    p.write_text("endpoint,host,leaf,pod\n" + "".join(f"{a},h{a.split('.')[2]},{LEAF[a]},p0\n" for a in S0 + S1))
    return read_topology(p)


def test_expected_links_per_class():
    exp = expected_traffic(STRATEGY)
    assert exp[(S0[0], S0[1])] == {"dp"} and exp[(S0[3], S0[0])] == {"dp"}  # the ring closes
    assert exp[(S0[0], S1[0])] == {"pp_activation"} and exp[(S1[0], S0[0])] == {"pp_gradient"}
    assert (S0[0], S1[1]) not in exp
    three = Strategy(world_size=3, dp=1, pp=3, dp_groups=[["a"], ["b"], ["c"]], pp_groups=[["a", "b", "c"]])
    assert ("c", "a") not in expected_traffic(three)


def test_fault_free_job_is_all_ok(tmp_path):
    t = traffic_section(STRATEGY, _flows(), 4, _topology(tmp_path))
    assert t.evaluated and t.kinds == {"ok": 16}
    assert all(p.ratio == pytest.approx(1.0) and p.within_error for p in t.pairs)
    assert t.topology.startswith("file: ")


def test_missing_unexpected_slow_and_rerouted_are_named(tmp_path):
    odd = (S0[0], S1[2])  # a rank talking to another pipeline's stage: a misconfigured group
    flows = _flows(skip={(S0[1], S0[2])}, extra=[odd], slow={(S1[3], S1[0])},
                   metered_at={(S0[2], S1[2]): "leaf1"})
    t = traffic_section(STRATEGY, flows, 4, _topology(tmp_path))
    kind = {(p.src, p.dst): p.kind for p in t.pairs}
    assert kind[(S0[1], S0[2])] == "missing"
    assert kind[odd] == "unexpected"
    assert kind[(S1[3], S1[0])] == "slow"
    assert kind[(S0[2], S1[2])] == "rerouted"
    found = {f.kind: f for f in traffic_findings(t)}
    assert set(found) == {"traffic_missing", "traffic_unexpected", "traffic_slow", "traffic_rerouted"}
    assert found["traffic_slow"].factor == pytest.approx(2.5)
    assert found["traffic_slow"].culprit == f"{S1[3]} -> {S1[0]}"


def test_without_topology_leaves_come_from_the_exporters():
    topo = infer_topology(_flows())
    assert topo.leaf_of()[S0[1]] == "leaf2" and topo.source.startswith("inferred")
    t = traffic_section(STRATEGY, _flows(metered_at={(S0[2], S1[2]): "leaf1"}), 4)
    assert {(p.src, p.dst): p.kind for p in t.pairs}[(S0[2], S1[2])] == "ok"  # its own leaf is a guess here


def test_no_steps_gives_bytes_per_capture():
    t = traffic_section(STRATEGY, _flows(), 0)
    assert t.bytes_per == "capture" and t.kinds == {"ok": 16}


def test_no_flows_no_section():
    assert traffic_section(STRATEGY, None, 4) is None


def test_topology_file_errors_name_file_line_and_expectation(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("endpoint,host,leaf\n10.0.0.1,h,l\n")
    with pytest.raises(UsageError, match=r"t.csv.*lacks pod"):
        read_topology(p)
    p.write_text("endpoint,host,leaf,pod,spine\n10.0.0.1,h0,l0,p0,s0\n10.0.0.2,,l0,p0,\n10.0.0.1,h0,l0,p0,\n")
    topo = read_topology(p)
    assert [r[0] for r in topo.rows] == ["10.0.0.1"] and topo.rows[0][4] == "s0"
    assert any("line 3" in n and "host" in n for n in topo.notes) and any("line 4" in n for n in topo.notes)


def test_placement_shares_spans_and_crossings(tmp_path):
    p = tmp_path / "topo.csv"
    # stage 0 in pod A, stage 1 in pod B; NIC i of every host on leaf i of its pod
    p.write_text("endpoint,host,leaf,pod\n" + "".join(
        f"{a},h{a.split('.')[2]},{'AB'[int(a.split('.')[2])]}{LEAF[a]},{'AB'[int(a.split('.')[2])]}\n" for a in S0 + S1))
    from rankscope.analysis.network import network_view
    _, place, _ = network_view(STRATEGY, _flows(), 4, read_topology(p))
    share = {c.name: (c.in_leaf, c.across_leaves, c.across_pods) for c in place.classes}
    assert share["dp"] == (0.0, 1.0, 0.0)  # a ring over four leaves of one pod
    assert share["pp_activation"] == (0.0, 0.0, 1.0) and share["pp_gradient"] == (0.0, 0.0, 1.0)
    assert [(s.kind, s.pods) for s in place.groups_across_pods] == [("pipeline", ["A", "B"])] * 4
    assert [(c.pipeline, c.stage, c.src_pod, c.dst_pod) for c in place.pipeline_links_across_pods] == \
        [(i, 0, "A", "B") for i in range(4)]
    _, inferred, topo = network_view(STRATEGY, _flows(), 4)
    assert all(c.across_pods is None for c in inferred.classes) and not inferred.groups_across_pods
    assert topo.source.startswith("inferred") and "8 sending endpoints" in topo.notes[0]
