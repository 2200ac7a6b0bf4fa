"""The one job model: layout from records or strategy, completed frames, and the one call into stragglers."""

import polars as pl
import pytest

from rankscope.analysis import diagnose as diagnose_mod
from rankscope.analysis.model.job_model import build_job_model
from rankscope.analysis.model.layout import rank_layout
from rankscope.analysis.report.stragglers import Stragglers
from rankscope.collectors.job_frames import JobFrames

sim = pytest.importorskip("rankscope.datasets.simulator")


def _sim_tables(**kw):
    cfg = dict(dp=2, pp=4, tp=1, steps=3, microbatches=6, layers=8, flows=False)
    cfg.update(kw)
    res = sim.simulate(sim.SimConfig(**cfg))
    return {k: pl.from_arrow(v) for k, v in res.tables.items() if k != "flow"}


def _stripped(t: dict) -> JobFrames:
    """The records as Kineto or NCCL give them: no stage, microbatch, step or dp rank on the ops."""
    null = {"microbatch": pl.Int32, "step": pl.Int64, "stage": pl.Int32}
    comp = t["compute_op"].drop("dp_rank").with_columns([pl.lit(None, d).alias(c) for c, d in null.items()])
    comm = t["comm_op"].drop("stage", "dp_rank").with_columns(
        [pl.lit(None, d).alias(c) for c, d in null.items() if c != "stage"])
    return JobFrames.from_frames("j", comm_op=comm, compute_op=comp, step_mark=t["step_mark"])


def _agree(truth: pl.DataFrame, got: pl.DataFrame, col: str) -> float:
    a, b = truth[col].cast(pl.Int64).fill_null(-1), got[col].cast(pl.Int64).fill_null(-1)
    return float((a == b).mean())


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_completed_frames_recover_the_labels_the_records_lacked(schedule):
    t = _sim_tables(schedule=schedule, gemm_records=True)
    m = build_job_model(_stripped(t))
    comp, comm = m.frames.compute_op, m.frames.comm_op
    # every label the simulator wrote comes back from span order, the step windows and the strategy,
    # per-kernel GEMM records included (they take the id of the pass that encloses them)
    for col in ("step", "stage", "microbatch"):
        assert _agree(t["compute_op"], comp, col) == 1.0, col
    for col in ("step", "microbatch"):
        assert _agree(t["comm_op"], comm, col) == 1.0, col
    assert m.filled["compute_op"]["microbatch"] > 0 and m.filled["comm_op"]["step"] > 0


def test_layout_from_the_strategy_when_records_have_none():
    t = _sim_tables(dp=2, pp=2, tp=2, microbatches=4, layers=4, gemm_records=False)
    m = build_job_model(_stripped(t))
    lay = m.layout
    assert lay.columns == ["rank", "stage", "dp_rank", "tp_rank", "pipeline", "source"]
    truth = t["compute_op"].group_by(pl.col("rank").cast(pl.Int64)).agg(pl.col("stage").min().alias("true_stage"))
    j = lay.join(truth, on="rank")
    assert j.height == 8 and (j["stage"] == j["true_stage"]).all()
    assert lay["source"][0].startswith("strategy:")
    # ranks of one pipeline share its index and hold one stage each; dp peers of a stage differ in dp_rank
    for _, g in lay.group_by("pipeline"):
        assert sorted(g["stage"].to_list()) == sorted(set(g["stage"].to_list()))
    for _, g in lay.group_by("stage", "tp_rank"):
        assert sorted(g["dp_rank"].to_list()) == list(range(g.height))
    assert lay.select(pl.col("stage", "dp_rank", "tp_rank", "pipeline").null_count()).row(0) == (0, 0, 0, 0)


def test_record_columns_win_over_the_strategy():
    t = _sim_tables(dp=2, pp=2, microbatches=2, layers=4, gemm_records=False)
    frames = JobFrames.from_frames("j", comm_op=t["comm_op"], compute_op=t["compute_op"].with_columns(
        pl.lit(7, pl.Int32).alias("stage")))
    lay = rank_layout(frames, build_job_model(frames).strategy)
    assert set(lay["stage"].to_list()) == {7}
    assert lay["source"][0].startswith("records: stage")


def test_layout_unknown_without_records():
    m = build_job_model(JobFrames.from_frames("empty"))
    assert m.layout.is_empty() and m.steps.is_empty()


def test_stragglers_get_the_completed_frames_and_the_layout(monkeypatch):
    t = _sim_tables(dp=2, pp=2, microbatches=2, layers=4, gemm_records=False)
    seen = {}

    def fake(model, config=None, keep=None, on_graph=None):
        seen["stage_nulls"] = model.frames.compute_op["stage"].null_count()
        seen["layout"] = model.layout_columns()
        return Stragglers()

    monkeypatch.setattr(diagnose_mod, "straggler_section", fake)
    diagnose_mod.analyze_job(_stripped(t))
    assert seen["stage_nulls"] == 0
    assert seen["layout"].columns == ["rank", "stage", "dp_rank", "tp_rank", "pipeline"]


@pytest.mark.parametrize("fault,verdict", [("stage-imbalance:stage=1,factor=2.0", "stage_imbalance"),
                                           ("slow-worker:rank=5,factor=1.5", "worker")])
def test_records_without_labels_get_the_labelled_diagnosis(fault, verdict):
    """Kineto/NCCL-like records (no step, stage or microbatch on the ops, step marks only) are diagnosed
    as the same job with labels: the straggler section reads the completed frames."""
    from rankscope.datasets.sim.job_config import parse_fault

    t = _sim_tables(steps=4, gemm_records=False, faults=(parse_fault(fault),))
    full, _ = diagnose_mod.analyze_job(JobFrames.from_frames("j", **t))
    bare, _ = diagnose_mod.analyze_job(_stripped(t))
    assert full.stragglers.verdict == bare.stragglers.verdict == verdict
    assert bare.stragglers.slowdown == pytest.approx(full.stragglers.slowdown, rel=1e-9)
    top = lambda d: {k: getattr(d.stragglers.top_workers[0], k) for k in ("endpoint", "stage", "dp_rank")}  # noqa: E731
    assert top(bare) == top(full)


@pytest.mark.parametrize("pp", [2, 4])
def test_interleaved_schedule_leaves_stage_and_microbatch_unknown(pp):
    """Span order does not give microbatch ids (nor virtual stages) under interleaving: unknown, not wrong."""
    t = _sim_tables(schedule="interleaved", virtual_stages=2, pp=pp, microbatches=4, gemm_records=False)
    m = build_job_model(_stripped(t))
    comp = m.frames.compute_op
    assert comp["stage"].null_count() == comp.height and comp["microbatch"].null_count() == comp.height
    assert _agree(t["compute_op"], comp, "step") == 1.0
    assert m.notes and "interleaved" in m.notes[0]
    assert m.layout["stage"].null_count() == 0  # the rank's pipeline position is still known


def test_hangs_read_the_model_and_a_missing_rank_is_no_hang(monkeypatch):
    t = _sim_tables(dp=2, pp=2, microbatches=2, layers=4, gemm_records=False)
    frames = JobFrames.from_frames("j", **t)
    frames.declared = [{"format": "kineto", "world_size": 6, "source": "x"}]
    seen = {}
    real = diagnose_mod.hang_section

    def spy(model):
        seen["missing"] = list(model.coverage.missing_ranks)
        return real(model)

    monkeypatch.setattr(diagnose_mod, "hang_section", spy)
    d, _ = diagnose_mod.analyze_job(frames)
    assert seen["missing"] == [4, 5] == d.data_quality.missing_ranks
    assert d.hangs == []  # ranks 4 and 5 have no records at all: absent traces, not a hang
