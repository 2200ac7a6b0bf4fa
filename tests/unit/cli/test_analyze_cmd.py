"""``rankscope analyze``: one schema-valid report per job, capture splitting, exit codes."""

from __future__ import annotations

import json

import pytest

from rankscope.cli.main import main

sim = pytest.importorskip("rankscope.datasets.simulator")
jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def job_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("st")
    res = sim.simulate(sim.SimConfig(job="llama", dp=2, pp=2, gpus_per_host=1, steps=3, microbatches=2,
                                     capture="fab"))
    sim.write_store(res, d)
    return d, res.truth


@pytest.fixture(scope="module")
def fabric_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("fab")
    # one queue pair per rank pair: several would hide how many ranks share an address (tp null)
    cfgs = [sim.SimConfig(job="a", dp=4, pp=2, gpus_per_host=1, steps=3, seed=1, qps=1),
            sim.SimConfig(job="b", dp=2, pp=1, tp=2, gpus_per_host=2, steps=3, seed=2, qps=1)]
    fab = sim.simulate_fabric(cfgs, background=True, capture="fabric")
    # flows only: the store holds the capture and nothing else
    from rankscope.collectors.store import Store
    Store(d).write("flow", fab.flow)
    return d, fab.truth


def test_one_valid_report_per_job(job_store, tmp_path, report_schema):
    store, truth = job_store
    out = tmp_path / "out"
    assert main(["analyze", "--store", str(store), "--out-dir", str(out)]) == 0
    names = sorted(p.name for p in out.glob("*.json"))
    assert names == ["fab.json", "llama.json"]
    for p in out.glob("*.json"):
        rep = json.loads(p.read_text())
        jsonschema.validate(rep, report_schema)
    white = json.loads((out / "llama.json").read_text())
    assert sorted(white["strategy"]["dp_groups"]) == sorted(truth["dp_groups"])
    assert sorted(white["strategy"]["pp_groups"]) == sorted(truth["pp_groups"])
    assert white["steps"]["count"] == 3
    black = json.loads((out / "fab.json").read_text())
    assert sorted(black["strategy"]["pp_groups"]) == sorted(truth["pp_groups_by_address"])
    if (out / "llama.html").exists():
        assert "<html" in (out / "llama.html").read_text()[:2000].lower()


def test_job_option_and_flow_comparison(job_store, tmp_path):
    store, _ = job_store
    out = tmp_path / "o"
    assert main(["analyze", "--store", str(store), "--job", "llama", "--flow-job", "fab", "--out-dir", str(out),
                 "--no-html"]) == 0
    assert [p.name for p in out.iterdir()] == ["llama.json"]
    cmp = json.loads((out / "llama.json").read_text())["strategy"]["comparison"]
    assert cmp["evaluated"] and cmp["agree"], cmp


def test_capture_is_split_into_named_jobs(fabric_store, tmp_path, report_schema):
    store, truth = fabric_store
    out = tmp_path / "o"
    assert main(["analyze", "--store", str(store), "--out-dir", str(out), "--no-html"]) == 0
    assert sorted(p.name for p in out.glob("*.json")) == ["fabric-1.json", "fabric-2.json"]
    reps = [json.loads((out / f"fabric-{i}.json").read_text()) for i in (1, 2)]
    for rep in reps:
        jsonschema.validate(rep, report_schema)
    # job b (dp2 x tp2 on two hosts) is one link per rail: DP2 and PP2 fit it alike, so its dp and pp are left
    # open, each with the truth among the candidates, never a guess
    wants = [{k: t["degrees"][k] for k in ("dp", "pp", "tp")} for t in truth["jobs"].values()]
    for rep in reps:
        s = rep["strategy"]
        open_ = {u["field"]: u for u in s.get("undecided", []) if u["field"] in ("dp", "pp", "tp")}
        matches = [w for w in wants
                   if all(s[k] == w[k] if s[k] is not None else w[k] in open_[k]["candidates"] for k in w)]
        assert matches, (s["dp"], s["pp"], s["tp"], open_, wants)
        assert all(s[k] is not None or k in open_ for k in ("dp", "pp", "tp"))
        wants.remove(matches[0])
    assert {(r["strategy"]["dp"], r["strategy"]["pp"], r["strategy"]["tp"]) for r in reps} >= {(4, 2, 1)}
    assert reps[0]["data_quality"]["fabric"]["control_records"] > 0
    # a recognised job can be asked for by name
    out2 = tmp_path / "o2"
    assert main(["analyze", "--store", str(store), "--job", "fabric-2", "--out-dir", str(out2), "--no-html"]) == 0
    assert [p.name for p in out2.iterdir()] == ["fabric-2.json"]


def test_exit_codes(job_store, tmp_path):
    store, _ = job_store
    assert main(["analyze", "--store", str(store), "--job", "nosuch", "--out-dir", str(tmp_path / "x")]) == 2
    assert main(["analyze", "--store", str(tmp_path / "missing"), "--out-dir", str(tmp_path / "y")]) == 2  # a missing store is a usage error in every command
    (tmp_path / "empty").mkdir()
    assert main(["analyze", "--store", str(tmp_path / "empty"), "--out-dir", str(tmp_path / "z")]) == 1
    assert main(["analyze", "--out-dir", str(tmp_path / "z")]) == 2


def test_thresholds_reach_the_analysis_and_bad_ones_are_usage_errors(tmp_path):
    import json

    from rankscope.cli.main import main as cli_main

    sim = pytest.importorskip("rankscope.datasets.simulator")
    res = sim.simulate(sim.SimConfig(job="j", dp=2, pp=2, tp=1, steps=3, microbatches=4, seed=1, flows=False,
                                     faults=(sim.Fault("slow-worker", {"rank": 1, "factor": 1.5}),)))
    store = tmp_path / "st"
    sim.write_store(res, store)
    assert cli_main(["analyze", "--store", str(store), "--job", "j", "--out-dir", str(tmp_path / "a"),
                     "--no-html"]) == 0
    s = json.loads((tmp_path / "a" / "j.json").read_text())["stragglers"]
    assert s["verdict"] == "worker" and s["slowdown"] > 1.05
    # the same job with a verdict threshold above its slowdown is called clean
    assert cli_main(["analyze", "--store", str(store), "--job", "j", "--out-dir", str(tmp_path / "b"),
                     "--no-html", "--none-below", str(s["slowdown"] + 0.5)]) == 0
    assert json.loads((tmp_path / "b" / "j.json").read_text())["stragglers"]["verdict"] == "none"
    assert cli_main(["analyze", "--store", str(store), "--out-dir", str(tmp_path / "c"),
                     "--none-below", "0.5"]) == 2


def test_dashboard_and_analyze_share_one_job_plan(job_store, fabric_store, tmp_path):
    """The same names, and for each the same records, from the CLI and the dashboard (analysis.jobs)."""
    from rankscope.analysis.runner.plan import load_planned, plan_jobs
    from rankscope.collectors.store import Store
    from rankscope.dashboard.app import JobViews
    from rankscope.dashboard.app import load_planned as dash_load

    for d, _ in (job_store, fabric_store):
        out = tmp_path / d.name
        assert main(["analyze", "--store", str(d), "--out-dir", str(out), "--no-html"]) == 0
        reports = sorted(p.stem for p in out.glob("*.json"))
        plan = plan_jobs(Store(d))
        dash = JobViews().plan(str(d))
        assert reports == sorted(p.name for p in plan) == sorted(dash)
        for p in plan:
            frames = load_planned(Store(d), p)
            other = dash_load(Store(d), p.name, dash[p.name])
            assert frames.job == other.job == p.name
            for kind in ("flow", "comm_op", "compute_op"):
                assert getattr(frames, kind).equals(getattr(other, kind))
    assert {p.kind for p in plan_jobs(Store(fabric_store[0]))} == {"capture"}
    assert [p.name for p in plan_jobs(Store(job_store[0]), job="llama")] == ["llama"]
    assert plan_jobs(Store(job_store[0]), job="nope") == []


def test_control_port_sets_a_rendezvous_store_apart(tmp_path, capsys):
    # a real 4-stage gloo pipeline under 1-in-16 sFlow (tests/data/netns_gloo), rendezvous on a port
    # other than 29500: its store connections, scaled by the sampling, outweigh the job's at this size;
    # the port sets them apart as control traffic (without it, the job was once not found at all)
    from pathlib import Path

    import polars as pl

    from rankscope.collectors.schema import conform
    from rankscope.collectors.store import Store

    data = Path(__file__).resolve().parents[2] / "data" / "netns_gloo"
    truth = json.loads((data / "truth.json").read_text())["pp4_sflow_pmacct"]
    flows = pl.read_parquet(data / "pp4_sflow_pmacct.flows.parquet").with_columns(
        job=pl.lit("fabric"), source=pl.lit("sflow"))
    Store(tmp_path / "st").write("flow", conform(flows, "flow"), job="fabric")
    args = ["analyze", "--store", str(tmp_path / "st"), "--no-html"]
    assert main([*args, "--out-dir", str(tmp_path / "b"), "--control-port", str(truth["master_port"])]) == 0
    (report,) = (tmp_path / "b").glob("*.json")
    s = json.loads(report.read_text())["strategy"]
    assert (s["dp"], s["pp"]) == (1, 4)
    assert main([*args, "--out-dir", str(tmp_path / "c"), "--control-port", "0"]) == 2


def test_a_capture_with_no_job_says_what_was_set_apart(tmp_path, capsys):
    # either set could be the job and the other its storage (dev corpus, seed 2, where the servers were
    # named a 3-stage pipeline at 0.99): nothing is claimed, and the refusal says why
    from rankscope.collectors.schema import conform
    from rankscope.collectors.store import Store
    from tests.unit.analysis.flow_records import job_or_storage_flows

    Store(tmp_path / "st").write("flow", conform(job_or_storage_flows(), "flow"), job="fabric")
    capsys.readouterr()
    assert main(["analyze", "--store", str(tmp_path / "st"), "--no-html", "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "capture fabric:" in err and "could be a job or its storage either way" in err, err
