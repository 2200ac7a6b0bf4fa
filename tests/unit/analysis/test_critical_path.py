"""The critical path on simulated jobs with known faults (issue 39): its segments add up to the step, and the top
edit names the injected fault and predicts the step time of a re-simulation without it."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.critical_path import critical_path_section, path_of_graph
from rankscope.analysis.model.job_model import build_job_model
from rankscope.analysis.whatif.build import model_graph
from rankscope.analysis.whatif.metrics import ideal_durations
from rankscope.collectors.job_frames import JobFrames

sim = pytest.importorskip("rankscope.datasets.simulator")

COSTLY = 0.05
"""a fault that costs at least this share of the step time must be named by the top edit."""


def _frames(cfg) -> JobFrames:
    res = sim.simulate(cfg)
    tabs = {k: (v if isinstance(v, pl.DataFrame) else pl.from_arrow(v)) for k, v in res.tables.items()}
    kinds = ("comm_op", "compute_op", "step_mark", "batch_meta")
    return JobFrames.from_frames(cfg.job, **{k: v for k, v in tabs.items() if k in kinds})


def _path(frames: JobFrames):
    g = model_graph(build_job_model(frames))
    return path_of_graph(g, ideal_durations(g), hooks_only=False)


def _names(edit, fault: str, p: dict, stage_ranks: list[int]) -> bool:
    if fault == "slow-worker":
        return edit.ranks == [p["rank"]]
    if fault == "stage-imbalance":
        return (edit.kind == "stage" and edit.stage == p["stage"]) or (edit.kind == "worker" and edit.ranks == stage_ranks)
    return edit.kind == "link" and p["rank"] in edit.ranks


def _job(rng: np.random.Generator, i: int):
    dp, pp = int(rng.choice([2, 4])), int(rng.choice([2, 4]))
    kind = ("slow-worker", "stage-imbalance", "slow-link")[i % 3]
    world = dp * pp
    if kind == "slow-worker":
        p = {"rank": int(rng.integers(world)), "factor": round(float(rng.uniform(1.15, 2.0)), 2)}
    elif kind == "stage-imbalance":
        p = {"stage": int(rng.integers(pp)), "factor": round(float(rng.uniform(1.2, 2.0)), 2)}
    else:
        p = {"rank": int(rng.integers(world)), "factor": round(float(rng.uniform(4.0, 16.0)), 1)}
    text = kind + ":" + ",".join(f"{k}={v}" for k, v in p.items())
    base = dict(job=f"j{i}", dp=dp, pp=pp, tp=1, steps=4, microbatches=4, schedule="1f1b", seed=100 + i,
                flows=False, gpus_per_host=2)
    return kind, p, sim.SimConfig(**base, faults=(sim.parse_fault(text),)), sim.SimConfig(**base)


def test_top_edit_names_the_injected_fault_and_predicts_the_clean_step():
    rng = np.random.default_rng(39)
    named, costly, errs, rows = 0, 0, [], []
    for i in range(24):
        kind, p, faulty, clean = _job(rng, i)
        c = _path(_frames(faulty))
        t_clean = _path(_frames(clean)).step_time_ns
        cost = c.step_time_ns / t_clean - 1
        if cost < COSTLY:
            rows.append(f"{kind} {p}: costs {cost:.3f}, below {COSTLY}")
            continue
        costly += 1
        layout = build_job_model(_frames(clean)).layout
        stage_ranks = sorted(layout.filter(pl.col("stage") == p.get("stage", -1))["rank"].to_list())
        top = c.edits[0]
        ok = _names(top, kind, p, stage_ranks)
        named += ok
        err = abs(top.predicted_step_ns / t_clean - 1)
        errs.append(err)
        rows.append(f"{kind} {p}: costs {cost:.3f}; top edit {top.kind} {top.ranks} stage {top.stage} "
                    f"{'names it' if ok else 'MISSES'}; predicted vs re-simulated {err:.4f}")
    print("\n".join(rows))
    print(f"top edit names the fault on {named}/{costly} costly jobs; predicted step within "
          f"{max(errs):.4f} (worst) / {np.median(errs):.4f} (median) of the re-simulation without it")
    assert costly >= 12
    assert named / costly >= 0.95
    assert max(errs) <= 0.02


def test_segments_add_up_and_slack_is_zero_on_the_path():
    frames = _frames(sim.SimConfig(job="j", dp=2, pp=2, tp=1, steps=4, microbatches=4, schedule="1f1b", seed=3,
                                   flows=False, gpus_per_host=2, faults=(sim.parse_fault("slow-worker:rank=2"),)))
    c = _path(frames)
    for s in c.steps:
        assert sum(o.duration_ns for o in s.ops) == pytest.approx(s.time_ns, rel=1e-9)
        # a chain: each piece starts where the one before ended
        ends = [o.start_ns + o.duration_ns for o in s.ops[:-1]]
        assert np.allclose(ends, [o.start_ns for o in s.ops[1:]], atol=1.0)
    # the rank whose op ends a step could not have ended later: no slack in that step
    for s in c.steps:
        assert c.slack_by_rank[str(s.ops[-1].rank)]["min_ns"] == 0.0
    assert c.share["rank"]["2"] == max(c.share["rank"].values())


def test_hook_only_records_say_what_the_path_cannot_show():
    frames = _frames(sim.SimConfig(job="j", dp=2, pp=2, tp=1, steps=4, microbatches=4, schedule="1f1b", seed=3,
                                   flows=False, gpus_per_host=2))
    hooks = JobFrames.from_frames("j", comm_op=frames.comm_op, step_mark=frames.step_mark)
    c = critical_path_section(build_job_model(hooks))
    assert c.evaluated and c.basis == "hooks" and "cannot name the compute op" in c.limits
    assert "launch_gap" in c.share["op_class"]
    assert all(e.kind == "link" for e in c.edits)
