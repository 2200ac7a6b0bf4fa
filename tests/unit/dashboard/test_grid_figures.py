"""The strategy grid and the straggler heatmap stay legible from 4 to 4,096 ranks."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from rankscope.analysis.report.stragglers import Heatmap
from rankscope.analysis.report.strategy import Strategy
from rankscope.dashboard import grid_figures


def _piped(dp: int, pp: int) -> Strategy:
    pipes = [[p * pp + s for s in range(pp)] for p in range(dp)]
    dpg = [[p * pp + s for p in range(dp)] for s in range(pp)]
    return Strategy(world_size=dp * pp, dp=dp, pp=pp, tp=1, dp_groups=dpg, pp_groups=pipes, confidence=1.0)


def _heat(world: int, steps: int, slow: dict[int, float], seed: int = 0) -> Heatmap:
    rng = np.random.default_rng(seed)
    z = 1.06 + np.abs(rng.normal(0, 0.002, (world, steps)))
    for r, extra in slow.items():
        z[r] += extra
    return Heatmap(workers=list(range(world)), steps=list(range(steps)), slowdown=z.tolist())


def test_small_grid_rows_are_replicas_columns_stages_with_rank_labels():
    fig = grid_figures.strategy_figure(_piped(2, 2))
    (heat,) = fig.data
    assert [list(r) for r in heat.text] == [["0", "1"], ["2", "3"]] and heat.texttemplate == "%{text}"
    assert fig.layout.xaxis.title.text == "pipeline stage" and "DP replica" in fig.layout.yaxis.title.text


def test_512_ranks_keep_labels_and_colour_by_score_not_by_32_groups():
    s = _piped(64, 8)
    fig = grid_figures.strategy_figure(s, _heat(512, 3, {300: 0.5}))
    (heat,) = fig.data
    assert np.shape(heat.z) == (64, 8) and heat.texttemplate == "%{text}"  # every rank named in its cell
    assert heat.colorscale is not None and heat.zmid is not None  # one diverging scale, centred on the median
    row, col = 300 // 8, 300 % 8
    assert heat.text[row][col] == "300" and heat.z[row][col] == np.nanmax(np.array(heat.z, dtype=float))
    assert "rank 300" in heat.hovertext[row][col] and "stage 4" in heat.hovertext[row][col]


def test_4096_ranks_are_binned_by_dp_replica_with_the_worst_rank_on_hover():
    s = _piped(512, 8)
    fig = grid_figures.strategy_figure(s, _heat(4096, 2, {1234: 0.8}))
    (heat,) = fig.data
    assert np.shape(heat.z) == (64, 8) and heat.texttemplate is None
    # rank 1234 is pipeline 154, stage 2: bin 154 // 8 = 19
    assert "worst rank 1234" in heat.hovertext[19][2] and "DP replicas 152-159" in heat.hovertext[19][2]
    assert len(fig.to_json()) < 400_000


def test_pure_dp_wraps_into_a_square():
    n = 4096
    s = Strategy(world_size=n, dp=n, pp=1, dp_groups=[list(range(n))], pp_groups=[[r] for r in range(n)])
    fig = grid_figures.strategy_figure(s)
    assert np.shape(fig.data[0].z) == (64, 64) and fig.data[0].texttemplate is None
    assert fig.data[0].hovertext[1][0].startswith("rank 64<br>")


def test_heatmap_is_centred_on_the_median_so_a_stage_wide_slowdown_is_a_band():
    s = _piped(8, 4)
    slow_stage = {r: 0.01 for r in range(32) if r % 4 == 2}  # stage 2 all 1% slower, one rank 40% slower
    slow_stage[5] = 0.4
    fig = grid_figures.heatmap_figure(_heat(32, 4, slow_stage), s)
    (h,) = fig.data
    z = np.array(h.z, dtype=float)
    assert h.zmin < h.zmid < h.zmax and abs(h.zmid - float(np.median(z))) < 1e-12
    rows = list(h.y)
    stage2 = [i for i, y in enumerate(rows) if "(stage 2)" in y]
    assert stage2 == list(range(16, 24))  # rows ordered by stage: stage 2 is one contiguous band
    # the band sits above the centre, every other stage at or below the band's lowest value
    others = [i for i in range(32) if i not in stage2]
    assert z[stage2].min() > h.zmid and np.median(z[stage2]) > np.median(z[others]) + 0.008
    # the band reaches most of the way to the scale's end; the single extreme rank saturates past it
    assert (np.median(z[stage2]) - h.zmid) / (h.zmax - h.zmid) > 0.6 and h.zmax < 1.06 + 0.4


def test_big_heatmap_bins_ranks_within_a_stage_and_keeps_a_lone_straggler():
    s = _piped(256, 8)
    fig = grid_figures.heatmap_figure(_heat(2048, 3, {1000: 0.5}), s, max_rows=256)
    (h,) = fig.data
    assert len(h.y) == 256 and all(y.startswith("ranks ") for y in h.y)
    z = np.array(h.z, dtype=float)
    worst = h.y[int(np.argmax(z.mean(axis=1)))]
    assert "(stage 0)" in worst  # rank 1000 = pipeline 125, stage 0
    lo, hi = (int(x) for x in worst.split()[1].split(".."))
    assert lo <= 1000 <= hi or 1000 in range(lo, hi + 1, 8)
    assert list(fig.layout.yaxis.ticktext)[:2] == ["stage 0", "stage 1"]


def test_empty_inputs_say_what_is_missing():
    fig = grid_figures.heatmap_figure(None)
    assert isinstance(fig, go.Figure) and "did not run" in fig.layout.annotations[0].text
    assert "no groups" in grid_figures.strategy_figure(Strategy()).layout.annotations[0].text
