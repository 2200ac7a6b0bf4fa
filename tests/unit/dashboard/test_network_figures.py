"""The network view: pair heatmaps whose cells are the pairs' bytes (summed when aggregated), marks on
missing and unexpected pairs, the placement tables, a proposed mapping only when there is one, and the
page and report showing the view only for a job with a traffic or placement section."""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import plotly.graph_objects as go
import polars as pl
import pytest

from rankscope.analysis.network import expected_traffic, network_view, pair_table, read_topology
from rankscope.analysis.report import Diagnosis, Strategy
from rankscope.analysis.report.strategy import EndpointMove, PlacementClass, PlacementProposal
from rankscope.dashboard.network import (
    MAX_GROUPS,
    network_figures,
    pair_matrix,
    placement_figure,
    proposal_figures,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# DP 4 x PP 2 on two hosts: stage 0 on host h0 (pod A), stage 1 on host h1 (pod B); NIC i on leaf i of its pod
S0 = [f"10.0.0.{i}" for i in range(1, 5)]
S1 = [f"10.0.1.{i}" for i in range(1, 5)]
STRATEGY = Strategy(world_size=8, dp=4, pp=2, dp_groups=[S0, S1], pp_groups=[list(p) for p in zip(S0, S1)])
DEAD = (S0[1], S0[2])  # a ring link with no traffic
ODD = (S0[0], S1[2])  # a rank talking to another pipeline's stage


def _flows(skip=(DEAD,), extra=(ODD,), steps=4) -> pl.DataFrame:
    """Every expected link carries 1 GB per step (pipeline links 0.25 GB) at 10 GB/s."""
    rows = []
    for a, b in [p for p in expected_traffic(STRATEGY) if p not in skip] + list(extra):
        size = 1e9 if a.split(".")[2] == b.split(".")[2] else 0.25e9
        for s in range(steps):
            rows.append({"src_addr": a, "dst_addr": b, "exporter": f"x{a.split('.')[-1]}", "est_bytes": size,
                         "size_bytes": int(size), "num_packets": 250_000, "sampling_rate": 1, "is_data": True,
                         "start_ns": s * 10**9, "end_ns": s * 10**9 + int(size / 10)})
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def topology(tmp_path_factory):
    p = tmp_path_factory.mktemp("topo") / "topo.csv"
    p.write_text("endpoint,host,leaf,pod\n" + "".join(
        f"{a},h{a.split('.')[2]},{'AB'[int(a.split('.')[2])]}{a.split('.')[-1]},{'AB'[int(a.split('.')[2])]}\n"
        for a in S0 + S1))
    return read_topology(p)


@pytest.fixture(scope="module")
def job(topology):
    flows = _flows()
    pairs, topo = pair_table(STRATEGY, flows, 4, topology)
    traffic, placement, _ = network_view(STRATEGY, flows, 4, topology)
    d = Diagnosis(job="net", strategy=STRATEGY, traffic=traffic, placement=placement)
    return SimpleNamespace(pairs=pairs, places=topo.frame, diagnosis=d,
                           tables={"traffic_pairs": pairs, "endpoints": topo.frame})


def test_the_pair_table_holds_every_pair_and_the_listed_ones_as_the_section_has_them(job):
    t = job.diagnosis.traffic
    assert job.pairs.height == t.pairs_total == 16 + 1  # every expected link and the unexpected one
    listed = {(p.src, p.dst): (p.kind, p.observed, p.expected) for p in t.pairs}
    for r in job.pairs.iter_rows(named=True):
        if (r["src"], r["dst"]) in listed:
            assert listed[(r["src"], r["dst"])] == (r["kind"], r["observed"], r["expected"])
    assert pair_table(STRATEGY, None, 4) is None


def test_each_cell_is_its_pairs_bytes(job):
    m = pair_matrix(job.pairs)
    assert m.level == "endpoint" and m.labels == S0 + S1 and m.expected.shape == (8, 8)
    at = {e: i for i, e in enumerate(m.labels)}
    for r in job.pairs.iter_rows(named=True):
        i, j = at[r["src"]], at[r["dst"]]
        assert m.observed[i, j] == pytest.approx(r["observed"] or 0.0)
        assert m.expected[i, j] == pytest.approx(r["expected"] or 0.0)
    assert m.observed[at[S0[0]], at[S0[1]]] == pytest.approx(1e9)  # a ring link: 1 GB per step
    assert m.expected[at[S0[1]], at[S0[0]]] == 0 and m.observed[at[S0[1]], at[S0[0]]] == 0  # no such link
    figs = network_figures(job.diagnosis, job.tables)
    heat = figs["traffic_observed"].data[0]
    assert isinstance(heat, go.Heatmap) and np.asarray(heat.z).shape == (8, 8)
    assert np.asarray(heat.customdata)[at[S0[0]], at[S0[1]]] == pytest.approx(1e9, rel=1e-6)
    assert np.asarray(heat.z)[at[S0[0]], at[S0[1]]] == pytest.approx(9.0)  # coloured on log10 bytes


def test_missing_and_unexpected_pairs_are_marked(job):
    m = pair_matrix(job.pairs)
    at = {e: i for i, e in enumerate(m.labels)}
    assert m.kinds["missing"][at[DEAD[0]], at[DEAD[1]]] == 1 and m.kinds["missing"].sum() == 1
    assert m.kinds["unexpected"][at[ODD[0]], at[ODD[1]]] == 1
    ratio = network_figures(job.diagnosis, job.tables)["traffic_ratio"]
    marks = {t.name.split()[0]: list(zip(t.x, t.y)) for t in ratio.data if isinstance(t, go.Scatter)}
    assert marks["missing"] == [(DEAD[1], DEAD[0])] and marks["unexpected"] == [(ODD[1], ODD[0])]  # (x=dst, y=src)
    heat = ratio.data[0]
    z = np.asarray(heat.z)
    assert z[at[DEAD[0]], at[DEAD[1]]] == pytest.approx(heat.zmin)  # missing: the floor of the diverging scale
    assert np.isnan(z[at[ODD[0]], at[ODD[1]]])  # nothing expected: no ratio, only the mark
    assert z[at[S0[0]], at[S0[1]]] == pytest.approx(0.0) and heat.zmid == 0  # ratio 1 sits at the centre
    assert heat.colorscale[0][1] != heat.colorscale[-1][1]


def test_aggregation_sums_bytes_by_host_and_by_block(job):
    by_host = pair_matrix(job.pairs, job.places, max_side=4)
    assert by_host.level == "host" and by_host.labels == ["h0", "h1"] and "by host (2 hosts of 8" in by_host.what
    exp, obs = job.pairs["expected"].fill_null(0), job.pairs["observed"].fill_null(0)
    assert by_host.expected.sum() == pytest.approx(exp.sum()) and by_host.observed.sum() == pytest.approx(obs.sum())
    in_h0 = job.pairs.filter(pl.col("src").is_in(S0) & pl.col("dst").is_in(S0))
    assert by_host.observed[0, 0] == pytest.approx(in_h0["observed"].fill_null(0).sum())  # the stage-0 ring
    assert by_host.observed[0, 1] == pytest.approx(5 * 0.25e9)  # four activation links and the unexpected pair
    assert by_host.ratio[0, 1] == pytest.approx(1.0)  # the unexpected bytes stay out of the ratio
    assert by_host.kinds["missing"][0, 0] == 1 and by_host.kinds["unexpected"][0, 1] == 1
    blocks = pair_matrix(job.pairs, None, max_side=4, max_groups=4)
    assert blocks.level == "block" and blocks.labels[0] == "10.0.0.1..10.0.0.2" and len(blocks.labels) == 4
    assert blocks.observed.sum() == pytest.approx(obs.sum())


def test_four_thousand_endpoints_render_by_leaf_quickly_and_small():
    def addr(r):
        h, g = divmod(r, 8)
        return f"10.{h // 32}.{h}.{g + 1}"

    dp, pp = 512, 8
    s = Strategy(world_size=4096, dp=dp, pp=pp, dp_groups=[[addr(i * dp + j) for j in range(dp)] for i in range(pp)],
                 pp_groups=[[addr(i * dp + j) for i in range(pp)] for j in range(dp)])
    pairs = pl.DataFrame([(a, b, 1e9, 1e9, "ok") for a, b in expected_traffic(s)],
                         schema=["src", "dst", "expected", "observed", "kind"], orient="row")
    places = pl.DataFrame([(addr(r), f"h{r // 8}", f"p{r // 256}-rail{r % 8}", f"p{r // 256}") for r in range(4096)],
                          schema=["endpoint", "host", "leaf", "pod"], orient="row")
    t0 = time.perf_counter()
    m = pair_matrix(pairs, places)
    from rankscope.dashboard.network import matrix_figures

    size = sum(len(f.to_json()) for f in matrix_figures(m).values())
    took = time.perf_counter() - t0
    assert m.level == "leaf" and len(m.labels) == 128 <= MAX_GROUPS  # 512 hosts are too many rows
    assert m.observed.sum() == pytest.approx(1e9 * pairs.height)
    assert size < 1_500_000 and took < 10  # about 650 kB and 0.2 s here


def test_placement_table_and_crossings(job):
    figs = network_figures(job.diagnosis, job.tables)
    cells = {c[0]: c for c in zip(*figs["placement"].data[0].cells.values)}
    assert cells["dp"][2:] == ("0.0 %", "100.0 %", "0.0 %")  # a ring over four leaves of one pod
    assert cells["pp_activation"][1:] == ("1 GB", "0.0 %", "0.0 %", "100.0 %")  # 4 links of 250 MB
    crossing = figs["crossings"].data[0].cells.values
    assert "pipeline 0 stage 0 -> 1" in crossing[0] and "A -> B" in crossing[2]
    assert "proposal_shares" not in figs  # no proposal in this report
    assert "not evaluated" in placement_figure(None).layout.annotations[0].text


def test_a_proposal_shows_beside_todays_mapping_only_when_evaluated(job):
    place = job.diagnosis.placement
    prop = PlacementProposal(evaluated=True, method="host swaps", moves=[EndpointMove(S1[0], "h1", "h0", S0[0])],
                             hosts_moved=2, across_pods_bytes=1e9, proposed_across_pods_bytes=0.0, reduction=1.0,
                             classes=[PlacementClass("pp_activation", 1e9, 1.0, 0.0, 0.0)], step_ns=2.0e8,
                             proposed_step_ns=1.5e8, gain=0.25)
    figs = proposal_figures(replace(place, proposal=prop))
    head = list(figs["proposal_shares"].data[0].header.values)
    row = dict(zip(head, [c[0] for c in figs["proposal_shares"].data[0].cells.values]))
    assert row["class"] == "pp_activation"
    assert row["across pods today"] == "100.0 %" and row["across pods proposed"] == "0.0 %"
    numbers = {r[0]: r[1:] for r in zip(*figs["proposal_numbers"].data[0].cells.values)}
    assert numbers["step ns"] == ("200.000 ms", "150.000 ms")  # today, proposed
    assert numbers["across pods bytes"] == ("1 GB", "0 B") and numbers["gain"] == ("", "25.0 %")
    moves = dict(zip(figs["proposal_moves"].data[0].header.values, figs["proposal_moves"].data[0].cells.values))
    assert list(moves["endpoint"]) == [S1[0]] and list(moves["host"]) == ["h1"] and list(moves["proposed_host"]) == ["h0"]
    assert proposal_figures(replace(place, proposal=PlacementProposal(evaluated=False, why="no pods"))) == {}
    assert proposal_figures(place) == {}  # none in this report
    assert {"proposal_shares", "proposal_moves"} <= set(network_figures(
        replace(job.diagnosis, placement=replace(place, proposal=prop)), job.tables))


def test_without_the_full_table_the_listed_pairs_are_drawn_and_said(job):
    figs = network_figures(job.diagnosis, {})
    assert set(figs) >= {"traffic_expected", "traffic_observed", "traffic_ratio", "placement", "crossings"}
    assert np.asarray(figs["traffic_observed"].data[0].z).shape == (8, 8)


def test_no_network_view_without_the_sections():
    assert network_figures(Diagnosis(job="wb", strategy=STRATEGY), {}) == {}


def test_page_and_report_show_the_network_view_only_for_a_flow_job(tmp_path):
    from rankscope.collectors.store import Store
    from rankscope.dashboard.app import JobViews, page_content
    from rankscope.dashboard.report_html import render_report
    from rankscope.datasets.sim.job_config import SimConfig
    from rankscope.datasets.simulator import simulate
    from tests.unit.dashboard.hand_store import write_hand_store

    res = simulate(SimConfig(job="sim", dp=2, pp=2, steps=3, microbatches=2, layers=2, gpus_per_host=1))
    root = tmp_path / "flows"
    Store(root).write("flow", res.tables["flow"])  # the switches' view only
    views = JobViews()
    name = next(iter(views.plan(str(root))))
    net = page_content(views, str(root), name)["network.children"]
    assert net and net[0].children == "Network"
    graphs = [g.children.id for block in net[2:] for g in (block.children if isinstance(block.children, list)
                                                            else [block])]
    assert {"net-traffic_expected", "net-traffic_observed", "net-traffic_ratio", "net-placement"} <= set(graphs)
    a = views.get(str(root), name)
    pairs = a.tables["traffic_pairs"]
    assert pairs.height == a.diagnosis.traffic.pairs_total and "endpoints" in a.tables
    m = pair_matrix(pairs, a.tables["endpoints"])
    top = a.diagnosis.traffic.pairs[0]
    assert m.observed[m.labels.index(top.src), m.labels.index(top.dst)] == pytest.approx(top.observed)
    assert 'id="net-traffic_ratio"' in render_report(a.diagnosis, a.tables)

    hand = tmp_path / "hand"
    write_hand_store(hand, steps=2)
    assert page_content(JobViews(), str(hand), "handjob")["network.children"] == []
    wb = JobViews().get(str(hand), "handjob")
    assert 'id="net-' not in render_report(wb.diagnosis, wb.tables)
    assert "traffic_pairs" not in wb.tables


def test_dashboard_topology_reaches_the_analysis(tmp_path):
    """``rankscope dashboard --topology``: every job of the process is analysed with the file's topology."""
    from rankscope.analysis.diagnose import DiagnoseConfig
    from rankscope.collectors.store import Store
    from rankscope.dashboard.analysis_source import use_config
    from rankscope.dashboard.app import JobViews
    from rankscope.datasets.sim.job_config import SimConfig
    from rankscope.datasets.simulator import simulate

    res = simulate(SimConfig(job="sim", dp=2, pp=2, steps=3, microbatches=2, layers=2, gpus_per_host=1))
    root = tmp_path / "flows"
    Store(root).write("flow", res.tables["flow"])
    flows = res.tables["flow"]
    ends = sorted(set(flows["src_addr"].to_pylist()) | set(flows["dst_addr"].to_pylist()))
    topo = tmp_path / "topo.csv"
    topo.write_text("endpoint,host,leaf,pod\n" + "".join(f"{e},h{i},l{i % 2},p{i % 2}\n" for i, e in enumerate(ends)))
    views = JobViews()
    name = next(iter(views.plan(str(root))))
    assert views.get(str(root), name).diagnosis.traffic.topology.startswith("inferred")
    try:
        use_config(DiagnoseConfig(topology=read_topology(topo)))
        a = JobViews().get(str(root), name)
        assert a.diagnosis.traffic.topology == f"file: {topo}"
        assert a.diagnosis.placement.classes and a.diagnosis.placement.classes[0].across_pods is not None
    finally:
        use_config(None)
