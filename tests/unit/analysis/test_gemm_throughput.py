import numpy as np
import polars as pl
import pytest

from rankscope.analysis.gemm_throughput import (
    ThroughputConfig,
    baseline_findings,
    cross_rank_findings,
    leave_one_out_median,
    rank_throughput,
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
    tp = rank_throughput(gemm_frame(shapes=(S1,), ranks=1, calls=2, dur_ns=1000))
    assert tp["tflops"][0] == pytest.approx(2 * 4096**3 / 1000 / 1e3)
    assert tp["num_calls"][0] == 2


def test_throttled_rank_flagged_on_every_shape():
    tp = rank_throughput(gemm_frame(shapes=(S1, S2), slow={2: 1.5}))
    f = cross_rank_findings(tp)
    assert f.height == 2 and all(r == [2] for r in f["ranks"].to_list())
    assert f["ratio"].to_list() == pytest.approx([1 / 1.5] * 2)
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
    assert f.height == 1 and f["n"][0] == 8192 and f["ratio"][0] == pytest.approx(0.8)
    assert f["ranks"][0].to_list() == [0, 1, 2, 3] and f["comparison"][0] == "baseline"


def test_no_gemms_gives_empty_frames():
    empty = pl.DataFrame({"rank": [0], "name": ["relu"], "category": ["elementwise"], "start_ns": [0],
                          "end_ns": [5], "m": [None], "n": [None], "k": [None], "dtype": [None]})
    assert rank_throughput(empty).height == 0
    assert cross_rank_findings(rank_throughput(empty)).height == 0
