"""The critical path figures: a chosen step's path over the per-rank timeline, and the share table.

Both read the Diagnosis' ``critical_path`` section only (and the timeline table for the backdrop);
the step is chosen in the figure itself (a menu of the listed steps), so it needs no server round trip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go
import polars as pl

from rankscope.dashboard.table_figures import LAYOUT, as_frame, empty_figure

if TYPE_CHECKING:  # annotations only, as figures.py: the page starts faster without the report types
    from rankscope.analysis.report import CriticalPath

CLASS_COLOURS = {"compute": "#4C78A8", "communication": "#F58518", "launch_gap": "#9D9D9D"}
BACKDROP = (("compute_ns", "rank's compute"), ("comm_ns", "rank's communication"))
MAX_ROWS = 12
"""rows per breakdown in the share table."""


def _backdrop(timeline: Any, step: int) -> list[go.Bar]:
    """The step's per-rank phases (stacked from 0, as the replay starts every rank) behind the path.

    Columns go to plotly as numpy arrays: it validates a list element by element, and at 4,096 ranks x 16
    listed steps that took most of a cached ``analyze``'s 5 s HTML page."""
    df = as_frame(timeline)
    if df is None or "step" not in df.columns or "rank" not in df.columns:
        return []
    df = df.filter(pl.col("step") == step)
    if df.is_empty():
        return []
    # integers on the category axis: an object array of strings is deep-copied element by element
    ranks = df["rank"].cast(pl.Int64).to_numpy()
    base = np.zeros(df.height)
    out = []
    for col, label in BACKDROP:
        if col not in df.columns:
            continue
        x = df[col].cast(pl.Float64).fill_null(0.0).to_numpy() / 1e6
        out.append(go.Bar(y=ranks, x=x, base=base, orientation="h", name=label,
                          marker_color="#dfe5ec" if col == "compute_ns" else "#f3e3d3", opacity=0.8,
                          hoverinfo="skip", legendgroup="backdrop", showlegend=False))
        base = base + x
    return out


def _step_traces(path, timeline: Any, visible: bool) -> list[go.BaseTraceType]:
    traces: list[go.BaseTraceType] = list(_backdrop(timeline, path.step))
    ops = path.ops
    rank = np.array([o.rank for o in ops], dtype=np.int64)
    start = np.array([o.start_ns for o in ops], dtype=np.float64) / 1e6
    dur = np.array([o.duration_ns for o in ops], dtype=np.float64) / 1e6
    cls_of = np.array([o.op_class for o in ops], dtype=object)
    info = np.array([[o.op, o.link or "", "" if o.waited_for is None else o.waited_for] for o in ops], dtype=object)
    for cls, colour in CLASS_COLOURS.items():
        mine = cls_of == cls
        if not mine.any():
            continue
        traces.append(go.Bar(
            y=rank[mine], x=dur[mine], base=start[mine], orientation="h", name=cls, marker_color=colour,
            customdata=info[mine],
            hovertemplate="rank %{y}: %{customdata[0]}<br>%{x:.3f} ms from %{base:.3f} ms"
                          "<br>%{customdata[1]} waited for rank %{customdata[2]}<extra>" + cls + "</extra>"))
    # the path itself: from piece to piece, across ranks
    xs = np.column_stack([start, start + dur]).reshape(-1)
    ys = np.repeat(rank, 2)
    traces.append(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#C0392B", width=2), name="critical path",
                             hoverinfo="skip"))
    for t in traces:
        t.visible = visible
    return traces


def critical_path_figure(cp: CriticalPath, timeline: Any = None) -> go.Figure:
    """A step's critical path over the per-rank timeline: one row per rank, the path's pieces coloured by class
    (compute, communication, launch gap), a red line through them in order; a menu picks the step."""
    title = "Critical path of a step"
    if not cp.evaluated or not cp.steps:
        return empty_figure(title, cp.why or "no critical path: the report has no per-rank ops")
    traces, counts = [], []
    for i, path in enumerate(cp.steps):
        mine = _step_traces(path, timeline, visible=i == 0)
        counts.append(len(mine))
        traces += mine
    # one construction, not add_trace per trace: each add_trace deep-copies the traces already there
    fig = go.Figure(data=traces)
    buttons = []
    for i, path in enumerate(cp.steps):
        visible = [j == i for j, n in enumerate(counts) for _ in range(n)]
        buttons.append(dict(label=f"step {path.step}", method="update",
                            args=[{"visible": visible},
                                  {"title": f"{title}: step {path.step}, {path.time_ns / 1e6:.1f} ms"}]))
    ranks = sorted({o.rank for p in cp.steps for o in p.ops})
    limits = f"<br><sub>{cp.limits}</sub>" if cp.basis == "hooks" else ""
    fig.update_layout(title=f"{title}: step {cp.steps[0].step}, {cp.steps[0].time_ns / 1e6:.1f} ms{limits}",
                      barmode="overlay", xaxis_title="ms from the step's start (replay)",
                      yaxis=dict(title="rank", type="category"),
                      updatemenus=[dict(buttons=buttons, direction="down", x=1, xanchor="right", y=1.15,
                                        yanchor="top")],
                      **{**LAYOUT, "height": min(900, 220 + 22 * len(ranks))})
    return fig


def path_share_figure(cp: CriticalPath) -> go.Figure:
    """The share table: each rank's, stage's, op class's and link's share of the path over the steady steps,
    every rank's slack, and the edits that would shorten the step with their predicted step time."""
    title = "Critical path shares"
    if not cp.evaluated:
        return empty_figure(title, cp.why or "no critical path")
    rows: list[tuple[str, str, str]] = []
    for by in ("rank", "stage", "op_class", "link"):
        for key, v in list(cp.share.get(by, {}).items())[:MAX_ROWS]:
            slack = cp.slack_by_rank.get(key, {}).get("median_ns") if by == "rank" else None
            extra = f"slack {slack / 1e6:.1f} ms" if slack is not None else ""
            rows.append((by, key, f"{v:.1%}" + (f" ({extra})" if extra else "")))
    for e in cp.edits:
        rows.append(("edit", e.what, f"step {e.predicted_step_ns / 1e6:.1f} ms ({e.saving:+.1%} saved)"))
    cols = list(zip(*rows, strict=True)) if rows else [[], [], []]
    fig = go.Figure(go.Table(header=dict(values=["by", "what", "share of the path / predicted"]),
                             cells=dict(values=[list(c) for c in cols], align="left")))
    fig.update_layout(title=f"{title} over the steady steps (mean step {(cp.step_time_ns or 0) / 1e6:.1f} ms)",
                      **{**LAYOUT, "height": min(900, 160 + 24 * len(rows))})
    return fig
