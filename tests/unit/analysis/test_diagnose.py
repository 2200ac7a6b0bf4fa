"""The front door: strategy, steps and timelines of one job from whatever record kinds it has."""

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.diagnose import DiagnoseConfig, analyze_job, diagnose, job_timelines
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.job_frames import JobFrames

from .wb_frames import build_job


def test_white_box_job_with_skewed_clocks():
    comm, comp, _ = build_job(dp=4, pp=1, steps=5, step_ms=80.0, offsets_ns={1: 4_000_000, 3: -3_000_000})
    d, tables = analyze_job(JobFrames.from_frames("j", comm_op=comm, compute_op=comp))
    assert (d.strategy.dp, d.strategy.pp) == (4, 1)
    assert d.steps.count == 5 and abs(d.steps.median_ns - 80e6) / 80e6 < 0.003
    assert d.data_quality.clock.max_abs_offset_ns > 2_000_000
    tl = tables["timeline"]
    assert tl.height == 4 * 5
    busy = tl["compute_ns"] + tl["exposed_comm_ns"] + tl["idle_ns"]
    assert (busy == tl["duration_ns"]).all()
    assert d.to_dict()["strategy"]["pp_groups"] == [[0], [1], [2], [3]]


def test_job_timelines_match_analyze_job():
    comm, comp, _ = build_job(dp=2, pp=2, steps=2)
    frames = JobFrames.from_frames("j", comm_op=comm, compute_op=comp)
    assert job_timelines(frames).equals(analyze_job(frames)[1]["timeline"])


def test_simulated_job_steps_match_truth():
    sim = pytest.importorskip("rankscope.datasets.simulator")
    res = sim.simulate(sim.SimConfig(job="s", dp=2, pp=2, gpus_per_host=1, steps=4, microbatches=2, flows=False,
                                     faults=(sim.Fault("clock-skew", {"max_ms": 4.0}),)))
    frames = JobFrames.from_frames("s", **{k: pl.from_arrow(v) for k, v in res.tables.items()})
    d = diagnose(frames)
    ref = float(np.median(res.truth["step_times_ns"]))
    assert d.steps.count == 4
    assert abs(d.steps.median_ns - ref) / ref < 0.003
    assert sorted(d.strategy.pp_groups) == sorted(res.truth["pp_groups"])


def test_no_records_is_reported_not_raised():
    d = diagnose(JobFrames.from_frames("empty"))
    assert d.strategy.evaluated is False and d.steps.count == 0
    assert d.to_dict()["job"] == "empty"


def test_config_validation():
    with pytest.raises(ConfigError):
        DiagnoseConfig(stragglers=0.5)


def test_sections_beside_the_replays_give_the_report_of_sections_in_order(monkeypatch):
    """Small jobs run the table sections on a second thread beside the replays, big ones in order: the
    report and tables are the same either way (the sections are pure functions of the job model)."""
    import rankscope.analysis.diagnose as diag

    comm, comp, _ = build_job(dp=4, pp=2, steps=3, offsets_ns={1: 2_000_000})
    frames = JobFrames.from_frames("j", comm_op=comm, compute_op=comp)
    model = diag.model_of(frames)
    assert diag._sections_beside(model)
    beside, tables_beside = diag.analyze_model(model)
    monkeypatch.setattr(diag, "BESIDE_BUDGET_BYTES", 0)
    assert not diag._sections_beside(model)
    in_order, tables_in_order = diag.analyze_model(model)
    assert _untimed(beside.to_dict()) == _untimed(in_order.to_dict())
    assert tables_beside.keys() == tables_in_order.keys()
    assert all(tables_beside[k].equals(tables_in_order[k]) for k in tables_beside)


def _untimed(o):
    """A report without its run-time fields (``seconds``: how long a section took)."""
    if isinstance(o, dict):
        return {k: _untimed(v) for k, v in o.items() if k != "seconds"}
    return [_untimed(v) for v in o] if isinstance(o, list) else o


def test_critical_path_beside_the_straggler_evidence_is_the_path_after_it(monkeypatch):
    """A small job's critical path starts on the second thread as soon as the what-if graph exists and runs
    beside the rest of the straggler section; a big job's runs after it. The report is the same either way."""
    import threading

    import rankscope.analysis.critical_path.section as cps
    import rankscope.analysis.diagnose as diag

    comm, comp, _ = build_job(dp=4, pp=2, steps=3, offsets_ns={1: 2_000_000})
    model = diag.model_of(JobFrames.from_frames("j", comm_op=comm, compute_op=comp))
    threads = []
    path_of_graph = cps.path_of_graph

    def recorded(*args, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        return path_of_graph(*args, **kwargs)

    monkeypatch.setattr(cps, "path_of_graph", recorded)
    assert diag._path_beside(model)
    beside, _ = diag.analyze_model(model)
    monkeypatch.setattr(diag, "PATH_BESIDE_MAX_RECORDS", 0)
    after, _ = diag.analyze_model(model)
    assert threads == [False, True]  # the second thread, then the main one
    assert beside.critical_path.evaluated
    assert _untimed(beside.to_dict()) == _untimed(after.to_dict())
