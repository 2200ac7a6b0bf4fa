import jsonschema
import pytest

from rankscope.analysis.kernels.regressions import RegressionConfig
from rankscope.analysis.kernels.regressions import kernel_regressions as typed_regressions
from rankscope.analysis.kernels.throughput import ThroughputConfig
from rankscope.analysis.report.codec import to_json
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.job_frames import JobFrames

from .gemm_frames import gemm_frame


def kernel_regressions(*args, **kwargs) -> list[dict]:
    """The kernel regressions as the report writes them."""
    return [to_json(r) for r in typed_regressions(*args, **kwargs)]


S1, S2, BAD = (4096, 4096, 4096), (4096, 8192, 4096), (4096, 1000, 4096)


def _jf(df, job="j"):
    return JobFrames.from_frames(job, compute_op=df)


def test_throttled_rank_named_with_ratio_and_reason(report_schema):
    regs = kernel_regressions(_jf(gemm_frame(shapes=(S1, S2), slow={3: 2.0})))
    assert regs and all(r["check"] == "throughput" and r["ranks"] == [3] for r in regs)
    assert all((r["kind"], r["culprit"], r["steps"]) == ("kernel_regression", 3, [0]) for r in regs)
    assert regs[0]["factor"] == pytest.approx(2.0, rel=1e-3) and regs[0]["evidence"]["ratio"] == regs[0]["ratio"]
    assert regs[0]["ratio"] == pytest.approx(0.5, rel=1e-3)
    assert "throttling" in regs[0]["reason"] and regs[0]["shape"] in ([4096, 4096, 4096], [4096, 8192, 4096])
    jsonschema.validate(regs, report_schema["properties"]["regressions"])


def test_misaligned_shape_flagged_by_rule_with_measured_ratio():
    # The misaligned GEMM runs at half the aligned ones' TFLOP/s per FLOP (its time is 1000/4096 * 2 of S1's).
    df = gemm_frame(shapes=(S1, BAD), slow={(r, BAD): 1000 / 4096 * 2 for r in range(4)})
    regs = kernel_regressions(_jf(df))
    assert [(r["check"], r["kind"], r["culprit"]) for r in regs] == [("alignment", "misaligned_gemm", regs[0]["kernel"])]
    assert regs[0]["shape"] == [4096, 1000, 4096] and regs[0]["dtype"] == "bfloat16"
    assert regs[0]["ratio"] == pytest.approx(0.5, rel=0.01) and "N=1000" in regs[0]["reason"]
    assert regs[0]["ratio_basis"] == "aligned GEMMs of this job"   # S1 has 4.1x its FLOPs: no similar size


def test_misaligned_shape_compared_with_aligned_gemms_of_similar_size():
    # Small GEMMs run at half the big one's TFLOP/s, aligned or not: the misaligned small one costs nothing.
    small, small_bad = (1024, 1024, 1024), (1024, 1000, 1024)
    slow = {(r, s): f for r in range(4) for s, f in ((small, 2 / 64), (small_bad, 2 / 64 * 1000 / 1024))}
    regs = kernel_regressions(_jf(gemm_frame(shapes=(S1, small, small_bad), slow=slow)))
    assert regs == []
    # The same shape 1.5x slower than its like-sized aligned peer is a finding, with that basis.
    slow[(0, small_bad)] = slow[(1, small_bad)] = slow[(2, small_bad)] = slow[(3, small_bad)] = 1.5 * slow[(0, small_bad)]
    regs = kernel_regressions(_jf(gemm_frame(shapes=(S1, small, small_bad), slow=slow)))
    assert [r["kind"] for r in regs] == ["misaligned_gemm"] and regs[0]["factor"] == pytest.approx(1.5, rel=1e-2)
    assert "within 4x" in regs[0]["ratio_basis"]


def test_baseline_slowdown_explained_by_misalignment_is_one_finding():
    base = gemm_frame(shapes=(S1, S2, BAD))
    cur = gemm_frame(shapes=(S1, S2, BAD), slow={(r, BAD): 1.5 for r in range(4)})
    regs = kernel_regressions(_jf(cur), _jf(base, "b"))
    assert len(regs) == 1 and regs[0]["check"] == "throughput" and regs[0]["comparison"] == "baseline"
    assert regs[0]["kind"] == "misaligned_gemm"
    assert regs[0]["reason"].startswith("misaligned dim") and regs[0]["ratio"] == pytest.approx(1 / 1.5, rel=1e-3)


def test_clean_job_has_no_findings():
    assert kernel_regressions(_jf(gemm_frame(shapes=(S1, S2)))) == []
    assert kernel_regressions(JobFrames.from_frames("empty")) == []


def test_config_options():
    df = gemm_frame(shapes=(S1, (4096, 4000, 4096)), slow={(r, (4096, 4000, 4096)): 1.5 for r in range(4)})
    assert kernel_regressions(_jf(df))                                    # 4000: preferred only
    # The same misses at no measured cost are not findings.
    assert kernel_regressions(_jf(gemm_frame(shapes=(S1, (4096, 4000, 4096))))) == []
    assert kernel_regressions(_jf(df), config=RegressionConfig(include_preferred=False)) == []
    regs = kernel_regressions(_jf(gemm_frame(shapes=(S1,), slow={0: 1.2})),
                              config=RegressionConfig(throughput=ThroughputConfig(threshold=0.8)))
    assert regs == []
    with pytest.raises(ConfigError):
        RegressionConfig(tp=0)


def test_fallback_kernel_alignment_is_named():
    df = gemm_frame(shapes=(S1, S2), slow={(1, S2): 2.0},
                    kernel_of={(1, S2): "cutlass_80_tensorop_bf16_s16816gemm_bf16_128x128_tn_align1"})
    regs = kernel_regressions(_jf(df))
    assert len(regs) == 1 and regs[0]["ranks"] == [1]
    assert regs[0]["reason"].startswith("different kernel chosen")
    assert "built for 1-element alignment" in regs[0]["reason"]


def _spread_frame(sigma: float, slow_rank_factor: float, ranks: int = 8, calls: int = 100, seed: int = 0):
    """Every rank runs two shapes; call times are lognormal with spread ``sigma``; rank 0 is slower."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    rows, t = [], 0
    for r in range(ranks):
        for shape in (S1, S2):
            for d in (200_000 * (slow_rank_factor if r == 0 else 1.0) * rng.lognormal(0.0, sigma, calls)).astype(int):
                rows.append({"job": "j", "rank": r, "name": "k", "category": "gemm", "start_ns": t,
                             "end_ns": t + int(d) + 1, "step": 0, "m": shape[0], "n": shape[1], "k": shape[2],
                             "dtype": "bfloat16"})
                t += int(d) + 100
    return pl.DataFrame(rows)


def test_noise_floor_is_the_runs_own_spread():
    # CPU processes sharing cores: calls of one shape spread over several times their median (the real
    # gloo DP2xPP2xTP2 Kineto job's per-call CV is 1 to 5); a 1.6x slower rank there is that spread
    assert kernel_regressions(_jf(_spread_frame(sigma=1.5, slow_rank_factor=1.6))) == []
    # the same 1.6x on a device whose calls agree to 3 % is a regression, named
    regs = kernel_regressions(_jf(_spread_frame(sigma=0.03, slow_rank_factor=1.6)))
    assert regs and {r["culprit"] for r in regs} == {0}
    assert all(r["factor"] == pytest.approx(1.6, rel=0.05) for r in regs)


def test_clean_real_cpu_job_gets_no_kernel_finding(tmp_path):
    """The real gloo DP2xPP2xTP2 Kineto job (eight CPU processes on two cores): no GEMM regressed."""
    from pathlib import Path

    from rankscope.collectors.ingest.files import ingest
    from rankscope.collectors.job_frames import load_job
    from rankscope.collectors.store import Store

    data = Path(__file__).resolve().parents[2] / "data" / "gloo_dp2pp2tp2" / "kineto"
    st = Store(tmp_path / "s")
    ingest(st, sorted(data.glob("*.json.gz")))
    frames = load_job(st, "default")
    assert frames.compute_op.filter(frames.compute_op["category"] == "gemm").height > 0
    assert kernel_regressions(frames) == []
