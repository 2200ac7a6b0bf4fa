"""The Dash app's content for a job comes from the store and the analysis API, and follows a live store."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from rankscope.cli.main import main
from rankscope.dashboard.app import GRAPHS, TABLES, JobViews, create_app, page_content, strategy_summary
from tests.unit.dashboard.hand_store import write_hand_store

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def hand_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("hand") / "store"
    write_hand_store(root, steps=3)
    return root


def _content(c: dict) -> dict:
    """The page keyed by short names: version, rendered, status, band, summary, cards, each graph and table."""
    out = {"version": c["shown.data"], "rendered": c["rendered.data"], "status": c["status.children"],
           "band": c["summary-band.children"], "summary": c["strategy-summary.children"], "cards": c["cards.children"]}
    out.update({g: c[f"fig-{g}.figure"] for g in GRAPHS})
    out.update({t: c[f"table-{t}.children"] for t in TABLES})
    return out


def test_page_shows_the_jobs_strategy_and_timeline(hand_store):
    c = _content(page_content(JobViews(), str(hand_store), "handjob"))
    assert "DP 2 x PP 2 x TP 1" in c["summary"] and "pipelines [0,1] [2,3]" in c["summary"]
    assert "job handjob" in c["status"]
    heat = [t for t in c["strategy"].data if isinstance(t, go.Heatmap)]
    assert len(heat) == 1 and [list(r) for r in heat[0].text] == [["0", "1"], ["2", "3"]]  # pipelines x stages
    assert set(c["timeline"].data[0].y) == {"0", "1", "2", "3"}
    # the slow rank (3) computes 1.5x longer than its DP peer (1) in every step
    comp = c["timeline"].data[0]
    by_rank = {}
    for r, x in zip(comp.y, comp.x):
        by_rank[r] = by_rank.get(r, 0.0) + x
    assert by_rank["3"] == pytest.approx(1.5 * by_rank["1"], rel=0.01)
    assert len(c["step_series"].data[0].y) == 3


def test_unchanged_store_sends_nothing_and_new_data_shows(tmp_path):
    root = tmp_path / "live"
    write_hand_store(root, steps=2)
    views = JobViews()
    first = _content(page_content(views, str(root), "handjob"))
    assert page_content(views, str(root), "handjob", shown=first["version"]) is None
    write_hand_store(root, steps=1, first_step=2)  # a live writer adds a step
    later = page_content(views, str(root), "handjob", shown=first["version"])
    assert later is not None
    assert len(_content(later)["step_series"].data[0].y) == len(first["step_series"].data[0].y) + 1


def test_baseline_store_gives_a_diff_table(hand_store, tmp_path):
    slower = tmp_path / "slower"
    write_hand_store(slower, steps=3, slow_factor=3.0)
    c = _content(page_content(JobViews(), str(slower), "handjob", str(hand_store), "handjob"))
    table = c["diff"][1]
    cols = [col["id"] for col in table.columns]
    assert {"aspect", "ratio", "change"} <= set(cols)
    assert "regression" in [row["change"] for row in table.data]


def test_missing_empty_and_unchosen_stores_are_said_plainly(tmp_path):
    missing = page_content(JobViews(), str(tmp_path / "nope"), None)
    assert "does not exist" in missing["status.children"]
    assert "no records yet" in page_content(JobViews(), str(tmp_path), None)["status.children"]
    assert page_content(JobViews(), None, None)["status.children"] == "choose a store"
    # no internal ids in the empty panels: each says what it would show and why it is empty
    for g in GRAPHS:
        fig = missing[f"fig-{g}.figure"]
        assert "_" not in fig.layout.title.text and "does not exist" in fig.layout.annotations[0].text


def test_a_capture_with_no_job_says_on_the_page_what_was_set_apart(tmp_path):
    from rankscope.collectors.schema import conform
    from rankscope.collectors.store import Store
    from tests.unit.analysis.flow_records import job_or_storage_flows

    Store(tmp_path / "st").write("flow", conform(job_or_storage_flows(), "flow"), job="fabric")
    status = page_content(JobViews(), str(tmp_path / "st"), None)["status.children"]
    assert "no training job was recognised" in status and "could be a job or its storage either way" in status


def test_page_is_tagged_with_the_job_it_was_computed_for(hand_store):
    c = _content(page_content(JobViews(), str(hand_store), "handjob"))
    assert c["rendered"] == {"store": str(hand_store), "job": "handjob"}


def test_summary_band_names_verdict_culprit_and_cost(hand_store):
    from rankscope.dashboard.summary_band import summary_facts

    views = JobViews()
    d = views.get(str(hand_store), "handjob").diagnosis
    f = summary_facts(d)
    assert f["job"] == "handjob" and f["verdict"] == d.stragglers.verdict
    # the culprit is the analysis' own words for its first finding: the slow rank 3, by name and factor
    assert f["culprit"] and "rank 3" in f["culprit"] and "1.50x" in f["culprit"]
    assert f["waste_pct"] == pytest.approx(100 * d.stragglers.waste_fraction)
    assert f["hours_per_day"] == pytest.approx(4 * 24 * d.stragglers.waste_fraction)
    assert f["hours_unit"] == "GPU-hours/day"


def test_analysis_is_cached_per_store_version(tmp_path, monkeypatch):
    from rankscope.analysis import diagnose
    from rankscope.dashboard import analysis_source

    root = tmp_path / "live"
    write_hand_store(root, steps=2)
    from rankscope.analysis.runner import plan

    calls = []
    real = diagnose.analyze_job
    monkeypatch.setattr(plan, "analyze_job", lambda *a, **k: calls.append(1) or real(*a, **k))
    analysis_source.clear_cache()
    views = JobViews()
    v1 = views.get(str(root), "handjob").version
    assert JobViews().get(str(root), "handjob").version == v1 and len(calls) == 1  # a fresh view, same version
    write_hand_store(root, steps=1, first_step=2)
    assert views.get(str(root), "handjob").version != v1 and len(calls) == 2


def test_layout_has_every_graph_and_a_refresh_interval(hand_store):
    app = create_app(str(hand_store), interval_s=2)
    ids = set()

    def walk(node):
        if hasattr(node, "id") and getattr(node, "id", None):
            ids.add(node.id)
        kids = getattr(node, "children", None)
        for k in kids if isinstance(kids, list) else [kids] if kids is not None else []:
            walk(k)

    walk(app.layout)
    assert {f"fig-{g}" for g in GRAPHS} | {f"table-{t}" for t in TABLES} <= ids
    assert {"store", "job", "tick", "strategy-summary", "summary-band", "loading", "content", "rendered"} <= ids


def test_strategy_summary_truncates_many_groups():
    from rankscope.analysis.report import Diagnosis, Strategy

    s = Strategy(world_size=64, dp=64, dp_groups=[list(range(64))], pp_groups=[[r] for r in range(64)])
    text = strategy_summary(Diagnosis(job="j", strategy=s))
    assert "(64 in all)" in text and ",...]" in text


def test_cli_dashboard_usage_errors(tmp_path, capsys):
    assert main(["dashboard", "--help"]) == 0
    assert "--store" in capsys.readouterr().out
    assert main(["dashboard", "--store", str(tmp_path / "nope")]) == 2


def test_flow_only_capture_lists_recognised_jobs_with_address_endpoints(tmp_path):
    from rankscope.collectors.store import Store
    from rankscope.datasets.sim.job_config import SimConfig
    from rankscope.datasets.simulator import simulate

    res = simulate(SimConfig(job="sim", dp=2, pp=2, steps=3, microbatches=2, layers=2, gpus_per_host=1))
    root = tmp_path / "flows"
    Store(root).write("flow", res.tables["flow"])  # the switches' view only
    views = JobViews()
    plan = views.plan(str(root))
    assert plan and all(n == "fabric" or n.startswith("fabric-") for n in plan)
    assert all(how.kind == "capture" and how.source == "fabric" for how in plan.values())
    name = next(iter(plan))
    c = _content(page_content(views, str(root), name))
    assert f"job {name}" in c["status"]
    assert "10." in c["summary"]  # endpoints are NIC addresses, not ranks


def test_band_names_a_finding_under_the_verdict_threshold():
    from dash import html

    from rankscope.analysis.report import Diagnosis, Finding, Stragglers, Strategy
    from rankscope.analysis.report.findings import Worker
    from rankscope.dashboard.summary_band import summary_band, summary_facts

    finding = Finding(kind="slow_worker", culprit=Worker(1000, 1, 61), factor=1.5, steps=[0, 1],
                      evidence={"basis": "compute"})
    d = Diagnosis(job="big", strategy=Strategy(world_size=4096, dp=512, pp=8),
                  stragglers=Stragglers(slowdown=1.04, verdict="none", waste_fraction=1 - 1 / 1.04),
                  findings=[finding])
    f = summary_facts(d)
    assert f["verdict"] == "none" and f["culprit"].startswith("rank 1000 (stage 1, dp 61) computes 1.50x")
    assert f["hours_per_day"] == pytest.approx(4096 * 24 * (1 - 1 / 1.04))
    band = summary_band(d)
    texts = [c.children for c in band if isinstance(c, html.Div) and isinstance(c.children, str)]
    assert any("costs too little for a verdict" in t and "rank 1000" in t for t in texts)


def test_dashboard_reads_the_analysis_rankscope_analyze_cached(tmp_path, monkeypatch):
    import json

    from rankscope.analysis import diagnose
    from rankscope.dashboard import analysis_source

    root = tmp_path / "st"
    write_hand_store(root, steps=3)
    assert main(["analyze", "--store", str(root), "--out-dir", str(tmp_path / "out"), "--no-html"]) == 0
    report = json.loads((tmp_path / "out" / "handjob.json").read_text())
    calls = []
    monkeypatch.setattr(diagnose, "analyze_job", lambda *a, **k: calls.append(1))  # must not be needed
    analysis_source.clear_cache()
    d = JobViews().get(str(root), "handjob").diagnosis
    assert calls == [] and d.stragglers.verdict == report["stragglers"]["verdict"]


def test_the_page_follows_the_live_window_from_its_file(hand_store, tmp_path):
    """The band of a job `rankscope watch` follows reads the latest window's file, not the analysis."""
    from rankscope.collectors.store import Store
    from rankscope.dashboard.app import live_window
    from rankscope.dashboard.summary_band import live_text

    assert live_window(str(hand_store), "handjob") is None and live_text(None) == ""
    st = Store(tmp_path / "st")
    event = {"job": "j", "kind": "window", "window_end_step": 23, "slowdown": 1.7, "verdict": "worker",
             "culprit": {"rank": 3, "stage": 1, "dp_rank": 1}, "straggler": True, "straggler_windows": 2,
             "vs_job_median": 1.66, "findings": []}
    st.write_live("j", event)
    assert live_window(str(st.root), "j") == event
    text = live_text(event)
    assert "step 23" in text and "S 1.70" in text and "worker: rank 3" in text and "2 window(s)" in text
    assert "1.66x" in text
    hang = live_text({"kind": "hang", "window_end_step": 7, "why": "rank(s) [1] never joined"})
    assert "HANG" in hang and "[1]" in hang
    app = create_app(str(hand_store), interval_s=2)
    assert "live-window.children" in app.callback_map
