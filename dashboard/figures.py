"""Plotly figures of one job, built from a Diagnosis and the analysis tables.

Every builder draws defensively from what is present (a section that was not
evaluated, or a table that is absent, gives an empty figure that says so) and
aggregates so that a job with thousands of ranks stays one or a few traces:
no figure draws one trace per rank or per op.

Tables accepted (polars or pandas DataFrames, or lists of dicts):

- timeline: one row per rank per step, columns ``rank`` (or ``endpoint`` /
  ``worker``), ``step`` and either per-phase durations (optionally
  ``start_ns``) as analysis.timelines.rank_timelines gives them (``compute_ns``,
  ``exposed_comm_ns``, ``idle_ns``: they add up to the step, so they stack) or
  as ``compute_ns``, ``comm_ns``, ``wait_ns``; or one row per phase span:
  ``phase``, ``start_ns``, ``end_ns``. Without ``step`` (per-rank totals such
  as ``steps.phases_by_rank``) the totals are drawn as one step.
- heatmap: worker x step slowdown, long (``worker``/``rank``/``endpoint``,
  ``step``, ``slowdown``) or wide as a dict ``{"workers": [...], "steps":
  [...], "slowdown": [[...]]}`` (one row per worker; ``values`` also read), as
  ``stragglers.replay.heatmap`` holds it.
- regressions, hangs, diff: rows of any columns, drawn as tables (see
  :mod:`rankscope.dashboard.table_figures`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
import polars as pl

from rankscope.analysis.report import to_json
from rankscope.dashboard.grid_figures import (  # noqa: F401  (re-exported: the figures' one front door)
    heatmap_figure,
    heatmap_matrix,
    strategy_figure,
    strategy_layout,
)
from rankscope.dashboard.path_figures import critical_path_figure, path_share_figure
from rankscope.dashboard.table_figures import (
    LAYOUT,
    as_frame,
    diff_figure,
    empty_figure,
    hangs_figure,
    regressions_figure,
)

if TYPE_CHECKING:  # annotations only: the figures read attributes, and the page starts faster without it
    from rankscope.analysis.report import Diagnosis, Stragglers

PHASES = (("compute_ns", "compute", "#4C78A8"), ("comm_ns", "exposed communication", "#F58518"),
          ("wait_ns", "idle (waiting)", "#E45756"))
RANK_COLUMNS = ("rank", "endpoint", "worker")


def _rank_col(df: pl.DataFrame) -> str | None:
    return next((c for c in RANK_COLUMNS if c in df.columns), None)


# ---------------------------------------------------------------- timelines
def phase_durations(timeline: Any) -> pl.DataFrame | None:
    """Normalise a timeline table to columns rank (str), step, start_ns (may be null), compute_ns, comm_ns, wait_ns."""
    df = as_frame(timeline)
    if df is None or _rank_col(df) is None:
        return None
    rc = _rank_col(df)
    if "step" not in df.columns:
        df = df.with_columns(step=pl.lit(-1, pl.Int64)).drop("start_ns", strict=False)
    if "exposed_comm_ns" in df.columns:
        # comm_ns overlaps compute; exposed comm + idle + compute add up to the step
        df = df.drop("comm_ns", "wait_ns", strict=False).rename({"exposed_comm_ns": "comm_ns"})
        if "idle_ns" in df.columns:
            df = df.rename({"idle_ns": "wait_ns"})
    elif "wait_ns" not in df.columns and "exposed_wait_ns" in df.columns:
        df = df.rename({"exposed_wait_ns": "wait_ns"})
    if "phase" in df.columns and {"start_ns", "end_ns"} <= set(df.columns):
        name = pl.col("phase").cast(pl.String).str.to_lowercase()
        dur = (pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64)
        df = df.group_by(rc, "step").agg(
            start_ns=pl.col("start_ns").min(),
            compute_ns=dur.filter(name.str.contains("comp")).sum(),
            comm_ns=dur.filter(name.str.contains("comm")).sum(),
            wait_ns=dur.filter(name.str.contains("wait|idle|exposed")).sum())
    have = [c for c, _, _ in PHASES if c in df.columns]
    if not have:
        return None
    cols = [pl.col(rc).cast(pl.String).alias("rank"), pl.col("step").cast(pl.Int64),
            (pl.col("start_ns").cast(pl.Int64) if "start_ns" in df.columns
             else pl.lit(None, pl.Int64)).alias("start_ns")]
    cols += [(pl.col(c).cast(pl.Float64).fill_null(0.0) if c in df.columns else pl.lit(0.0)).alias(c)
             for c, _, _ in PHASES]
    return df.select(cols)


def pick_ranks(ph: pl.DataFrame, max_ranks: int) -> list[str]:
    """At most ``max_ranks`` ranks: a quarter with the most compute (stragglers), a quarter with the most
    wait (their victims), the rest spread evenly over the remaining ranks."""
    tot = ph.group_by("rank").agg(pl.col("compute_ns").sum(), pl.col("wait_ns").sum()).sort("rank")
    if tot.height <= max_ranks:
        return sorted(tot["rank"].to_list(), key=lambda r: (len(r), r))
    quarter = max(1, max_ranks // 4)
    keep = tot.sort("compute_ns", descending=True)["rank"].head(quarter).to_list()
    keep += tot.filter(~pl.col("rank").is_in(keep)).sort("wait_ns", descending=True)["rank"].head(quarter).to_list()
    rest = tot.filter(~pl.col("rank").is_in(keep))["rank"].to_list()
    room = max_ranks - len(keep)
    keep += rest[:: max(1, -(-len(rest) // room))][:room]
    return sorted(keep, key=lambda r: (len(r), r))


def timeline_figure(timeline: Any, max_ranks: int = 48, max_steps: int = 12) -> go.Figure:
    """Gantt-like per-rank step timeline: compute, exposed communication and idle per rank per step.

    With ``start_ns`` the bars sit on the time axis (phases stacked from each step's start on that
    rank); without it, each rank's phases are summed over the shown steps. Shows the last
    ``max_steps`` steps and at most ``max_ranks`` ranks (see :func:`pick_ranks`).
    """
    title = "Per-rank step timeline"
    ph = phase_durations(timeline)
    if ph is None:
        return empty_figure(title, "no per-rank timeline: the store has no compute or comm records per rank")
    steps = sorted(ph["step"].unique().drop_nulls().to_list())[-max_steps:]
    ph = ph.filter(pl.col("step").is_in(steps))
    nranks = ph["rank"].n_unique()
    ranks = pick_ranks(ph, max_ranks)
    ph = ph.filter(pl.col("rank").is_in(ranks))
    timed = ph["start_ns"].null_count() == 0
    if timed:
        base = ph.with_columns(base_ms=(pl.col("start_ns") - ph["start_ns"].min()).cast(pl.Float64) / 1e6)
    else:
        base = (ph.group_by("rank").agg(pl.col("step").n_unique(), *(pl.col(c).sum() for c, _, _ in PHASES))
                .with_columns(base_ms=pl.lit(0.0)).sort(pl.col("rank").str.len_chars(), "rank"))
    fig = go.Figure()
    for col, label, colour in PHASES:
        fig.add_trace(go.Bar(y=base["rank"].to_list(), x=(base[col] / 1e6).to_list(), base=base["base_ms"].to_list(),
                             orientation="h", name=label, marker_color=colour, customdata=base["step"].to_list(),
                             hovertemplate="rank %{y} step %{customdata}<br>" + label
                             + " %{x:.3f} ms<extra></extra>"))
        base = base.with_columns(base_ms=pl.col("base_ms") + pl.col(col) / 1e6)
    shown = f" ({len(ranks)} of {nranks} ranks)" if nranks > len(ranks) else ""
    which = "all steps, per-rank totals" if steps == [-1] else f"last {len(steps)} steps"
    fig.update_layout(title=f"{title}: {which}{shown}", barmode="overlay",
                      xaxis_title="ms since first shown step" if timed else "ms (summed over steps)",
                      yaxis=dict(title="rank (phases stack to its step time)", type="category",
                                 categoryorder="array", categoryarray=ranks),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
                      **{**LAYOUT, "height": min(1000, 200 + 16 * len(ranks))})
    return fig


def step_durations(diagnosis: Diagnosis, tables: dict | None = None) -> pl.DataFrame | None:
    """Per-step duration (columns step, duration_ns) from, in order: a ``steps`` table, the steps section's
    ``durations_ns``, the step boundaries, or the timeline table (slowest rank of each step)."""
    tables = tables or {}
    st = as_frame(tables.get("steps"))
    if st is not None and {"step", "duration_ns"} <= set(st.columns):
        return st.select(pl.col("step").cast(pl.Int64), pl.col("duration_ns").cast(pl.Float64)).sort("step")
    durs = diagnosis.steps.durations_ns
    if durs:
        return pl.DataFrame({"step": list(range(len(durs))), "duration_ns": [float(d) for d in durs]})
    b = diagnosis.steps.boundaries_ns
    if len(b) >= 2:
        return pl.DataFrame({"step": list(range(len(b) - 1)),
                             "duration_ns": [float(b[i + 1] - b[i]) for i in range(len(b) - 1)]})
    ph = phase_durations(tables.get("timeline"))
    if ph is not None:
        busy = pl.col("compute_ns") + pl.col("comm_ns") + pl.col("wait_ns")
        return ph.group_by("step").agg(duration_ns=busy.max()).sort("step")
    return None


def step_series_figure(diagnosis: Diagnosis, tables: dict | None = None) -> go.Figure:
    """Step time (ms) per step with the median as a reference line."""
    title = "Step time"
    d = step_durations(diagnosis, tables)
    if d is None or d.height == 0:
        return empty_figure(title, "no step boundaries found (no step marks and no steps in the records)")
    fig = go.Figure(go.Scatter(x=d["step"].to_list(), y=(d["duration_ns"] / 1e6).to_list(), mode="lines+markers",
                               name="step time", hovertemplate="step %{x}: %{y:.3f} ms<extra></extra>"))
    med = diagnosis.steps.median_ns or float(d["duration_ns"].median())
    fig.add_hline(y=med / 1e6, line_dash="dot", annotation_text=f"median {med / 1e6:.3f} ms")
    st = diagnosis.stragglers
    per_step = st.whatif.step_slowdown if st.whatif is not None else None
    if st.steps and per_step and len(st.steps) == len(per_step):
        fig.add_trace(go.Scatter(x=list(st.steps), y=list(per_step), yaxis="y2", mode="lines",
                                 name="what-if S", line=dict(dash="dash", color="#E45756"),
                                 hovertemplate="step %{x}: S %{y:.3f}<extra></extra>"))
        fig.update_layout(yaxis2=dict(title="what-if slowdown S (step time / time with no straggler)",
                                      overlaying="y", side="right", showgrid=False, tickformat=".3f"))
    fig.update_layout(title=f"{title} ({d.height} steps)", yaxis_title="step time (ms)",
                      xaxis=dict(title="step", dtick=1 if d.height <= 20 else None),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"), **LAYOUT)
    return fig


# ---------------------------------------------------------------- stragglers
def _bars(values: dict, title: str, axis: str, ref: float | None, xaxis: str) -> go.Figure:
    items = [(str(k), float(v)) for k, v in (values or {}).items() if v is not None]
    if not items:
        return empty_figure(title, "not evaluated: no what-if slowdowns for this job")
    items.sort(key=lambda kv: -kv[1])
    fig = go.Figure(go.Bar(x=[k for k, _ in items], y=[v for _, v in items], marker_color="#4C78A8",
                           text=[f"{v:.3f}" for _, v in items], textposition="outside"))
    if ref is not None:
        fig.add_hline(y=ref, line_dash="dot")
    fig.update_layout(title=title, yaxis_title=axis, xaxis_title=xaxis, **LAYOUT)
    return fig


def optype_figure(stragglers: Stragglers) -> go.Figure:
    """S_t per op type: the slowdown left if only that op type were straggling."""
    return _bars(stragglers.by_optype, "Slowdown by op type (S_t)",
                 "S_t: step-time slowdown if only this op type straggled", 1.0, "op type")


def cause_figure(stragglers: Stragglers) -> go.Figure:
    """The shares of the slowdown the verdict weighed, per cause, beside the paper's M_W and M_S.

    The verdict's bars (``verdict_shares``) are the numbers the verdict was chosen from; OSDI'25's
    M_W and M_S (``by_cause``) keep their own labelled bars, since M_S fixes the last stage only.
    """
    w = stragglers.whatif
    vs = (w.verdict_shares if w is not None else None) or {}
    title = f"What-if by cause (verdict: {stragglers.verdict}"
    if stragglers.verdict == "stage_imbalance" and w is not None and w.verdict_stage is not None:
        title += f", stage {w.verdict_stage}"
    title += ")"
    if not vs:
        return _bars(stragglers.by_cause, title, "share of the slowdown removed by fixing the cause", None,
                     "cause")
    causes = list(vs)
    fig = go.Figure(go.Bar(name="share the verdict used", x=causes, y=[float(vs[c]) for c in causes],
                           marker_color=["#E45756" if c == stragglers.verdict else "#4C78A8" for c in causes],
                           text=[f"{float(vs[c]):.3f}" for c in causes], textposition="outside"))
    if (stragglers.basis or "compute") == "compute":
        paper = {"M_W (OSDI'25, top 3% workers)": stragglers.by_cause.get("worker"),
                 "M_S (OSDI'25, last stage)": stragglers.by_cause.get("stage_imbalance")}
        paper = {k: v for k, v in paper.items() if v is not None}
        fig.add_trace(go.Bar(name="OSDI'25 metric", x=list(paper), y=[float(v) for v in paper.values()],
                             marker_color="#9D9D9D", text=[f"{float(v):.3f}" for v in paper.values()],
                             textposition="outside"))
    fig.update_layout(title=title, yaxis_title="share of the slowdown removed by fixing the cause",
                      xaxis_title="cause", **LAYOUT)
    return fig


def all_figures(diagnosis: Diagnosis, tables: dict | None = None) -> dict[str, go.Figure]:
    """Every figure of one job, keyed by name, in page order."""
    tables = tables or {}
    st = diagnosis.stragglers
    heat = tables.get("heatmap")
    if heat is None and st.replay is not None:
        heat = st.replay.heatmap
    timeline = tables.get("timeline")
    if as_frame(timeline) is None and diagnosis.steps.phases_by_rank:
        timeline = [to_json(p) for p in diagnosis.steps.phases_by_rank]
    figs = {
        "strategy": strategy_figure(diagnosis.strategy, heat),
        "step_series": step_series_figure(diagnosis, tables),
        "timeline": timeline_figure(timeline),
        "critical_path": critical_path_figure(diagnosis.critical_path, tables.get("timeline")),
        "path_shares": path_share_figure(diagnosis.critical_path),
        "heatmap": heatmap_figure(heat, diagnosis.strategy),
        "optype": optype_figure(st),
        "cause": cause_figure(st),
        "regressions": regressions_figure([to_json(r) for r in diagnosis.regressions]),
        "hangs": hangs_figure([to_json(h) for h in diagnosis.hangs]),
    }
    if "diff" in tables:
        figs["diff"] = diff_figure(tables["diff"])
    return figs
