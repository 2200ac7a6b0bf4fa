"""Findings apart from cost, the arrival-skew basis, dp = 1 worker-or-stage, honest S < 1 (issue 12)."""

from __future__ import annotations

import polars as pl
import pytest

from rankscope.analysis.diagnose import diagnose
from rankscope.analysis.model.job_model import build_job_model
from rankscope.analysis.report.diagnosis import Diagnosis
from rankscope.analysis.report.findings import Finding, Worker, kernel_findings, order_findings
from rankscope.analysis.report.kernels import Regression, ThroughputCheck
from rankscope.analysis.report.stragglers import Stragglers
from rankscope.analysis.report.summary import summary_text
from rankscope.analysis.stragglers.config import StragglerConfig
from rankscope.analysis.stragglers.findings import findings_of
from rankscope.analysis.stragglers.section import analyze_stragglers, honest, rank_section
from rankscope.collectors.job_frames import JobFrames

sim = pytest.importorskip("rankscope.datasets.simulator")


def sim_frames(*faults, dp=4, pp=2, tp=1, kinds=("comm_op", "compute_op", "step_mark", "batch_meta"), seed=0,
               gpus_per_host=2):
    res = sim.simulate(sim.SimConfig(job="j", dp=dp, pp=pp, tp=tp, steps=4, microbatches=4, schedule="1f1b",
                                     faults=tuple(faults), seed=seed, flows=False, gpus_per_host=gpus_per_host))
    tabs = {k: (v if isinstance(v, pl.DataFrame) else pl.from_arrow(v)) for k, v in res.tables.items()}
    return JobFrames.from_frames("j", **{k: v for k, v in tabs.items() if k in kinds})


def diag(frames) -> Diagnosis:
    return diagnose(frames)


def test_a_slow_gpu_below_the_verdict_threshold_is_still_a_finding():
    # 64 GPUs, one 1.3x slow: it costs little (the verdict may be none) but it is listed with its factor
    d = diag(sim_frames(sim.Fault("slow-worker", {"rank": 37, "factor": 1.3}), dp=16, pp=4, gpus_per_host=8))
    workers = [f for f in d.findings if f.kind == "slow_worker"]
    assert [f.culprit.rank for f in workers] == [37]
    assert workers[0].factor == pytest.approx(1.3, rel=0.05)
    assert workers[0].steps == [0, 1, 2, 3]
    assert "rank 37" in summary_text(d)


def test_clean_job_has_no_compute_findings_and_verdict_culprit_comes_first():
    d = diag(sim_frames(seed=3))
    assert not [f for f in d.findings if f.kind in ("slow_worker", "slow_stage")]
    d = diag(sim_frames(sim.Fault("slow-worker", {"rank": 5, "factor": 1.6})))
    first = d.findings[0]
    assert first.kind == "slow_worker" and first.culprit.rank == 5
    assert first.evidence["verdict"] == "worker"
    assert summary_text(d).startswith("verdict worker: rank 5 (stage 1, dp 1) computes 1.6")


def test_kernel_findings_group_the_shapes_of_one_culprit():
    def reg(kernel, shape, ratio):
        check = ThroughputCheck("throughput", kernel, [kernel], "gemm_other", shape, "bfloat16", "tn", [3], ratio,
                                "other ranks", 1.0, 2.0, "rank slow on 2 of 2 GEMM shapes", "regression", "ranks")
        return Regression(check=check, kind="kernel_regression", culprit=3, factor=1 / ratio, steps=[0],
                          evidence={})

    found = kernel_findings([reg("fc1", [8, 8, 8], 0.5), reg("fc2", [16, 16, 16], 0.6)])
    assert [(f.kind, f.culprit) for f in found] == [("kernel_regression", 3)]
    assert found[0].factor == pytest.approx(2.0) and len(found[0].evidence["kernels"]) == 2
    ordered = order_findings(None, [*found, Finding("slow_link", 1, 1.7, [0], {})], "none")
    assert [f.kind for f in ordered] == ["kernel_regression", "slow_link"]
    unmeasured = Finding("slow_worker", Worker(1, 0, 0), None, [0], {})
    assert order_findings(None, [unmeasured], "none") == []


def test_a_verdict_culprit_without_a_measured_ratio_carries_the_jobs_s():
    from rankscope.analysis.report.stragglers import WhatIf
    from rankscope.analysis.stragglers.findings import verdict_finding

    st = Stragglers(slowdown=1.4, verdict="stage_imbalance", basis="arrival_skew", steps=[0, 1], evidence={},
                    whatif=WhatIf("arrival_skew", {"stage_imbalance": 0.9}, 2, 1.4, 1.0, [1.4, 1.4]))
    f = verdict_finding(st, [])
    assert f.culprit.stage == 2 and f.factor == 1.4 and "slowdown S" in f.evidence["factor_is"]


def test_hook_records_alone_give_an_arrival_skew_verdict():
    d = diag(sim_frames(sim.Fault("slow-worker", {"rank": 5, "factor": 1.6}), kinds=("comm_op", "step_mark")))
    st = d.stragglers
    assert st.basis == "arrival_skew" and st.verdict == "worker"
    assert st.top_workers[0].endpoint == 5 and d.findings[0].culprit.rank == 5
    clean = diag(sim_frames(seed=3, kinds=("comm_op", "step_mark"))).stragglers
    assert clean.basis == "arrival_skew" and clean.verdict == "none" and clean.slowdown < 1.05


def test_arrival_skew_uses_the_job_models_layout():
    frames = sim_frames(sim.Fault("slow-worker", {"rank": 5, "factor": 1.6}), kinds=("comm_op", "step_mark"))
    layout = pl.DataFrame({"rank": list(range(8)), "stage": [r // 4 for r in range(8)],
                           "dp_rank": [r % 4 for r in range(8)], "tp_rank": [0] * 8, "pipeline": [r % 4 for r in range(8)]})
    model = build_job_model(frames)
    assert model.layout.select("rank", "stage", "dp_rank").equals(layout.select("rank", "stage", "dp_rank"))
    s, _ = analyze_stragglers(model)
    assert s.evidence["arrival_skew"]["peers"] == "stage peers (layout)"
    assert (s.top_workers[0].endpoint, s.top_workers[0].stage, s.top_workers[0].dp_rank) == (5, 1, 1)


@pytest.mark.parametrize(("fault", "want"), [
    (sim.Fault("slow-worker", {"rank": 2, "factor": 1.8}), "worker"),
    (sim.Fault("stage-imbalance", {"stage": 2, "factor": 2.0}), "stage_imbalance"),
])
def test_dp1_pipeline_tells_slow_hardware_from_more_work(fault, want):
    # one rank per stage: only the op classes can tell them apart (the optimizer is not more work)
    d = diag(sim_frames(fault, dp=1, pp=4))
    st = d.stragglers
    assert st.verdict == want
    assert st.worker_or_stage["call"] == want and st.worker_or_stage["rank"] == 2
    if want == "stage_imbalance":
        assert st.whatif.verdict_stage == 2 and "stage 2" in summary_text(d)
    else:
        assert "rank 2" in summary_text(d)


def test_s_below_one_is_noise_not_negative_waste():
    s = honest(Stragglers(slowdown=0.92, waste_fraction=1 - 1 / 0.92))
    assert s.noise is True and s.waste_fraction == 0.0
    assert "noise" in summary_text(Diagnosis(job="j", stragglers=s, findings=findings_of(s)))


def test_hook_records_take_their_placement_from_the_job_models_layout():
    # hook records carry no stage: the one layout (positions in the inferred groups) places every rank
    frames = sim_frames(sim.Fault("slow-worker", {"rank": 5, "factor": 1.6}), kinds=("comm_op", "step_mark"))
    model = build_job_model(frames)
    assert model.layout.filter(pl.col("rank") == 5).select("stage", "pipeline").row(0) == (1, 1)
    s = rank_section(model, StragglerConfig())
    assert (s.top_workers[0].endpoint, s.top_workers[0].stage) == (5, 1)


def test_no_private_keys_cross_module_boundaries():
    d = diag(sim_frames(sim.Fault("seq-skew", {"sigma": 0.5})))
    ev = d.stragglers.evidence
    assert not [k for part in ev.values() if isinstance(part, dict) for k in part if k.startswith("_")]
    seq = [f for f in d.findings if f.kind == "sequence_imbalance"]
    assert seq and seq[0].factor > 1.0
