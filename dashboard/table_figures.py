"""Plotly building blocks shared by the dashboard's figures, and the report's rows (regressions,
hangs, run diff) drawn as tables."""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
import polars as pl

LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=50, b=40), height=380)
"""layout every figure starts from."""


def as_frame(obj: Any) -> pl.DataFrame | None:
    """A polars frame from a polars/pandas frame, pyarrow table or list of dicts; None when empty/absent."""
    if obj is None:
        return None
    if isinstance(obj, pl.LazyFrame):
        obj = obj.collect()
    if not isinstance(obj, pl.DataFrame):
        try:
            obj = pl.DataFrame(obj) if isinstance(obj, (list, dict)) else pl.from_dataframe(obj)
        except Exception:  # noqa: BLE001 - any unreadable object is "absent" for a figure
            try:
                obj = pl.from_pandas(obj)
            except Exception:  # noqa: BLE001
                return None
    return obj if obj.height else None


def empty_figure(title: str, why: str) -> go.Figure:
    """A blank figure whose annotation says why there is nothing to draw."""
    fig = go.Figure()
    fig.update_layout(title=title, **{**LAYOUT, "height": 220},
                      xaxis=dict(visible=False), yaxis=dict(visible=False),
                      annotations=[dict(text=why, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                                        font=dict(size=14, color="#666"))])
    return fig


def fmt_value(v: Any) -> str:
    """A cell value as short text: floats to 4 significant digits, lists and dicts flattened."""
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if not math.isfinite(v) else f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt_value(x) for x in v[:16]) + (" ..." if len(v) > 16 else "")
    if isinstance(v, dict):
        return "; ".join(f"{k}={{{fmt_value(x)}}}" if isinstance(x, dict) else f"{k}={fmt_value(x)}"
                         for k, x in v.items())
    return str(v)



def table_figure(rows: Any, title: str, columns: list[str] | None = None, max_rows: int = 200,
                 empty_text: str = "none found", first: tuple[str, ...] = ()) -> go.Figure:
    """Any rows (list of dicts or a frame) as a plotly table, the first ``max_rows`` of them;
    the columns named in ``first`` lead, in that order."""
    if isinstance(rows, list):
        dicts = rows
    else:
        df = as_frame(rows)
        dicts = df.to_dicts() if df is not None else []
    if not dicts:
        return empty_figure(title, empty_text)
    cols = columns or list(dict.fromkeys(k for r in dicts[:max_rows] for k in r))
    cols = [c for c in first if c in cols] + [c for c in cols if c not in first]
    shown = dicts[:max_rows]
    cells = [[fmt_value(r.get(c)) for r in shown] for c in cols]
    more = f" (first {max_rows} of {len(dicts)})" if len(dicts) > max_rows else ""
    # run diff rows carry "change": regressions red, improvements green
    tint = {"regression": "#FDE2E0", "improvement": "#E3F5E8"}
    fill = [tint.get(str(r.get("change")), "white") for r in shown]
    fig = go.Figure(go.Table(header=dict(values=cols, fill_color="#E8EEF7", align="left"),
                             cells=dict(values=cells, align="left", fill_color=[fill] * len(cols))))
    fig.update_layout(title=title + more, **{**LAYOUT, "height": min(700, 140 + 28 * len(shown))})
    return fig


def regressions_figure(regressions: list[dict]) -> go.Figure:
    return table_figure(regressions, "Kernel regressions", empty_text="no kernel regressions found",
                        first=("kernel", "ratio", "reason", "ranks", "shape", "dtype"))


def hangs_figure(hangs: list[dict]) -> go.Figure:
    return table_figure(hangs, "Hangs (collectives some rank never joined)", empty_text="no hangs found",
                        first=("group", "seq", "missing", "op"))


def diff_figure(diff: Any) -> go.Figure:
    return table_figure(diff, "Run diff (baseline -> this run)", empty_text="no baseline to compare with",
                        first=("change", "aspect", "item", "ratio", "baseline", "current", "unit"))
