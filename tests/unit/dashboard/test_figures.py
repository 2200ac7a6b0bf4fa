"""Figures draw what the Diagnosis and tables say, and stay small for big jobs."""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
import pytest

from rankscope.analysis.report.diagnosis import Diagnosis
from rankscope.analysis.report.steps import RankPhases, Steps
from rankscope.analysis.report.stragglers import Heatmap, ReplayDetail, Stragglers, WhatIf
from rankscope.analysis.report.strategy import Strategy
from rankscope.dashboard import figures, table_figures


def _strategy_2x2() -> Strategy:
    return Strategy(world_size=4, dp=2, pp=2, tp=1, dp_groups=[[0, 2], [1, 3]], pp_groups=[[0, 1], [2, 3]],
                    confidence=1.0)


def _timeline(nranks: int, nsteps: int, slow: int) -> pl.DataFrame:
    rows = []
    for r in range(nranks):
        for s in range(nsteps):
            comp = 60 if r == slow else 30
            rows.append(dict(rank=r, step=s, start_ns=s * 100 + r, end_ns=s * 100 + r + 100, duration_ns=100,
                             compute_ns=comp, comm_ns=20, exposed_comm_ns=10, idle_ns=90 - comp,
                             exposed_wait_ns=100 - comp))
    return pl.DataFrame(rows)


def _annotation(fig: go.Figure) -> str:
    return " ".join(a.text for a in fig.layout.annotations)


def test_strategy_layout_maps_groups_to_grid():
    lay = figures.strategy_layout(_strategy_2x2()).sort("endpoint")
    assert lay["dp_group"].to_list() == [0, 1, 0, 1]
    assert lay["pipeline"].to_list() == [0, 0, 1, 1]
    assert lay["stage"].to_list() == [0, 1, 0, 1]


def test_strategy_without_groups_says_so():
    assert "no groups" in _annotation(figures.strategy_figure(Strategy()))


def test_phase_durations_stack_to_the_step():
    ph = figures.phase_durations(_timeline(3, 2, slow=1))
    total = ph["compute_ns"] + ph["comm_ns"] + ph["wait_ns"]
    assert total.to_list() == [100.0] * 6
    assert ph.filter(pl.col("rank") == "1")["compute_ns"].to_list() == [60.0, 60.0]


def test_phase_span_rows_are_summed_per_rank_and_step():
    spans = pl.DataFrame(dict(rank=[0, 0, 0], step=[1, 1, 1], phase=["compute", "compute", "exposed_wait"],
                              start_ns=[0, 10, 30], end_ns=[5, 20, 40]))
    ph = figures.phase_durations(spans)
    assert ph.row(0, named=True) | {} == dict(rank="0", step=1, start_ns=0, compute_ns=15.0, comm_ns=0.0,
                                              wait_ns=10.0)


def test_timeline_bars_start_where_the_previous_phase_ends():
    fig = figures.timeline_figure(_timeline(2, 1, slow=0))
    comp, comm, wait = fig.data
    assert len(comp.y) == 2
    # rank 0 step 0 starts at 0 ns; compute 60 ns -> comm bar starts 60 ns = 6e-5 ms later
    assert abs(comm.base[0] - (comp.base[0] + comp.x[0])) < 1e-12
    assert abs(wait.base[0] - (comm.base[0] + comm.x[0])) < 1e-12


def test_timeline_of_many_ranks_is_capped_and_keeps_the_slow_one():
    fig = figures.timeline_figure(_timeline(500, 2, slow=317), max_ranks=40, max_steps=1)
    ranks = set(fig.data[0].y)
    assert len(ranks) <= 40 and "317" in ranks
    assert len(fig.data) == 3 and len(fig.data[0].y) == len(ranks)  # one step shown
    assert "40 of 500 ranks" in fig.layout.title.text


def test_per_rank_totals_without_steps_are_one_bar_per_rank():
    totals = [dict(rank=r, compute_ns=10 * (r + 1), exposed_comm_ns=5, idle_ns=1, comm_ns=7) for r in range(3)]
    fig = figures.timeline_figure(totals)
    assert list(fig.data[0].x) == pytest.approx([1e-5, 2e-5, 3e-5])
    assert "per-rank totals" in fig.layout.title.text


def test_step_series_from_boundaries():
    d = Diagnosis(job="j", steps=Steps(count=3, median_ns=2e6, boundaries_ns=[0, 1_000_000, 3_000_000, 6_000_000]))
    fig = figures.step_series_figure(d)
    assert list(fig.data[0].y) == [1.0, 2.0, 3.0]


def test_step_series_prefers_reported_durations():
    d = Diagnosis(job="j", steps=Steps(count=2, median_ns=5e6, boundaries_ns=[0, 1],
                                       durations_ns=[4_000_000, 6_000_000]))
    assert list(figures.step_series_figure(d).data[0].y) == [4.0, 6.0]


def test_heatmap_long_and_report_forms_agree():
    long = [dict(worker=w, step=s, slowdown=1 + w / 10 + s / 100) for w in range(3) for s in range(2)]
    wide = Heatmap(workers=[0, 1, 2], steps=[0, 1], slowdown=[[1 + w / 10 + s / 100 for s in range(2)]
                                                               for w in range(3)])
    a, b = figures.heatmap_matrix(long), figures.heatmap_matrix(wide)
    assert a[0] == b[0] == ["0", "1", "2"]
    assert [[round(x, 9) for x in r] for r in a[2]] == [[round(x, 9) for x in r] for r in b[2]]


def test_optype_bars_sorted_with_reference_line():
    fig = figures.optype_figure(Stragglers(by_optype={"fwd": 1.1, "bwd": 1.4, "dp": 1.0}))
    assert list(fig.data[0].x) == ["bwd", "fwd", "dp"]
    assert fig.layout.shapes[0].y0 == 1.0
    assert "not evaluated" in _annotation(figures.optype_figure(Stragglers()))


def test_tables_show_rows_and_say_when_empty():
    fig = table_figures.hangs_figure([{"group": "dp0", "seq": 7, "missing": [3, 5]}])
    cells = fig.data[0].cells.values
    assert list(fig.data[0].header.values) == ["group", "seq", "missing"]
    assert [c[0] for c in cells] == ["dp0", "7", "3, 5"]
    assert "no hangs" in _annotation(table_figures.hangs_figure([]))
    big = table_figures.table_figure([{"a": i} for i in range(500)], "t", max_rows=50)
    assert len(big.data[0].cells.values[0]) == 50 and "first 50 of 500" in big.layout.title.text


def test_all_figures_reads_heatmap_and_timeline_from_the_diagnosis():
    d = Diagnosis(job="j", strategy=_strategy_2x2(),
                  stragglers=Stragglers(replay=ReplayDetail(
                      by_dp_rank={}, by_stage={}, stage_fix_share={}, per_step={},
                      heatmap=Heatmap(workers=[0], steps=[0], slowdown=[[1.2]]), launch_delay={}, graph={})),
                  steps=Steps(phases_by_rank=[RankPhases(rank=0, compute_ns=5, comm_ns=1, exposed_comm_ns=1,
                                                         idle_ns=0, exposed_wait_ns=1)]))
    figs = figures.all_figures(d)
    assert set(figs) >= {"strategy", "step_series", "timeline", "heatmap", "optype", "cause", "regressions",
                         "hangs"}
    assert isinstance(figs["heatmap"].data[0], go.Heatmap)
    assert list(figs["timeline"].data[0].y) == ["0"]


def test_heatmap_as_the_straggler_section_writes_it():
    heat = Heatmap(workers=[0, 1], steps=[5, 6], slowdown=[[1.0, 1.1], [1.4, 1.5]])
    fig = figures.heatmap_figure(heat)
    assert [list(r) for r in fig.data[0].z] == [[1.0, 1.1], [1.4, 1.5]] and list(fig.data[0].x) == ["5", "6"]


def test_step_series_overlays_per_step_slowdown():
    d = Diagnosis(job="j", steps=Steps(count=2, boundaries_ns=[0, 1_000_000, 2_000_000]),
                  stragglers=Stragglers(steps=[0, 1], whatif=WhatIf(model="generic", verdict_shares={},
                                                                    verdict_stage=None, T_ns=1.0, T_ideal_ns=1.0,
                                                                    step_slowdown=[1.2, 1.3])))
    fig = figures.step_series_figure(d)
    assert list(fig.data[1].y) == [1.2, 1.3] and fig.data[1].yaxis == "y2"


def test_regression_tables_lead_with_kernel_ratio_reason():
    fig = table_figures.regressions_figure([{"comparison": "baseline", "reason": "k=4095 misaligned", "ratio": 0.4,
                                       "kernel": "gemm_fc1", "extra": 1}])
    assert list(fig.data[0].header.values) == ["kernel", "ratio", "reason", "comparison", "extra"]
