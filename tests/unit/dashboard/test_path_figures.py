"""The critical path figures (issue 39): a chosen step's path over the per-rank timeline, and the share table."""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
import pytest

from rankscope.analysis.diagnose import analyze_job
from rankscope.analysis.report.steps import CriticalPath
from rankscope.collectors.job_frames import JobFrames
from rankscope.dashboard import figures, path_figures

sim = pytest.importorskip("rankscope.datasets.simulator")


@pytest.fixture(scope="module")
def analysed():
    res = sim.simulate(sim.SimConfig(job="j", dp=2, pp=2, tp=1, steps=4, microbatches=4, schedule="1f1b", seed=5,
                                     flows=False, gpus_per_host=2,
                                     faults=(sim.parse_fault("slow-worker:rank=3,factor=1.6"),)))
    tabs = {k: (v if isinstance(v, pl.DataFrame) else pl.from_arrow(v)) for k, v in res.tables.items()}
    frames = JobFrames.from_frames("j", **{k: v for k, v in tabs.items()
                                         if k in ("comm_op", "compute_op", "step_mark", "batch_meta")})
    return analyze_job(frames)


def test_the_chosen_steps_path_is_drawn_over_the_timeline(analysed):
    d, tables = analysed
    cp = d.critical_path
    fig = figures.all_figures(d, tables)["critical_path"]
    menu = fig.layout.updatemenus[0]
    # one menu entry per listed step; each shows that step's traces only
    assert [b.label for b in menu.buttons] == [f"step {p.step}" for p in cp.steps]
    for b in menu.buttons:
        assert any(b.args[0]["visible"]) and not all(b.args[0]["visible"])
    shown = [t for t in fig.data if t.visible]
    line = [t for t in shown if isinstance(t, go.Scatter)]
    assert len(line) == 1 and 3 in {int(v) for v in line[0].y}  # the slow rank is on the first step's path
    # the backdrop: the step's per-rank phases from the timeline table
    assert any(isinstance(t, go.Bar) and t.hoverinfo == "skip" for t in shown)
    bars = [t for t in shown if isinstance(t, go.Bar) and t.hoverinfo != "skip"]
    total = sum(sum(t.x) for t in bars)
    assert total == pytest.approx(cp.steps[0].time_ns / 1e6, rel=1e-6)


def test_share_table_lists_shares_slack_and_edits(analysed):
    d, _ = analysed
    fig = figures.all_figures(d)["path_shares"]
    by, what, value = fig.data[0].cells.values
    assert "rank" in by and "edit" in by and "op_class" in by
    first_rank = next(w for b, w in zip(by, what, strict=True) if b == "rank")
    assert first_rank == "3"
    assert any("slack" in v for v in value)


def test_no_path_says_why():
    fig = path_figures.critical_path_figure(CriticalPath(evaluated=False, why="no per-rank records"))
    assert "no per-rank records" in str(fig.layout.annotations[0].text)
