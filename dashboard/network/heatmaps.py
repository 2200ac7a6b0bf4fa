"""The endpoint pair matrix as expected, observed and observed/expected heatmaps, aggregated for big jobs.

The matrix comes from a pair table (one row per directed pair: src, dst, expected, observed, kind). A job
with more than :data:`MAX_SIDE` endpoints is drawn per host, leaf or pod of the topology the analysis used
(the finest with at most :data:`MAX_GROUPS` rows), else per block of consecutive endpoints; the title says
which. Cells sum the bytes of their pairs; the ratio of a cell is the observed bytes of its expected pairs
over their expected bytes. Missing, unexpected, slow and rerouted pairs are marked on their cells. Each
heatmap is one trace of numpy arrays (sent as binary), whatever the job size.
"""

from __future__ import annotations

import math
import re
from dataclasses import field
from typing import Any

import numpy as np
import plotly.graph_objects as go
import polars as pl

from rankscope.collectors.record_class import record
from rankscope.dashboard.table_figures import LAYOUT, as_frame

MAX_SIDE = 256
"""most endpoints a pair heatmap draws one row (and column) each: more are aggregated."""
MAX_GROUPS = 128
"""most rows an aggregated heatmap draws (a 128 x 128 matrix is about 200 kB of JSON per heatmap)."""
LEVELS = ("host", "leaf", "pod")
"""topology levels tried in turn, finest first, when a job has more than MAX_SIDE endpoints."""
MARKS = {"missing": ("x", "#111111"), "unexpected": ("circle-open", "#b000b5"),
         "slow": ("triangle-down-open", "#e67e00"), "rerouted": ("diamond-open", "#007a7a")}
"""pair kind -> (marker symbol, colour) on the observed and ratio heatmaps."""
UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B"))
RATIO_TICKS = (0.1, 0.2, 0.5, 0.8, 0.9, 1.0, 1.1, 1.25, 2.0, 5.0, 10.0)


@record
class PairMatrix:
    """The pair matrix at one level: ``labels`` name the rows (senders) and columns (receivers)."""

    labels: list[str]
    level: str
    """endpoint, host, leaf, pod or block."""
    endpoints: int
    pairs: int
    expected: np.ndarray
    """bytes per step the strategy implies per cell (0 where none)."""
    observed: np.ndarray
    """bytes per step the flows show per cell, unexpected pairs included."""
    observed_expected: np.ndarray
    """observed bytes of the cell's expected pairs (the ratio's numerator)."""
    kinds: dict[str, np.ndarray] = field(default_factory=dict)
    """pair kind (missing, unexpected, slow, rerouted) -> pairs of that kind per cell."""

    @property
    def ratio(self) -> np.ndarray:
        """observed / expected per cell; NaN where nothing is expected."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.expected > 0, self.observed_expected / self.expected, np.nan)

    @property
    def what(self) -> str:
        """e.g. ``per endpoint (16)`` or ``by leaf (128 leaves of 4,096 endpoints)``."""
        if self.level == "endpoint":
            return f"per endpoint ({self.endpoints:,})"
        unit = {"block": "blocks of consecutive endpoints", "leaf": "leaves"}.get(self.level, f"{self.level}s")
        return f"by {self.level} ({len(self.labels):,} {unit} of {self.endpoints:,} endpoints)"


def _natural(x: str) -> tuple:
    return tuple((0, int(c), "") if c.isdigit() else (1, 0, c) for c in re.split(r"(\d+)", x) if c)


def _grouping(endpoints: list[str], places: pl.DataFrame | None, max_side: int,
              max_groups: int) -> tuple[str, list[str]]:
    """(level, each endpoint's label): per endpoint up to ``max_side`` of them, else the finest topology level
    with at most ``max_groups`` labels that places at least half the endpoints, else blocks."""
    if len(endpoints) <= max_side:
        return "endpoint", endpoints
    if places is not None and "endpoint" in places.columns:
        for level in LEVELS:
            if level not in places.columns:
                continue
            where = dict(zip(places["endpoint"].cast(pl.String).to_list(), places[level].to_list()))
            labels = [where.get(e) for e in endpoints]
            placed = sum(x is not None for x in labels)
            groups = {x for x in labels if x is not None}
            if placed * 2 >= len(endpoints) and 1 < len(groups) + (placed < len(endpoints)) <= max_groups:
                return level, [str(x) if x is not None else "unplaced" for x in labels]
    size = math.ceil(len(endpoints) / max_groups)
    blocks = [endpoints[i:i + size] for i in range(0, len(endpoints), size)]
    return "block", [f"{b[0]}..{b[-1]}" for b in blocks for _ in b]


def pair_matrix(pairs: Any, places: Any = None, max_side: int = MAX_SIDE,
                max_groups: int = MAX_GROUPS) -> PairMatrix | None:
    """The pair matrix of a pair table (columns src, dst, expected, observed, kind; one row per directed
    pair), aggregated by :func:`_grouping` beyond ``max_side`` endpoints into at most ``max_groups``
    rows; None without pairs.

    ``places``: endpoint, host, leaf, pod (the topology's frame). Endpoints are ordered naturally
    (10.0.0.9 before 10.0.0.10), groups by their first endpoint.
    """
    df = as_frame(pairs)
    if df is None or not {"src", "dst"} <= set(df.columns):
        return None
    df = df.with_columns(pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String))
    for c in ("expected", "observed"):
        df = df.with_columns((pl.col(c).cast(pl.Float64) if c in df.columns else pl.lit(None, pl.Float64))
                             .fill_nan(None).alias(c))
    endpoints = sorted(set(df["src"].to_list()) | set(df["dst"].to_list()), key=_natural)
    level, label_of = _grouping(endpoints, as_frame(places), max_side, max_groups)
    labels = list(dict.fromkeys(label_of))
    index = {lab: i for i, lab in enumerate(labels)}
    cell = {e: index[lab] for e, lab in zip(endpoints, label_of)}
    n = len(labels)
    src = df["src"].replace_strict(cell, return_dtype=pl.Int64).to_numpy()
    dst = df["dst"].replace_strict(cell, return_dtype=pl.Int64).to_numpy()
    flat = src * n + dst
    exp = df["expected"].fill_null(0.0).to_numpy()
    obs = df["observed"].fill_null(0.0).to_numpy()

    def total(weights: np.ndarray) -> np.ndarray:
        return np.bincount(flat, weights=weights, minlength=n * n).reshape(n, n)

    kinds = {}
    if "kind" in df.columns:
        kind = df["kind"].to_numpy()
        for k in MARKS:
            hit = kind == k
            if hit.any():
                kinds[k] = np.bincount(flat[hit], minlength=n * n).reshape(n, n)
    return PairMatrix(labels=labels, level=level, endpoints=len(endpoints), pairs=df.height, expected=total(exp),
                      observed=total(obs), observed_expected=total(np.where(exp > 0, obs, 0.0)), kinds=kinds)


def bytes_text(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    scale, unit = next(((s, u) for s, u in UNITS if abs(x) >= s), (1.0, "B"))
    return f"{x / scale:.3g} {unit}"


def _marks(m: PairMatrix) -> list[go.Scatter]:
    out = []
    labels = np.asarray(m.labels, dtype=object)
    for k, counts in m.kinds.items():
        r, c = np.nonzero(counts)
        symbol, colour = MARKS[k]
        n = int(counts.sum())
        out.append(go.Scatter(x=labels[c], y=labels[r], mode="markers", name=f"{k} ({n:,} pair{'s' * (n > 1)})",
                              marker=dict(symbol=symbol, color=colour, size=9 if len(m.labels) <= 64 else 6,
                                          line=dict(width=1.5, color=colour)), showlegend=True,
                              customdata=counts[r, c],
                              hovertemplate=f"%{{y}} -> %{{x}}<br>%{{customdata}} {k} pair(s)<extra></extra>"))
    return out


def _square(fig: go.Figure, m: PairMatrix, title: str) -> go.Figure:
    small = len(m.labels) <= 64
    axis = dict(type="category", showticklabels=small, tickfont=dict(size=9), showgrid=False)
    # grey behind the cells: a cell with nothing in it is told from a ratio of 1 (white)
    fig.update_layout(title=title, **{**LAYOUT, "height": 560, "margin": dict(l=60, r=20, t=60, b=60)},
                      plot_bgcolor="#e4e7eb",
                      xaxis={**axis, "title": "receiver"}, yaxis={**axis, "title": "sender", "autorange": "reversed"},
                      legend=dict(orientation="h", y=-0.08))
    return fig


def _bytes_heatmap(m: PairMatrix, values: np.ndarray, title: str, marks: bool) -> go.Figure:
    with np.errstate(divide="ignore"):
        z = np.where(values > 0, np.log10(np.where(values > 0, values, 1.0)), np.nan).astype(np.float32)
    finite = z[np.isfinite(z)]
    lo, hi = (math.floor(float(finite.min())), math.ceil(float(finite.max()))) if finite.size else (0, 1)
    ticks = list(range(lo, max(hi, lo + 1) + 1))
    fig = go.Figure(go.Heatmap(
        x=m.labels, y=m.labels, z=z, customdata=values.astype(np.float32), colorscale="Viridis", hoverongaps=False,
        zmin=lo, zmax=max(hi, lo + 1),
        colorbar=dict(title="bytes/step", tickvals=ticks, ticktext=[bytes_text(10.0 ** t) for t in ticks]),
        hovertemplate="%{y} -> %{x}<br>%{customdata:.4s}B per step<extra></extra>"))
    if marks:
        fig.add_traces(_marks(m))
    return _square(fig, m, title)


def _ratio_heatmap(m: PairMatrix, title: str) -> go.Figure:
    r = m.ratio
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log10(r)
    seen = z[np.isfinite(z)]
    span = min(1.0, max(math.log10(1.25), float(np.abs(seen).max()) if seen.size else 0.0))
    z = np.clip(np.where(np.isneginf(z), -span, z), -span, span).astype(np.float32)  # missing: the floor
    ticks = [t for t in RATIO_TICKS if abs(math.log10(t)) <= span + 1e-9]
    fig = go.Figure(go.Heatmap(
        x=m.labels, y=m.labels, z=z, customdata=r.astype(np.float32), colorscale="RdBu_r", zmid=0.0, zmin=-span,
        zmax=span, hoverongaps=False,
        colorbar=dict(title="observed /<br>expected", tickvals=[math.log10(t) for t in ticks],
                      ticktext=[f"{t:g}x" for t in ticks]),
        hovertemplate="%{y} -> %{x}<br>observed / expected %{customdata:.3f}<extra></extra>"))
    fig.add_traces(_marks(m))
    return _square(fig, m, title)


def matrix_figures(m: PairMatrix, per: str = "step", note: str = "") -> dict[str, go.Figure]:
    """The expected, observed and ratio heatmaps of one pair matrix (``note`` ends each title)."""
    what = m.what + (f"; {note}" if note else "")
    return {"traffic_expected": _bytes_heatmap(m, m.expected, f"Expected bytes per {per}, {what}", False),
            "traffic_observed": _bytes_heatmap(m, m.observed, f"Observed bytes per {per}, {what}", True),
            "traffic_ratio": _ratio_heatmap(m, f"Observed / expected, {what} (grey: nothing expected)")}
