"""Each injected fault shows in the records exactly as its ground truth says."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.kernels.regressions import kernel_regressions as typed_regressions
from rankscope.analysis.report.codec import to_json
from rankscope.datasets.simulator import Fault, SimConfig, simulate

from .conftest import frames


def kernel_regressions(*args, **kwargs) -> list[dict]:
    """The kernel regressions as the report writes them."""
    return [to_json(r) for r in typed_regressions(*args, **kwargs)]


SMALL = dict(steps=3, microbatches=4, layers=8, flows=False, gemm_records=False, seed=5)


def _passes(f, category="forward"):
    return f["compute_op"].filter(pl.col("category") == category).with_columns(
        dur=pl.col("end_ns") - pl.col("start_ns"))


def test_stage_imbalance_makes_the_last_stage_slower():
    res = simulate(SimConfig(dp=2, pp=4, faults=(Fault("stage-imbalance", {"factor": 2.0}),), **SMALL))
    fw = _passes(frames(res))
    by_stage = fw.group_by("stage").agg(pl.col("dur").mean()).sort("stage")["dur"].to_numpy()
    assert abs(by_stage[3] / by_stage[:3].mean() - 2.0) < 0.05
    assert res.truth["faults"] == [{"kind": "stage_imbalance", "injected": "stage-imbalance",
                                    "params": res.truth["faults"][0]["params"]}]
    assert res.truth["faults"][0]["params"]["stage"] == 3


def test_sequence_skew_compute_follows_a_s_plus_b_s2():
    res = simulate(SimConfig(dp=4, pp=1, jitter=0.0, faults=(Fault("seq-skew", {"sigma": 0.5}),), **SMALL))
    f = frames(res)
    p = res.truth["faults"][0]["params"]
    assert p["sigma"] == 0.5 and res.truth["faults"][0]["kind"] == "sequence_imbalance"
    fw = _passes(f).join(f["batch_meta"], on=["rank", "step", "microbatch"])
    assert fw["seq_len"].n_unique() > 10
    model_ns = (p["a_flops_per_token"] * fw["seq_len"] + p["b_flops_per_token2"] * fw["seq_len"] ** 2) / (
        res.config.gpu_tflops * 1e3)
    assert np.allclose(fw["dur"].to_numpy(), model_ns.to_numpy(), rtol=1e-6, atol=2)
    # different data-parallel ranks get different lengths in the same step (the skew)
    per_rank = f["batch_meta"].group_by("step", "rank").agg(pl.col("seq_len").sum())
    assert per_rank.group_by("step").agg(pl.col("seq_len").n_unique())["seq_len"].min() > 1


def test_gc_pauses_precede_the_forward_pass_of_that_rank():
    res = simulate(SimConfig(dp=2, pp=2, faults=(Fault("gc", {"rank": 2, "pause_ms": 80, "every": 2}),), **SMALL))
    c = frames(res)["compute_op"]
    gc = c.filter(pl.col("category") == "gc")
    assert sorted(gc["step"]) == res.truth["faults"][0]["params"]["at_steps"] == [0, 2]
    assert set(gc["rank"]) == {2} and ((gc["end_ns"] - gc["start_ns"]) == 80_000_000).all()
    fw = c.filter((pl.col("category") == "forward") & (pl.col("rank") == 2) & (pl.col("microbatch") == 0))
    j = gc.join(fw, on=["rank", "step"], suffix="_fw")
    assert (j["start_ns_fw"] == j["end_ns"]).all()
    assert res.truth["faults"][0]["kind"] == "worker"


def test_misaligned_gemm_changes_the_dim_and_the_slowdown_follows():
    cfg = SimConfig(dp=2, pp=1, tp=2, hidden=4096, gemm_records=True,
                    **{k: v for k, v in SMALL.items() if k != "gemm_records"},
                    faults=(Fault("misaligned-gemm", {"kernel": "fc1", "factor": 2.0, "from_step": 1}),))
    p = cfg.fault_params(cfg.faults[0])
    # FFN 4 * 4096 = 16,384 built as 16,380: 8,190 per tensor-parallel rank, not a multiple of 8 bf16 elements.
    assert (p["size"], p["split"], p["aligned_split"], p["severity"]) == (16380, 8190, 8192, "min")
    k = frames(simulate(cfg))["compute_op"].filter(pl.col("category") == "gemm").with_columns(
        tput=pl.col("flops") / (pl.col("end_ns") - pl.col("start_ns")))
    assert (k["flops"] == 2.0 * k["m"] * k["n"] * k["k"]).all()
    fc1 = k.filter(pl.col("name") == "gemm.fc1.fwd")
    assert set(fc1.filter(pl.col("step") == 0)["n"]) == {8192} and set(fc1.filter(pl.col("step") >= 1)["n"]) == {8190}
    assert set(k.filter(pl.col("name") == "gemm.fc1.dgrad", pl.col("step") >= 1)["k"]) == {8190}
    before = fc1.filter(pl.col("step") == 0)["tput"].mean()
    after = fc1.filter(pl.col("step") >= 1)["tput"].mean()
    assert abs(before / after - 2.0) < 0.05
    others = k.filter(pl.col("name") == "gemm.fc2.fwd")
    assert abs(others.filter(pl.col("step") == 0)["tput"].mean() / others.filter(pl.col("step") >= 1)["tput"].mean()
               - 1) < 0.03
    assert set(k.filter(pl.col("name") == "gemm.fc1.fwd")["layout"]) == {"nt"}   # the dim changed, not the layout


def test_misaligned_gemm_slowdown_depends_on_the_split():
    kw = dict(dp=2, pp=1, **SMALL)
    # 18,432 split 32 ways = 576: whole 16-byte chunks of fp8 but not whole 128-byte lines (a small loss).
    fp8 = SimConfig(tp=32, hidden=4608, dtype="float8_e4m3fn", **kw,
                    faults=(Fault("misaligned-gemm", {"size": 18432, "factor": 1.8}),))
    p = fp8.fault_params(fp8.faults[0])
    assert (p["split"], p["severity"]) == (576, "preferred") and 1.0 < p["time_factor"] < 1.8
    from rankscope.collectors.errors import ConfigError

    with pytest.raises(ConfigError):   # 576 is aligned for bf16: nothing would be misaligned
        SimConfig(tp=32, hidden=4608, **kw, faults=(Fault("misaligned-gemm", {"size": 18432}),))
    with pytest.raises(ConfigError):   # does not divide across the tensor-parallel ranks
        SimConfig(tp=4, **kw, faults=(Fault("misaligned-gemm", {"size": 16382}),))


def test_analyze_alone_flags_the_misaligned_gemm_without_a_baseline():
    from rankscope.collectors.job_frames import JobFrames

    cfg = SimConfig(dp=2, pp=2, tp=2, gemm_records=True, **{k: v for k, v in SMALL.items() if k != "gemm_records"},
                    faults=(Fault("misaligned-gemm", {"kernel": "fc1"}),))
    f = frames(simulate(cfg))
    regs = kernel_regressions(JobFrames.from_frames("j", compute_op=f["compute_op"]))
    assert regs and all(r["kind"] == "misaligned_gemm" and ".fc1." in r["culprit"] for r in regs)
    assert regs[0]["factor"] == pytest.approx(1.8, rel=0.02) and regs[0]["steps"] == [0, 1, 2]
    # A misalignment that costs only 5% is still listed (below the 0.9 throughput threshold's reach).
    cheap = SimConfig(**{**cfg.__dict__, "faults": (Fault("misaligned-gemm", {"kernel": "qkv", "factor": 1.05}),)})
    regs = kernel_regressions(JobFrames.from_frames("j", compute_op=frames(simulate(cheap))["compute_op"]))
    assert regs and all(r["kind"] == "misaligned_gemm" and ".qkv." in r["culprit"] for r in regs)
    assert regs[0]["factor"] == pytest.approx(1.05, rel=0.01)


def test_slow_link_stretches_transfers_of_that_nic():
    kw = dict(dp=4, pp=1, gpus_per_host=1, jitter=0.0, **SMALL)
    slow = frames(simulate(SimConfig(faults=(Fault("slow-link", {"rank": 2, "factor": 4.0}),), **kw)))
    base = frames(simulate(SimConfig(**kw)))

    def transfer(f):
        ar = f["comm_op"].filter(pl.col("stream") == "dp")
        t = ar.group_by("seq").agg((pl.col("end_ns").max() - pl.col("start_ns").max()).alias("t"))
        return t["t"].mean()

    assert abs(transfer(slow) / transfer(base) - 4.0) < 0.05
    # compute is untouched
    assert abs(_passes(slow)["dur"].mean() / _passes(base)["dur"].mean() - 1) < 0.01


def test_clock_skew_shifts_each_hosts_records_by_its_offset():
    res = simulate(SimConfig(dp=4, pp=1, gpus_per_host=1, faults=(Fault("clock-skew", {"max_ms": 5.0}),), **SMALL))
    off = res.truth["clock_offsets_ns"]
    assert len(set(off.values())) == 4 and max(abs(v) for v in off.values()) <= 5_000_000
    comm = frames(res)["comm_op"].with_columns(
        true_end=pl.col("end_ns") - pl.col("host").replace_strict(off, return_dtype=pl.Int64))
    g = comm.group_by("group_id", "seq").agg(pl.col("end_ns").n_unique().alias("raw"),
                                            pl.col("true_end").n_unique().alias("fixed"))
    assert (g["fixed"] == 1).all() and (g["raw"] > 1).all()


@pytest.mark.parametrize("bad", [
    dict(faults=(Fault("stage-imbalance", {}),)),              # needs pp > 1
    dict(faults=(Fault("slow-worker", {"rank": 8}),)),          # rank out of range
    dict(faults=(Fault("hang", {"index": 99}),)),               # no such bucket
    dict(faults=(Fault("misaligned-gemm", {"kernel": "nope"}),)),
])
def test_impossible_faults_are_config_errors(bad):
    from rankscope.collectors.errors import ConfigError

    with pytest.raises(ConfigError):
        SimConfig(dp=4, pp=1, **bad)
