import numpy as np
import polars as pl
import pytest

from rankscope.analysis.kernels.throughput import (
    ThroughputConfig,
    baseline_findings,
    cross_rank_findings,
    leave_one_out_median,
    rank_throughput,
    timer_resolution_ns,
)
from rankscope.collectors.errors import ConfigError

from .gemm_frames import gemm_frame

S1, S2 = (4096, 4096, 4096), (4096, 8192, 4096)


def test_leave_one_out_median_matches_numpy():
    rng = np.random.default_rng(0)
    g = rng.integers(0, 5, 60)
    v = rng.random(60)
    got = leave_one_out_median(g, v)
    for i in range(60):
        others = v[(g == g[i]) & (np.arange(60) != i)]
        want = np.median(others) if len(others) else np.nan
        assert np.isnan(got[i]) if np.isnan(want) else got[i] == pytest.approx(want)


def test_rank_throughput_uses_2mnk_flops():
    tp = rank_throughput(gemm_frame(shapes=(S1,), ranks=1, calls=2, dur_ns=1000, jitter=False))
    assert tp["tflops"][0] == pytest.approx(2 * 4096**3 / 1000 / 1e3)
    assert tp["num_calls"][0] == 2


def test_throttled_rank_flagged_on_every_shape():
    tp = rank_throughput(gemm_frame(shapes=(S1, S2), slow={2: 1.5}))
    f = cross_rank_findings(tp)
    assert f.height == 2 and all(r == [2] for r in f["ranks"].to_list())
    assert f["ratio"].to_list() == pytest.approx([1 / 1.5] * 2, rel=1e-4)
    assert all("throttling" in r for r in f["reason"].to_list())


def test_one_shape_slow_with_other_kernel():
    df = gemm_frame(shapes=(S1, S2), slow={(1, S2): 2.0}, kernel_of={(1, S2): "cutlass_gemm_align1"})
    f = cross_rank_findings(rank_throughput(df))
    assert f.height == 1 and f["ranks"][0].to_list() == [1] and f["n"][0] == 8192
    assert f["reason"][0].startswith("different kernel chosen: cutlass_gemm_align1")


def test_threshold_is_configurable():
    tp = rank_throughput(gemm_frame(shapes=(S1,), slow={0: 1.05}))
    assert cross_rank_findings(tp).height == 0
    assert cross_rank_findings(tp, ThroughputConfig(threshold=0.99))["ranks"][0].to_list() == [0]
    with pytest.raises(ConfigError):
        ThroughputConfig(threshold=1.5)


def test_baseline_comparison_names_shape_and_ratio():
    base = rank_throughput(gemm_frame(shapes=(S1, S2)))
    cur = rank_throughput(gemm_frame(shapes=(S1, S2), slow={(r, S2): 1.25 for r in range(4)}))
    f = baseline_findings(cur, base)
    assert f.height == 1 and f["n"][0] == 8192 and f["ratio"][0] == pytest.approx(0.8, rel=1e-4)
    assert f["ranks"][0].to_list() == [0, 1, 2, 3] and f["comparison"][0] == "baseline"


def test_no_gemms_gives_empty_frames():
    empty = pl.DataFrame({"rank": [0], "name": ["relu"], "category": ["elementwise"], "start_ns": [0],
                          "end_ns": [5], "m": [None], "n": [None], "k": [None], "dtype": [None]})
    assert rank_throughput(empty).height == 0
    assert cross_rank_findings(rank_throughput(empty)).height == 0


def test_timer_resolution_from_duration_granularity():
    assert timer_resolution_ns(pl.Series([26_000, 48_000, 182_000, 0])) == 1000
    assert timer_resolution_ns(pl.Series([26_013, 48_000, 182_000])) == 1
    assert timer_resolution_ns(pl.Series([], dtype=pl.Int64)) == 1


def test_noise_floor_drops_quantised_short_and_two_rank_comparisons():
    cfg = ThroughputConfig()
    # One-tick durations on a microsecond timer (1 us vs 2 us): a ratio of exactly 0.5 from quantisation.
    ticks = gemm_frame(shapes=(S1,), ranks=4, dur_ns=1000, slow={0: 2.0}, jitter=False)
    assert cross_rank_findings(rank_throughput(ticks, cfg), cfg).height == 0
    # The same slowdown with 40 us calls on a microsecond timer: 40 ticks, still under 50.
    coarse = gemm_frame(shapes=(S1,), ranks=4, dur_ns=40_000, slow={0: 2.0}, jitter=False)
    assert cross_rank_findings(rank_throughput(coarse, cfg), cfg).height == 0
    fine = gemm_frame(shapes=(S1,), ranks=4, dur_ns=40_000, slow={0: 2.0})
    assert cross_rank_findings(rank_throughput(fine, cfg), cfg)["ranks"].to_list() == [[0]]
    # Two ranks: which one is slow cannot be told; two calls: one warm-up is enough to look slow.
    two = gemm_frame(shapes=(S1,), ranks=2, slow={0: 2.0})
    assert cross_rank_findings(rank_throughput(two, cfg), cfg).height == 0
    few = gemm_frame(shapes=(S1,), ranks=4, calls=2, slow={0: 2.0})
    assert cross_rank_findings(rank_throughput(few, cfg), cfg).height == 0


def test_cpu_op_spans_do_not_time_gemms_on_a_gpu_rank():
    df = gemm_frame(shapes=(S1,), ranks=4, slow={0: 2.0}).with_columns(grid=pl.lit(None, pl.String))
    kernel = pl.DataFrame({"job": "j", "rank": [0], "name": ["elementwise_kernel"], "category": ["elementwise"],
                           "start_ns": [0], "end_ns": [10_000], "step": [0], "grid": ["1,1,1"]})
    df = pl.concat([df, kernel], how="diagonal_relaxed")
    tp = rank_throughput(df, ThroughputConfig())
    assert 0 not in tp["rank"].to_list() and tp.height == 3
