"""Analysis results cached per store version: a re-run on an unchanged store reuses them, a change recomputes."""

from __future__ import annotations

import json
import math

import pytest

from rankscope.analysis.report.diagnosis import Diagnosis
from rankscope.analysis.report.stragglers import Stragglers
from rankscope.analysis.runner import cache as rc
from rankscope.cli.main import main
from rankscope.collectors.store import Store

sim = pytest.importorskip("rankscope.datasets.simulator")


@pytest.fixture()
def store_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("RANKSCOPE_NO_CACHE", raising=False)
    res = sim.simulate(sim.SimConfig(job="llama", dp=2, pp=2, gpus_per_host=1, steps=3, microbatches=2,
                                     flows=False))
    d = tmp_path / "st"
    sim.write_store(res, d)
    return d


def _count_calls(monkeypatch, n: dict, key: str, module, name: str) -> None:
    """Replace ``module.name`` with a wrapper that counts its calls in ``n[key]`` (cache misses)."""
    real = getattr(module, name)
    n.setdefault(key, 0)

    def counting(*a, **k):
        n[key] += 1
        return real(*a, **k)

    monkeypatch.setattr(module, name, counting)


@pytest.fixture()
def calls(monkeypatch):
    """Counts real analyses (cache misses) made by the CLI commands."""
    import rankscope.analysis.diagnose as diagnose_mod
    import rankscope.analysis.runner.plan as plan_mod

    n = {}
    _count_calls(monkeypatch, n, "analyze_job", diagnose_mod, "analyze_job")
    _count_calls(monkeypatch, n, "analyze_job", plan_mod, "analyze_job")
    return n


def _report(out):
    return json.loads((out / "llama.json").read_text())


def _timeless(x):
    """The report without the analysis' own run time (``seconds``), which differs between runs."""
    if isinstance(x, dict):
        return {k: _timeless(v) for k, v in x.items() if k != "seconds"}
    if isinstance(x, list):
        return [_timeless(v) for v in x]
    return x


def test_rerun_on_unchanged_store_reuses_the_analysis(store_dir, tmp_path, calls):
    assert main(["analyze", "--store", str(store_dir), "--out-dir", str(tmp_path / "a")]) == 0
    assert calls["analyze_job"] == 1
    assert main(["analyze", "--store", str(store_dir), "--out-dir", str(tmp_path / "b")]) == 0
    assert calls["analyze_job"] == 1, "the second run on an unchanged store analysed again"
    assert _report(tmp_path / "a") == _report(tmp_path / "b")
    assert (tmp_path / "a" / "llama.html").read_text() == (tmp_path / "b" / "llama.html").read_text()


def test_changed_store_or_options_recompute(store_dir, tmp_path, calls):
    assert main(["analyze", "--store", str(store_dir), "--out-dir", str(tmp_path / "a")]) == 0
    assert main(["analyze", "--store", str(store_dir), "--out-dir", str(tmp_path / "b"),
                 "--none-below", "1.5"]) == 0
    assert calls["analyze_job"] == 2, "other options must not be answered from the cache"
    # new records land: a slow rank 0 in one more step's compute
    store = Store(store_dir)
    store.write("compute_op", store.read_arrow("compute_op", "llama").slice(0, 1))
    assert main(["analyze", "--store", str(store_dir), "--out-dir", str(tmp_path / "c")]) == 0
    assert calls["analyze_job"] == 3, "a changed store was answered from the cache"


def test_no_cache_env_turns_it_off(store_dir, tmp_path, calls, monkeypatch):
    monkeypatch.setenv("RANKSCOPE_NO_CACHE", "1")
    for out in ("a", "b"):
        assert main(["analyze", "--store", str(store_dir), "--out-dir", str(tmp_path / out), "--no-html"]) == 0
    assert calls["analyze_job"] == 2
    assert not (store_dir / rc.CACHE_DIR).exists()


def test_metrics_reuse_the_analyze_result(store_dir, tmp_path, calls):
    assert main(["analyze", "--store", str(store_dir), "--out-dir", str(tmp_path / "a"), "--no-html"]) == 0
    prom = tmp_path / "m.prom"
    assert main(["metrics", "--store", str(store_dir), "--textfile", str(prom)]) == 0
    assert calls["analyze_job"] == 1
    assert 'rankscope_step_time_seconds{job="llama"}' in prom.read_text()


def test_corrupt_entry_is_a_miss(store_dir, tmp_path, calls):
    assert main(["analyze", "--store", str(store_dir), "--out-dir", str(tmp_path / "a"), "--no-html"]) == 0
    for p in (store_dir / rc.CACHE_DIR).glob("*/diagnosis.json"):
        p.write_text("{not json")
    assert main(["analyze", "--store", str(store_dir), "--out-dir", str(tmp_path / "b"), "--no-html"]) == 0
    assert calls["analyze_job"] == 2
    assert _timeless(_report(tmp_path / "a")) == _timeless(_report(tmp_path / "b"))


def test_diagnosis_round_trips_with_nan():
    d = Diagnosis(job="j", stragglers=Stragglers(slowdown=math.nan, evaluated=False))
    back = Diagnosis.decoded(json.loads(json.dumps(d.encoded())))
    assert math.isnan(back.stragglers.slowdown) and back.to_json() == d.to_json()


def test_every_report_type_round_trips_through_the_cache_form(tmp_path):
    """Unions (top workers, culprits), groups and nested types come back as the same values."""
    from rankscope.analysis.diagnose import diagnose
    from rankscope.collectors.job_frames import load_job

    res = sim.simulate(sim.SimConfig(job="llama", dp=2, pp=2, gpus_per_host=1, steps=3, microbatches=2, flows=False,
                                     faults=(sim.Fault("slow-worker", {"rank": 1, "factor": 1.6}),)))
    sim.write_store(res, tmp_path / "st")
    d = diagnose(load_job(Store(tmp_path / "st"), "llama"))
    back = Diagnosis.decoded(json.loads(json.dumps(d.encoded())))
    assert back.to_dict() == d.to_dict()
    assert type(back.stragglers.top_workers[0]) is type(d.stragglers.top_workers[0])
    assert back.stragglers.replay == d.stragglers.replay and back.steps == d.steps and back.strategy == d.strategy
    assert back.findings and type(back.findings[0].culprit) is type(d.findings[0].culprit)


def test_store_version_follows_the_jobs_parts(store_dir):
    store = Store(store_dir)
    v1 = rc.store_version(store, ["llama"])
    assert rc.store_version(store, ["llama"]) == v1
    one = store.read_arrow("step_mark", "llama").slice(0, 1)
    store.write("step_mark", one, job="other")
    assert rc.store_version(store, ["llama"]) == v1, "another job's records changed this job's version"
    store.write("step_mark", one)
    assert rc.store_version(store, ["llama"]) != v1


def test_export_and_diff_reuse_their_results(store_dir, tmp_path, monkeypatch):
    import rankscope.analysis.run_diff as run_diff_mod
    import rankscope.analysis.whatif.build as graph_mod

    n = {}
    _count_calls(monkeypatch, n, "graph", graph_mod, "build_graph")
    _count_calls(monkeypatch, n, "diff", run_diff_mod, "diff_runs")
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outs:
        assert main(["export", "perfetto", "--store", str(store_dir), "--out", str(out)]) == 0
    assert n["graph"] == 1 and outs[0].read_bytes() == outs[1].read_bytes()
    diffs = [tmp_path / "d1.json", tmp_path / "d2.json"]
    for out in diffs:
        assert main(["diff", "--baseline", str(store_dir), "--store", str(store_dir), "--json", str(out)]) == 0
    assert n["diff"] == 1 and diffs[0].read_text() == diffs[1].read_text()
    Store(store_dir).write("step_mark", Store(store_dir).read_arrow("step_mark", "llama").slice(0, 1))
    assert main(["export", "perfetto", "--store", str(store_dir), "--out", str(outs[0])]) == 0
    assert main(["diff", "--baseline", str(store_dir), "--store", str(store_dir)]) == 0
    assert n == {"graph": 2, "diff": 2}


def test_job_recognition_on_a_capture_is_cached(tmp_path, monkeypatch):
    """Planning a store's jobs (every analyze, every dashboard start) reuses job recognition on an unchanged
    capture, gives the same plan from the cache, and recognises again once the capture changes."""
    import rankscope.analysis.runner.plan as flow_jobs_mod  # where plan_jobs looks recognise_jobs up
    from rankscope.analysis.runner.plan import plan_jobs

    monkeypatch.delenv("RANKSCOPE_NO_CACHE", raising=False)
    fab = sim.simulate_fabric([sim.SimConfig(job="a", dp=4, pp=2, gpus_per_host=1, steps=3, seed=1, qps=1),
                               sim.SimConfig(job="b", dp=2, pp=1, tp=2, gpus_per_host=2, steps=3, seed=2, qps=1)],
                              background=True, capture="fabric")
    store = Store(tmp_path / "fab")
    store.write("flow", fab.flow)
    n = {}
    _count_calls(monkeypatch, n, "recognise", flow_jobs_mod, "recognise_jobs")
    first = plan_jobs(store)
    again = plan_jobs(store)
    assert n["recognise"] == 1, "an unchanged capture was recognised again"
    assert [(p.name, p.endpoints) for p in first] == [(p.name, p.endpoints) for p in again]
    assert [p.quality for p in first] == [p.quality for p in again]
    assert len(first) == 2
    store.write("flow", store.read_arrow("flow", "fabric").slice(0, 1))
    plan_jobs(store)
    assert n["recognise"] == 2, "a changed capture was answered from the cache"
