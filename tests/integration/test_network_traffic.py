"""The traffic section on the outside validation corpus (../shared/validation), read in place.

The topology file is built here from the address plan the corpus README gives (NIC of host h, GPU g is
10.<h//32>.<h>.<g+1>; leaf (pod, rail g)), not copied. Fault-free captures: every expected pair is seen
and matches its expected bytes within the sampling error, and nothing is missing, unexpected or rerouted.
V5 (one NIC at 1/2.5 rate): the costliest slow pair is on that NIC, and the slow finding names it.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VALIDATION = (ROOT / ".." / "shared" / "validation").resolve()
FAULT_FREE = ["V1-128-pp4-dp4", "V2-256-dp-first-zero", "V3-128-pure-pp", "V4-256-pure-dp", "V6-512-twojobs-sampled",
              "V7-256-moe"]

pytestmark = pytest.mark.skipif(not (VALIDATION / "flows").is_dir(), reason="../shared/validation is not present")


def address_plan_topology(addresses) -> str:
    """The corpus's address plan as a topology CSV: 10.<pod>.<host>.<gpu+1>, leaf (pod, rail gpu)."""
    lines = ["endpoint,host,leaf,pod"]
    for a in sorted(addresses):
        _, pod, host, nic = a.split(".")
        lines.append(f"{a},host{host},pod{pod}-rail{int(nic) - 1},pod{pod}")
    return "\n".join(lines) + "\n"


def _cli(*args):
    code = "import sys; from rankscope.cli.main import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=900)


def _reports(case, tmp_path):
    truth = json.loads((VALIDATION / "flows" / case / "truth.json").read_text())
    addresses = {a for j in truth["jobs"] for g in j["dp_groups_ip"] for a in g}
    topo = tmp_path / "topo.csv"
    topo.write_text(address_plan_topology(addresses))
    store, out = tmp_path / "store", tmp_path / "out"
    r = _cli("ingest", "--store", str(store), "--job", "cap", "-q", str(VALIDATION / "flows" / case / "flows.ipfix"))
    assert r.returncode == 0, r.stderr
    r = _cli("analyze", "--store", str(store), "--out-dir", str(out), "--no-html", "--topology", str(topo))
    assert r.returncode == 0, r.stderr
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


@pytest.mark.parametrize("case", FAULT_FREE)
def test_fault_free_capture_matches_expected_traffic(case, tmp_path):
    for rep in _reports(case, tmp_path):
        t = rep["traffic"]
        assert t["evaluated"], t.get("why")
        assert t["topology"].startswith("file: ")
        assert set(t["kinds"]) == {"ok"}, t["kinds"]
        for c in t["classes"]:
            assert c["seen"] == c["pairs"] == c["within_error"], c
        assert rep["data_quality"]["flows"]["topology"]["source"] == t["topology"]


def test_slow_nic_is_the_top_slow_pair(tmp_path):
    (rep,) = _reports("V5-384-slowlink", tmp_path)
    t = rep["traffic"]
    slow = [p for p in t["pairs"] if p["kind"] == "slow"]
    assert slow and "10.0.30.4" in (slow[0]["src"], slow[0]["dst"])
    assert slow[0]["rate"] < 0.5 * slow[0]["peer_rate"]
    (f,) = [f for f in rep["findings"] if f["kind"] == "traffic_slow"]
    assert f["evidence"]["shared_endpoint"] == "10.0.30.4"
    # the verdict's culprit stays first (the scorer reads findings[0])
    assert rep["findings"][0]["kind"] != "traffic_slow" or len(rep["findings"]) == 1


def test_placement_of_a_job_over_two_pods(tmp_path):
    """V5 spans pods 0 and 1 (48 hosts of 32 per pod): the truth's groups and pipelines that span pods,
    and the DP ring links that cross, are counted here from the truth and the address plan."""
    truth = json.loads((VALIDATION / "flows" / "V5-384-slowlink" / "truth.json").read_text())["jobs"][0]
    (rep,) = _reports("V5-384-slowlink", tmp_path)
    pl_ = rep["placement"]
    assert pl_["evaluated"] and pl_["unplaced"] == 0

    def pod(a):
        return a.split(".")[1]

    spans = {tuple(sorted(g)) for g in truth["dp_groups_ip"] if len({pod(a) for a in g}) > 1}
    got = {tuple(sorted(rep["strategy"]["dp_groups"][s["index"]])) for s in pl_["groups_across_pods"]
           if s["kind"] == "dp"}
    assert got == spans and spans
    pipes = [p for p in truth["pp_groups_ip"] if len({pod(a) for a in p}) > 1]
    assert len([s for s in pl_["groups_across_pods"] if s["kind"] == "pipeline"]) == len(pipes)
    crossing = sum(pod(p[i]) != pod(p[i + 1]) for p in truth["pp_groups_ip"] for i in range(len(p) - 1))
    assert len(pl_["pipeline_links_across_pods"]) == crossing
    # ring links in DP-rank order: a ring over both pods crosses twice; every DP link carries the same bytes
    # per stage, so the cross-pod share is the crossing links' share of the ring links
    links = [(g[i], g[(i + 1) % len(g)]) for g in truth["dp_groups_ip"] for i in range(len(g))]
    want = sum(pod(a) != pod(b) for a, b in links) / len(links)
    (dp,) = [c for c in pl_["classes"] if c["name"] == "dp"]
    assert abs(dp["across_pods"] - want) < 0.02
    assert dp["in_leaf"] + dp["across_leaves"] + dp["across_pods"] == pytest.approx(1.0)


def test_edited_v1_records_name_the_edited_pair_first(tmp_path):
    """V1's records with three edits (not simulator faults: the records are changed after the fact): one
    ring link's records dropped (a dead link), another's metered at a leaf of another rail (its traffic
    rerouted), and one stage-0 NIC sending a ring's worth to another ring's member (a misplaced rank).
    Each edited pair is the first of its kind, and nothing else is flagged."""
    import polars as pl

    from rankscope.analysis.diagnose import model_of
    from rankscope.analysis.network import network_view, read_topology
    from rankscope.analysis.runner import plan_jobs
    from rankscope.analysis.runner.plan import load_planned
    from rankscope.collectors.store import Store

    case = "V1-128-pp4-dp4"
    truth = json.loads((VALIDATION / "flows" / case / "truth.json").read_text())["jobs"][0]
    topo = tmp_path / "topo.csv"
    topo.write_text(address_plan_topology({a for g in truth["dp_groups_ip"] for a in g}))
    r = _cli("ingest", "--store", str(tmp_path / "st"), "--job", "cap", "-q", str(VALIDATION / "flows" / case / "flows.ipfix"))
    assert r.returncode == 0, r.stderr
    store = Store(tmp_path / "st")
    model = model_of(load_planned(store, plan_jobs(store)[0]))
    flows, s = model.flows.inference.job_flows, model.strategy
    dead = (s.dp_groups[0][0], s.dp_groups[0][1])
    moved = (s.dp_groups[1][1], s.dp_groups[1][2])
    odd_src, odd_dst = s.dp_groups[2][0], s.dp_groups[3][1]
    other_rail = flows.filter(pl.col("src_addr") == s.dp_groups[2][0])["exporter"][0]
    is_pair = lambda p: (pl.col("src_addr") == p[0]) & (pl.col("dst_addr") == p[1])  # noqa: E731
    extra = flows.filter(is_pair((s.dp_groups[2][0], s.dp_groups[2][1]))).with_columns(dst_addr=pl.lit(odd_dst))
    edited = pl.concat([flows.filter(~is_pair(dead)).with_columns(
        exporter=pl.when(is_pair(moved)).then(pl.lit(other_rail)).otherwise(pl.col("exporter"))), extra])
    traffic, _, _ = network_view(s, edited, model.steps_section.count, read_topology(topo))
    first = {}
    for p in traffic.pairs:
        first.setdefault(p.kind, (p.src, p.dst))
    assert first["missing"] == dead and first["rerouted"] == moved and first["unexpected"] == (odd_src, odd_dst)
    assert traffic.kinds == {"ok": traffic.pairs_total - 3, "missing": 1, "rerouted": 1, "unexpected": 1}
