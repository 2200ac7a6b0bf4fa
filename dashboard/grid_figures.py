"""The two rank-grid figures, aggregated so a job of thousands of ranks stays legible:

- the strategy grid: one cell per (pipeline stage, DP replica), coloured by the
  rank's straggler score, with DP replicas binned into at most ``max_rows`` rows;
- the straggler heatmap: one image row per rank (or per bin of ranks of one
  stage), ordered by stage then DP replica, with a diverging colour scale centred
  on the median so a stage-wide slowdown shows as a band and one slow rank as a line.

Both draw one go.Heatmap trace whatever the job size; hover gives the detail.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go
import polars as pl

from rankscope.analysis.report import Heatmap, degree_text
from rankscope.dashboard.table_figures import LAYOUT, as_frame, empty_figure

if TYPE_CHECKING:
    from rankscope.analysis.report import Strategy

RANK_COLUMNS = ("rank", "endpoint", "worker")
DIVERGING = "RdBu_r"
SCORE_TITLE = "S_w: step-time slowdown<br>this rank causes"


def _rank_col(df: pl.DataFrame) -> str | None:
    return next((c for c in RANK_COLUMNS if c in df.columns), None)


def strategy_layout(strategy: Strategy) -> pl.DataFrame:
    """Each endpoint's DP group index, pipeline index and stage, from the report groups.

    Returns columns endpoint (str), dp_group, pipeline, stage (-1 where a group list is missing).
    """
    rows: dict[str, list[int]] = {}

    def slot(ep) -> list[int]:
        return rows.setdefault(str(ep), [-1, -1, -1])

    for g, members in enumerate(strategy.dp_groups or []):
        for ep in members:
            slot(ep)[0] = g
    for p, members in enumerate(strategy.pp_groups or []):
        for s, ep in enumerate(members):
            slot(ep)[1], slot(ep)[2] = p, s
    if not rows:
        return pl.DataFrame(schema={"endpoint": pl.String, "dp_group": pl.Int64, "pipeline": pl.Int64,
                                    "stage": pl.Int64})
    vals = list(zip(*rows.values()))
    return pl.DataFrame({"endpoint": list(rows), "dp_group": list(vals[0]), "pipeline": list(vals[1]),
                         "stage": list(vals[2])})


def heatmap_matrix(heat: Any) -> tuple[list, list, list] | None:
    """(workers, steps, rows of slowdown) from the report's Heatmap or a long table; None when absent."""
    if isinstance(heat, Heatmap):
        if not heat.slowdown:
            return None
        return [str(w) for w in heat.workers], list(heat.steps), [list(r) for r in heat.slowdown]
    df = as_frame(heat)
    if df is None or "step" not in df.columns or _rank_col(df) is None:
        return None
    val = "slowdown" if "slowdown" in df.columns else next(
        (c for c in df.columns if c not in (*RANK_COLUMNS, "step") and df[c].dtype.is_numeric()), None)
    if val is None:
        return None
    rc = _rank_col(df)
    wide = (df.select(pl.col(rc).cast(pl.String).alias("w"), pl.col("step"), pl.col(val).cast(pl.Float64))
            .pivot(on="step", index="w", values=val, aggregate_function="mean"))
    steps = sorted(wide.columns[1:], key=lambda s: int(s) if str(s).lstrip("-").isdigit() else str(s))
    wide = wide.select("w", *steps)
    return wide["w"].to_list(), steps, wide.drop("w").rows()


def rank_scores(heat: Any) -> dict[str, float]:
    """Each worker's mean S_w over the steps of the straggler heatmap (empty when there is none)."""
    m = heatmap_matrix(heat)
    if m is None:
        return {}
    z = np.array(m[2], dtype=float)
    with np.errstate(all="ignore"):
        means = np.nanmean(z, axis=1) if z.size else np.array([])
    return {w: float(v) for w, v in zip(m[0], means) if np.isfinite(v)}


def centred_range(z: np.ndarray, floor: float = 0.01) -> tuple[float, float, float] | None:
    """(zmin, zmid, zmax) centred on the median cell. The half-width is the 90th percentile of the rows'
    (median) deviation from it, so a stage-wide shift sets the scale while a few extreme ranks saturate
    instead of washing the rest out; it is never under ``floor`` x the median (differences below ~1 % are
    noise and should not look like blotches)."""
    vals = z[np.isfinite(z)]
    if not vals.size:
        return None
    mid = float(np.median(vals))
    with np.errstate(all="ignore"):
        rows = np.nanmedian(z, axis=1) if z.ndim == 2 else z
    rows = rows[np.isfinite(rows)]
    half = max(float(np.percentile(np.abs(rows - mid), 90)), floor * abs(mid), 1e-9)
    return mid - half, mid, mid + half


def _bins(n: int, limit: int) -> int:
    return max(1, math.ceil(n / limit))


def strategy_figure(strategy: Strategy, heat: Any = None, max_rows: int = 64, max_labels: int = 1024) -> go.Figure:
    """The ranks as a grid: columns are pipeline stages, rows DP replicas (pipelines); with PP = 1 the
    replicas wrap into a square. Colour is the rank's mean S_w (centred on the median) when the straggler
    heatmap exists, else alternating shades per stage. More than ``max_rows`` rows are binned (a cell then
    shows its worst rank on hover); rank ids are written in the cells while there are at most ``max_labels``."""
    lay = strategy_layout(strategy)
    title = f"Strategy: DP={degree_text(strategy.dp)} PP={degree_text(strategy.pp)} TP={degree_text(strategy.tp)} over {strategy.world_size} endpoints " \
            f"(confidence {strategy.confidence:.2f})"
    if lay.height == 0:
        return empty_figure(title, "no groups inferred (no DP or pipeline groups found)")
    n = lay.height
    piped = (strategy.pp or 1) > 1 and bool((lay["pipeline"] >= 0).all())
    if piped:
        lay = lay.with_columns(row=pl.col("pipeline"), col=pl.col("stage"))
        xt, yt = "pipeline stage", "DP replica (pipeline)"
    else:
        width = max(1, math.ceil(math.sqrt(n)))
        lay = lay.with_row_index("i").with_columns(row=pl.col("i").cast(pl.Int64) // width,
                                                   col=pl.col("i").cast(pl.Int64) % width).drop("i")
        xt, yt = f"column (DP replica = row x {width} + column)", "row"
    scores = rank_scores(heat)
    lay = lay.with_columns(score=pl.col("endpoint").replace_strict(scores, default=None, return_dtype=pl.Float64))
    nrow = int(lay["row"].max()) + 1
    b = _bins(nrow, max_rows)
    lay = lay.with_columns(brow=pl.col("row") // b)
    cells = (lay.sort(pl.col("score").fill_null(-math.inf), descending=True)
             .group_by("brow", "col", maintain_order=True)
             .agg(pl.len().alias("n"), pl.col("endpoint").first().alias("worst"), pl.col("score").max(),
                  pl.col("row").min().alias("r0"), pl.col("row").max().alias("r1"),
                  pl.col("stage").first(), pl.col("dp_group").first()))
    nb, ncol = int(cells["brow"].max()) + 1, int(cells["col"].max()) + 1
    rows, cols = cells["brow"].to_numpy(), cells["col"].to_numpy()
    if scores:
        z = np.full((nb, ncol), np.nan)
        z[rows, cols] = cells["score"].fill_null(np.nan).to_numpy()
        rng = centred_range(z.ravel())
    else:
        z = np.full((nb, ncol), np.nan)
        z[rows, cols] = (cells["col"] % 2).to_numpy().astype(float)
        rng = None
    score_txt = pl.when(pl.col("score").is_null()).then(pl.lit("n/a")).otherwise(
        pl.col("score").round(3).cast(pl.String))
    if b == 1:
        hov = cells.select(pl.format("rank {}<br>stage {}, DP replica {}<br>DP group {}<br>mean S_w {}",
                                     "worst", "stage", "r0", "dp_group", score_txt)).to_series()
    else:
        hov = cells.select(pl.format("stage {}, DP replicas {}-{} ({} ranks)<br>worst rank {}: mean S_w {}",
                                     "stage", "r0", "r1", "n", "worst", score_txt)).to_series()
    hover = np.full((nb, ncol), "", dtype=object)
    hover[rows, cols] = hov.to_numpy()
    label = np.full((nb, ncol), "", dtype=object)
    label[rows, cols] = cells["worst"].to_numpy()
    show_labels = b == 1 and n <= max_labels
    trace = dict(z=z, text=label, hovertext=hover, hoverinfo="text", xgap=1, ygap=1,
                 texttemplate="%{text}" if show_labels else None, textfont=dict(size=10 if ncol <= 16 else 8))
    if rng:
        trace.update(colorscale=DIVERGING, zmin=rng[0], zmid=rng[1], zmax=rng[2],
                     colorbar=dict(title=dict(text="mean " + SCORE_TITLE, side="right")))
    else:
        trace.update(colorscale=[[0, "#dfe7f1"], [1, "#b9cadf"]], showscale=False, zmin=0, zmax=1)
    fig = go.Figure(go.Heatmap(**trace))
    if b > 1:
        ticks = list(range(0, nb, max(1, nb // 16)))
        fig.update_yaxes(tickvals=ticks, ticktext=[f"{t * b}-{min(nrow, (t + 1) * b) - 1}" for t in ticks])
        yt += f" (binned by {b})"
    fig.update_xaxes(title_text=xt, dtick=1 if ncol <= 32 else None, showgrid=False, zeroline=False)
    fig.update_yaxes(title_text=yt, autorange="reversed", dtick=1 if nb <= 32 and b == 1 else None,
                     showgrid=False, zeroline=False)
    fig.update_layout(title=title, **{**LAYOUT, "height": min(1300, 180 + 17 * nb)})
    return fig


def _row_order(workers: list[str], strategy: Strategy | None) -> tuple[np.ndarray, list[int | None]]:
    """Rows ordered by (stage, DP replica, worker) when the strategy places them, else as given."""
    lay = strategy_layout(strategy) if strategy is not None else None
    place: dict[str, tuple[int, int]] = {}
    if lay is not None and lay.height:
        place = {e: (s, p) for e, s, p in lay.select("endpoint", "stage", "pipeline").iter_rows()}
    keys = [place.get(w, (10**9, 10**9)) for w in workers]
    order = np.array(sorted(range(len(workers)), key=lambda i: (keys[i], i)), dtype=int)
    stages = [keys[i][0] if keys[i][0] < 10**9 and keys[i][0] >= 0 else None for i in order]
    return order, stages


def heatmap_figure(heat: Any, strategy: Strategy | None = None, max_rows: int = 256) -> go.Figure:
    """Worker x step S_w as an image: rows ordered by stage then DP replica; past ``max_rows`` ranks the
    rows of one stage are binned (the bin's worst value drawn, so a single slow rank stays visible)."""
    title = "Straggler heatmap: S_w per rank per step (red = slower than the median rank)"
    m = heatmap_matrix(heat)
    if m is None:
        return empty_figure(title, "no per-rank, per-step slowdown: the straggler what-if did not run")
    workers, steps, vals = m
    z = np.array(vals, dtype=float)  # None -> NaN (a worker absent from a step)
    order, stages = _row_order(workers, strategy)
    z = z[order]
    names = [workers[i] for i in order]
    n = len(names)
    b = _bins(n, max_rows)
    labels, rows, row_stage = [], [], []
    i = 0
    while i < n:  # bins never straddle a stage boundary
        j = i
        while j < n and j - i < b and stages[j] == stages[i]:
            j += 1
        with np.errstate(all="ignore"):
            rows.append(np.nanmax(z[i:j], axis=0) if j - i > 1 else z[i])
        where = f" (stage {stages[i]})" if stages[i] is not None else ""
        labels.append(f"rank {names[i]}{where}" if j - i == 1 else f"ranks {names[i]}..{names[j - 1]}{where}")
        row_stage.append(stages[i])
        i = j
    shown = np.vstack(rows) if rows else z
    rng = centred_range(shown)
    if rng is None:
        return empty_figure(title, "every per-rank slowdown is missing")
    fig = go.Figure(go.Heatmap(z=shown, x=[str(s) for s in steps], y=labels, colorscale=DIVERGING, zmin=rng[0],
                               zmid=rng[1], zmax=rng[2],
                               colorbar=dict(title=dict(text=SCORE_TITLE, side="right")),
                               hovertemplate="%{y}, step %{x}: S_w %{z:.3f}<extra></extra>"))
    yaxis = dict(title="rank, by stage then DP replica" + (f" (max of {b} per row)" if b > 1 else ""),
                 type="category", autorange="reversed")
    starts = [k for k, s in enumerate(row_stage) if s is not None and (k == 0 or row_stage[k - 1] != s)]
    if len(labels) > 48 and starts:
        yaxis.update(tickvals=[labels[k] for k in starts], ticktext=[f"stage {row_stage[k]}" for k in starts])
    elif len(labels) > 48:
        yaxis.update(showticklabels=False)
    if b > 1:
        title += f": {n} ranks in {len(labels)} rows"
    fig.update_layout(title=title, xaxis_title="step", yaxis=yaxis,
                      **{**LAYOUT, "height": min(900, 220 + 10 * len(labels))})
    return fig
