"""Findings apart from cost, the arrival-skew basis, dp = 1 worker-or-stage, honest S < 1 (issue 12)."""

from __future__ import annotations

import polars as pl
import pytest

from rankscope.analysis.report.diagnosis import Diagnosis, Stragglers
from rankscope.analysis.report.findings import build_findings, summary_text
from rankscope.analysis.stragglers.attribution import _honest, analyze_stragglers
from rankscope.collectors.job_frames import JobFrames

sim = pytest.importorskip("rankscope.datasets.simulator")


def sim_frames(*faults, dp=4, pp=2, tp=1, kinds=("comm_op", "compute_op", "step_mark", "batch_meta"), seed=0,
               gpus_per_host=2):
    res = sim.simulate(sim.SimConfig(job="j", dp=dp, pp=pp, tp=tp, steps=4, microbatches=4, schedule="1f1b",
                                     faults=tuple(faults), seed=seed, flows=False, gpus_per_host=gpus_per_host))
    tabs = {k: (v if isinstance(v, pl.DataFrame) else pl.from_arrow(v)) for k, v in res.tables.items()}
    return JobFrames.from_frames("j", **{k: v for k, v in tabs.items() if k in kinds})


def diag(frames) -> Diagnosis:
    s, _ = analyze_stragglers(frames)
    d = Diagnosis(job="j", stragglers=s)
    d.extra["findings"] = build_findings(s)
    return d


def test_a_slow_gpu_below_the_verdict_threshold_is_still_a_finding():
    # 64 GPUs, one 1.3x slow: it costs little (the verdict may be none) but it is listed with its factor
    d = diag(sim_frames(sim.Fault("slow-worker", {"rank": 37, "factor": 1.3}), dp=16, pp=4, gpus_per_host=8))
    workers = [f for f in d.extra["findings"] if f["kind"] == "slow_worker"]
    assert [f["culprit"]["rank"] for f in workers] == [37]
    assert workers[0]["factor"] == pytest.approx(1.3, rel=0.05)
    assert workers[0]["steps"] == [0, 1, 2, 3]
    assert "rank 37" in summary_text(d)


def test_clean_job_has_no_compute_findings_and_verdict_culprit_comes_first():
    d = diag(sim_frames(seed=3))
    assert not [f for f in d.extra["findings"] if f["kind"] in ("slow_worker", "slow_stage")]
    d = diag(sim_frames(sim.Fault("slow-worker", {"rank": 5, "factor": 1.6})))
    first = d.extra["findings"][0]
    assert first["kind"] == "slow_worker" and first["culprit"]["rank"] == 5
    assert first["evidence"]["verdict"] == "worker"
    assert summary_text(d).startswith("verdict worker: rank 5 (stage 1, dp 1) computes 1.6")


def test_kernel_findings_pass_through_and_other_regressions_do_not():
    s = Stragglers(extra={"evaluated": True, "evidence": {}, "steps": []})
    reg = [{"kind": "kernel_regression", "culprit": {"kernel": "fc1"}, "factor": 1.8, "steps": [0], "evidence": {}},
           {"kernel": "old-shaped regression row"}]
    assert [f["kind"] for f in build_findings(s, reg)] == ["kernel_regression"]


def test_hook_records_alone_give_an_arrival_skew_verdict():
    d = diag(sim_frames(sim.Fault("slow-worker", {"rank": 5, "factor": 1.6}), kinds=("comm_op", "step_mark")))
    st = d.stragglers
    assert st.extra["basis"] == "arrival_skew" and st.verdict == "worker"
    assert st.top_workers[0]["endpoint"] == 5 and d.extra["findings"][0]["culprit"]["rank"] == 5
    clean = diag(sim_frames(seed=3, kinds=("comm_op", "step_mark"))).stragglers
    assert clean.extra["basis"] == "arrival_skew" and clean.verdict == "none" and clean.slowdown < 1.05


def test_arrival_skew_uses_the_job_models_layout():
    frames = sim_frames(sim.Fault("slow-worker", {"rank": 5, "factor": 1.6}), kinds=("comm_op", "step_mark"))
    layout = pl.DataFrame({"rank": list(range(8)), "stage": [r // 4 for r in range(8)],
                           "dp_rank": [r % 4 for r in range(8)], "tp_rank": [0] * 8, "pipeline": [r % 4 for r in range(8)]})
    s, _ = analyze_stragglers(frames, layout=layout)
    assert s.extra["evidence"]["arrival_skew"]["peers"] == "stage peers (layout)"
    assert (s.top_workers[0]["endpoint"], s.top_workers[0]["stage"], s.top_workers[0]["dp_rank"]) == (5, 1, 1)


@pytest.mark.parametrize(("fault", "want"), [
    (sim.Fault("slow-worker", {"rank": 2, "factor": 1.8}), "worker"),
    (sim.Fault("stage-imbalance", {"stage": 2, "factor": 2.0}), "stage_imbalance"),
])
def test_dp1_pipeline_tells_slow_hardware_from_more_work(fault, want):
    # one rank per stage: only the op classes can tell them apart (the optimizer is not more work)
    d = diag(sim_frames(fault, dp=1, pp=4))
    st = d.stragglers
    assert st.verdict == want
    assert st.extra["worker_or_stage"]["call"] == want and st.extra["worker_or_stage"]["rank"] == 2
    if want == "stage_imbalance":
        assert st.extra["verdict_stage"] == 2 and "stage 2" in summary_text(d)
    else:
        assert "rank 2" in summary_text(d)


def test_s_below_one_is_noise_not_negative_waste():
    s = _honest(Stragglers(slowdown=0.92, waste_fraction=1 - 1 / 0.92))
    assert s.extra["noise"] is True and s.waste_fraction == 0.0
    assert "noise" in summary_text(Diagnosis(job="j", stragglers=s))


def test_hook_records_take_their_placement_from_the_strategy():
    from rankscope.analysis.report.diagnosis import Strategy
    from rankscope.analysis.stragglers.attribution import layout_from_strategy, straggler_section

    st = Strategy(world_size=8, dp=4, pp=2, dp_groups=[[0, 1, 2, 3], [4, 5, 6, 7]],
                  pp_groups=[[0, 4], [1, 5], [2, 6], [3, 7]])
    lay = layout_from_strategy(st)
    assert lay.filter(pl.col("rank") == 5).select("stage", "dp_rank", "pipeline").row(0) == (1, 1, 1)
    assert layout_from_strategy(Strategy(pp_groups=[["10.0.0.1", "10.0.0.2"]])) is None
    frames = sim_frames(sim.Fault("slow-worker", {"rank": 5, "factor": 1.6}), kinds=("comm_op", "step_mark"))
    s = straggler_section(frames, st)
    assert (s.top_workers[0]["endpoint"], s.top_workers[0]["stage"], s.top_workers[0]["dp_rank"]) == (5, 1, 1)


def test_no_private_keys_cross_module_boundaries():
    d = diag(sim_frames(sim.Fault("seq-skew", {"sigma": 0.5})))
    ev = d.stragglers.extra["evidence"]
    assert not [k for part in ev.values() if isinstance(part, dict) for k in part if k.startswith("_")]
    seq = [f for f in d.extra["findings"] if f["kind"] == "sequence_imbalance"]
    assert seq and seq[0]["factor"] > 1.0
