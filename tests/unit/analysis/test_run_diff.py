import polars as pl
import pytest

from rankscope.analysis.model.job_model import build_job_model
from rankscope.analysis.run_diff import DiffConfig, comm_bandwidth, diff_runs, step_durations
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.job_frames import JobFrames
from rankscope.collectors.schema import conform

from .gemm_frames import gemm_frame

S1, BAD, GOOD = (4096, 4096, 4096), (4096, 1000, 4096), (4096, 1024, 4096)


def _comm(dur_ns, job):
    rows = []
    for step in range(3):
        for r in range(2):
            t = step * 1_000_000
            rows.append({"job": job, "rank": r, "op": "all_reduce", "group_ranks": [0, 1], "size_bytes": 8 << 20,
                         "start_ns": t, "end_ns": t + dur_ns, "state": "completed", "seq": step, "step": step})
    return pl.from_arrow(conform(pl.DataFrame(rows), "comm_op"))


def _steps(dur_ns):
    return pl.DataFrame({"job": "j", "rank": [0, 0, 0], "step": [0, 1, 2], "start_ns": [0, 10**7, 2 * 10**7],
                         "end_ns": [dur_ns, 10**7 + dur_ns, 2 * 10**7 + dur_ns]})


def test_resized_run_regressions_first_with_evidence():
    a = JobFrames.from_frames("a", compute_op=gemm_frame(shapes=(S1, GOOD), ranks=2, dur_ns=1000), comm_op=_comm(1000, "a"),
                              step_mark=_steps(5_000_000))
    # B: misaligned N, GEMMs 1.5x slower per FLOP, all_reduce half the bandwidth, steps 20% longer.
    b = JobFrames.from_frames("b", compute_op=gemm_frame(shapes=(S1, BAD), ranks=2, dur_ns=1500),
                              comm_op=_comm(2000, "b"), step_mark=_steps(6_000_000))
    d = diff_runs(build_job_model(a), build_job_model(b))
    changes = [r["change"] for r in d.rows]
    assert changes.index("regression") == 0 and "regression" not in changes[len(d.regressions):]
    items = {(r["aspect"], r["item"]): r for r in d.rows}
    assert items[("step", "step time")]["ratio"] == pytest.approx(5 / 6)
    assert items[("comm_bandwidth", "all_reduce 1-16MiB")]["ratio"] == pytest.approx(0.5)
    assert items[("comm_bandwidth", "all_reduce 1-16MiB")]["change"] == "regression"
    align = [r for r in d.regressions if r["aspect"] == "alignment"]
    assert len(align) == 1 and "N=1000" in align[0]["evidence"]
    gem = items[("gemm_throughput", "gemm_cutlass bfloat16")]
    assert gem["change"] == "regression" and gem["ratio"] < 0.9
    assert any(f["check"] == "alignment" for f in d.kernel_findings)
    assert d.to_dict()["num_regressions"] == len(d.regressions)


def test_same_run_has_no_regressions():
    a = JobFrames.from_frames("a", compute_op=gemm_frame(ranks=2), comm_op=_comm(1000, "a"))
    d = diff_runs(build_job_model(a), build_job_model(a))
    assert d.regressions == [] and all(r["change"] == "same" for r in d.rows)


def test_helpers_and_config():
    assert step_durations(build_job_model(JobFrames.from_frames("x"))).height == 0
    bw = comm_bandwidth(_comm(1000, "a"))
    assert bw["bucket"].to_list() == ["1-16MiB"] and bw["gbps"][0] == pytest.approx((8 << 20) * 8 / 1000)
    with pytest.raises(ConfigError):
        DiffConfig(threshold=0)
