"""The report's row lists (regressions, hangs, run diff, findings) as readable Dash DataTables.

Cells are summarised (a list of groups reads "3 groups: [0,8,..] ..."), the
full value is the cell's tooltip, headers wrap instead of being cut off and
carry their own tooltip saying what the column means.
"""

from __future__ import annotations

import math
from typing import Any

from rankscope.analysis.report import Finding, describe
from rankscope.dashboard.table_figures import as_frame, fmt_value

CELL_CHARS = 60
"""longest text a cell shows; the rest is in its tooltip."""
TOOLTIP_CHARS = 1500

HEADER_HELP = {
    "kernel": "kernel (or GEMM) name", "ratio": "current / baseline duration (> 1: slower)",
    "factor": "how many times slower than the comparison", "reason": "why it was flagged",
    "ranks": "ranks where it happens", "shape": "GEMM m x n x k", "dtype": "data type",
    "group": "process group", "group_ranks": "the group's member ranks", "seq": "collective sequence number",
    "missing": "ranks that never joined the collective", "op": "collective op",
    "change": "regression (slower) or improvement (faster)", "aspect": "what was compared",
    "item": "which one", "baseline": "value in the baseline run", "current": "value in this run",
    "unit": "unit of baseline and current", "evidence": "why (summarised; full text on hover)",
    "kind": "kind of finding", "culprit": "which rank, stage, link or kernel", "steps": "steps where it was seen",
    "finding": "the finding in words",
}


def _short_list(v: list | tuple) -> str:
    if v and all(isinstance(x, (list, tuple)) for x in v):
        inner = " ".join("[" + ",".join(map(str, g[:4])) + (",..]" if len(g) > 4 else "]") for g in v[:3])
        return f"{len(v)} groups: {inner}" + (" ..." if len(v) > 3 else "")
    head = ", ".join(fmt_value(x) for x in v[:6])
    return head + (f" ... ({len(v)} in all)" if len(v) > 6 else "")


def cell_text(v: Any, limit: int = CELL_CHARS) -> str:
    """A value as a short cell: long lists counted, dicts as key=value pairs, cut at ``limit`` characters."""
    if isinstance(v, (list, tuple)):
        text = _short_list(v)
    elif isinstance(v, dict):
        text = "; ".join(f"{k}={cell_text(x, 24)}" for k, x in v.items())
    elif isinstance(v, float) and not math.isfinite(v):
        text = ""
    else:
        text = fmt_value(v)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def table_rows(rows: Any, max_rows: int = 200, first: tuple[str, ...] = ()) -> tuple[list[str], list[dict],
                                                                                      list[dict], int]:
    """(columns, summarised rows, full-text tooltips, total rows) of any rows (list of dicts or frame)."""
    if isinstance(rows, list):
        dicts = [r for r in rows if isinstance(r, dict)]
    else:
        df = as_frame(rows)
        dicts = df.to_dicts() if df is not None else []
    shown = dicts[:max_rows]
    cols = list(dict.fromkeys(k for r in shown for k in r))
    cols = [c for c in first if c in cols] + [c for c in cols if c not in first]
    data = [{c: cell_text(r.get(c)) for c in cols} for r in shown]
    tips = []
    for r, d in zip(shown, data):
        tip = {}
        for c in cols:
            full = full_text(r.get(c))
            if full != d[c]:
                tip[c] = {"value": full[:TOOLTIP_CHARS], "type": "text"}
        tips.append(tip)
    return cols, data, tips, len(dicts)


def full_text(v: Any) -> str:
    """The whole value for a tooltip, keeping the structure: groups as [..] [..], dicts as key: value lines."""
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(x, (list, tuple)) for x in v):
            return " ".join("[" + ", ".join(map(str, g)) + "]" for g in v)
        return ", ".join(full_text(x) for x in v)
    if isinstance(v, dict):
        return "\n".join(f"{k}: {full_text(x)}" for k, x in v.items())
    return fmt_value(v)


def data_table(table_id: str, rows: Any, title: str, empty_text: str, first: tuple[str, ...] = (),
               max_rows: int = 200):
    """A titled DataTable (or the empty text) as Dash components."""
    from dash import dash_table, html

    cols, data, tips, total = table_rows(rows, max_rows, first)
    more = f" (first {len(data)} of {total})" if total > len(data) else (f" ({total})" if total else "")
    head = html.H4(title + more, style={"margin": "4px 0 6px"})
    if not data:
        return [head, html.Div(empty_text, className="empty-table", style={"color": "#666", "fontSize": "14px"})]
    tint = [{"if": {"filter_query": '{change} = "regression"'}, "backgroundColor": "#FDE2E0"},
            {"if": {"filter_query": '{change} = "improvement"'}, "backgroundColor": "#E3F5E8"}] \
        if "change" in cols else []
    return [head, dash_table.DataTable(
        id=table_id, columns=[{"name": c.replace("_", " "), "id": c} for c in cols], data=data,
        tooltip_data=tips, tooltip_header={c: HEADER_HELP.get(c, c.replace("_", " ")) for c in cols},
        tooltip_delay=200, tooltip_duration=None, page_size=25, sort_action="native",
        style_table={"overflowX": "auto"},
        style_header={"whiteSpace": "normal", "height": "auto", "fontWeight": 600, "backgroundColor": "#E8EEF7",
                      "minWidth": "70px"},
        style_cell={"textAlign": "left", "fontFamily": "system-ui, sans-serif", "fontSize": "13px",
                    "whiteSpace": "nowrap", "overflow": "hidden", "textOverflow": "ellipsis", "maxWidth": "420px",
                    "minWidth": "60px", "padding": "3px 8px"},
        style_data_conditional=tint)]


def findings_rows(findings: list[Finding]) -> list[dict]:
    """Findings as table rows: the finding in words first (analysis.report.findings.describe), then its parts."""
    return [{"finding": describe(f), "kind": f.kind, "factor": f.factor, "steps": f.steps, "evidence": f.evidence}
            for f in findings]
