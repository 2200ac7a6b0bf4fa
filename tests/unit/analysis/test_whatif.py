"""What-if attribution on simulated jobs (generic dependency model) and its pure pieces."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.model.job_model import build_job_model
from rankscope.analysis.stragglers.config import StragglerConfig, verdict
from rankscope.analysis.stragglers.section import analyze_stragglers as model_stragglers
from rankscope.analysis.stragglers.section import straggler_section as model_section
from rankscope.analysis.whatif.build import build_graph, model_graph
from rankscope.analysis.whatif.graph import WhatIfInputError
from rankscope.analysis.whatif.scenarios import Scenarios, step_times
from rankscope.analysis.whatif.sequence import _fit_cols, fwd_bwd_pearson
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.job_frames import JobFrames

sim = pytest.importorskip("rankscope.datasets.simulator")


def analyze_stragglers(frames: JobFrames, config: StragglerConfig | None = None):
    """The straggler what-if of raw frames, through the one job model (completed frames, its layout)."""
    return model_stragglers(build_job_model(frames), config)


def straggler_section(frames: JobFrames, config: StragglerConfig | None = None):
    return model_section(build_job_model(frames), config)


def graph_of(frames: JobFrames):
    return model_graph(build_job_model(frames))


def sim_frames(*faults, dp=4, pp=2, seed=0) -> tuple[JobFrames, dict]:
    res = sim.simulate(sim.SimConfig(job="j", dp=dp, pp=pp, tp=1, steps=4, microbatches=4, schedule="1f1b",
                                     faults=tuple(faults), seed=seed, flows=False, gpus_per_host=2))
    tabs = {k: (v if isinstance(v, pl.DataFrame) else pl.from_arrow(v)) for k, v in res.tables.items()}
    kinds = ("comm_op", "compute_op", "step_mark", "batch_meta")
    return JobFrames.from_frames("j", **{k: v for k, v in tabs.items() if k in kinds}), res.truth


def test_replay_of_actual_reproduces_recorded_steps():
    frames, truth = sim_frames()
    g = graph_of(frames)
    assert g.model == "generic"
    replayed = g.step_times(g.actual)
    # the simulator's launch gaps are not in the replay, so it may only be a little shorter
    recorded = np.array(truth["step_times_ns"], dtype=float)
    assert replayed.shape == recorded.shape
    assert np.all(replayed <= recorded * 1.001) and np.all(replayed >= recorded * 0.97)
    # with the launch delays read off the trace, the replay gives back the recorded timeline
    start, end = g.replay(g.actual, g.launch_delays())
    rec_start, rec_end = g.ops["start_ns"].to_numpy(), g.ops["end_ns"].to_numpy()
    step_lo = np.full(len(g.steps), np.inf)
    np.minimum.at(step_lo, g.step_index, rec_start)
    origin = step_lo[g.step_index]  # every step replays from 0
    assert np.allclose(end, rec_end - origin, atol=2e3) and np.allclose(start, rec_start - origin, atol=2e3)


def test_clean_job_has_no_straggler():
    frames, _ = sim_frames(seed=3)
    s = straggler_section(frames)
    assert s.slowdown < 1.03 and s.verdict == "none"
    assert s.waste_fraction == pytest.approx(1 - 1 / s.slowdown)


def test_slow_worker_is_found_and_its_factor_recovered():
    frames, _ = sim_frames(sim.Fault("slow-worker", {"rank": 5, "factor": 1.6}))
    s, _ = analyze_stragglers(frames)
    assert s.verdict == "worker"
    assert s.top_workers[0].endpoint == 5
    assert s.top_workers[0].compute_vs_stage_peers == pytest.approx(1.6, rel=0.05)
    assert s.by_cause["worker"] > 0.5 and s.slowdown > 1.05
    heat = s.replay.heatmap
    assert len(heat.workers) == 8 and len(heat.slowdown[0]) == len(heat.steps) == 4


def test_stage_imbalance_and_slow_link_verdicts():
    s, _ = analyze_stragglers(sim_frames(sim.Fault("stage-imbalance", {"stage": 0, "factor": 1.8}))[0])
    assert s.verdict == "stage_imbalance"
    assert s.evidence["stage_imbalance"]["stage_vs_others"]["0"] == pytest.approx(1.8, rel=0.05)
    s, _ = analyze_stragglers(sim_frames(sim.Fault("slow-link", {"rank": 2, "factor": 5.0}), dp=4, pp=4)[0])
    assert s.verdict == "communication"
    assert s.evidence["communication"]["factor"] == pytest.approx(5.0, rel=0.05)


def test_sequence_skew_with_lengths():
    frames, _ = sim_frames(sim.Fault("seq-skew", {"sigma": 0.5}))
    s, _ = analyze_stragglers(frames)
    seq = s.evidence["sequence_imbalance"]
    assert seq["method"] == "lengths" and seq["detected"]
    assert s.verdict == "sequence_imbalance"
    # without lengths it is still seen, from forward/backward correlation
    s2, _ = analyze_stragglers(JobFrames.from_frames("j", comm_op=frames.comm_op, compute_op=frames.compute_op))
    assert s2.evidence["sequence_imbalance"]["method"] == "correlation"
    assert s2.evidence["sequence_imbalance"]["pearson"] >= 0.9


def test_batch_replay_matches_one_replay_per_scenario():
    frames, _ = sim_frames(sim.Fault("slow-worker", {"rank": 1, "factor": 1.3}))
    g = graph_of(frames)
    actual = g.actual
    ideal = actual * 0.5
    labels = g.ops["rank"].to_numpy().astype(np.int64)
    select = np.eye(8, dtype=bool)[[0, 1, 5]]
    remove = np.array([False, True, False])
    got = step_times(g, actual, ideal, Scenarios(labels, select, remove))
    for k in range(3):
        d = np.where(select[k][labels] != remove[k], actual, ideal)
        assert np.allclose(got[:, k], g.step_times(d))


def test_verdict_rules():
    cfg = StragglerConfig()
    assert verdict(1.02, {"worker": 1.0}, cfg) == "none"
    assert verdict(1.5, {"worker": 0.3, "stage_imbalance": 0.2}, cfg) == "mixed"
    assert verdict(1.5, {"worker": 0.95, "stage_imbalance": 1.0}, cfg) == "worker"  # tie: the specific cause
    assert verdict(1.5, {"worker": 0.2, "stage_imbalance": 1.0}, cfg) == "stage_imbalance"
    with pytest.raises(ConfigError):
        StragglerConfig(none_below=0.5)


def test_fit_and_pearson_helpers():
    s = np.array([100.0, 200, 400, 800, 1600])
    a, b, r2 = _fit_cols(np.column_stack([s, s * s]), 3 * s + 0.01 * s * s)
    assert a == pytest.approx(3) and b == pytest.approx(0.01) and r2 == pytest.approx(1)
    rng = np.random.default_rng(0)
    n = rng.uniform(1, 3, 64)
    base = {"rank": np.repeat([0, 1], 32), "step": np.tile(np.repeat([0, 1], 16), 2),
            "microbatch": np.tile(np.arange(16), 4)}
    cops = pl.concat([pl.DataFrame({**base, "optype": "forward-compute", "a": n}),
                      pl.DataFrame({**base, "optype": "backward-compute", "a": 2 * n + 0.01})])
    assert fwd_bwd_pearson(cops) > 0.99


def test_nothing_to_replay_is_an_unevaluated_section():
    empty = JobFrames.from_frames("j")
    with pytest.raises(WhatIfInputError):
        build_graph(empty)
    s = straggler_section(empty)
    assert s.evaluated is False and "nothing to replay" in s.why


def test_slow_member_of_a_tp_group_is_the_top_worker():
    """S_w ties inside a (dp rank, stage) cell; the slow TP member must still come first."""
    res = sim.simulate(sim.SimConfig(job="j", dp=4, pp=2, tp=2, steps=3, microbatches=4, schedule="1f1b",
                                     faults=(sim.Fault("slow-worker", {"rank": 5, "factor": 1.5}),),
                                     seed=0, flows=False, gpus_per_host=4))
    tabs = {k: pl.from_arrow(v) if not isinstance(v, pl.DataFrame) else v for k, v in res.tables.items()}
    frames = JobFrames.from_frames("j", **{k: tabs[k] for k in ("comm_op", "compute_op", "step_mark")})
    s, _ = analyze_stragglers(frames)
    assert s.top_workers[0].endpoint == 5
    assert s.verdict == "worker" and s.by_cause["worker"] > 0.5
