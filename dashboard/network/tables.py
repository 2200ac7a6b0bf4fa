"""The placement tables: per class where the bytes go, what crosses pods, and a proposed mapping beside
today's (when the placement section has an evaluated ``proposal``)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from rankscope.analysis.report import to_json
from rankscope.dashboard.network.heatmaps import bytes_text
from rankscope.dashboard.table_figures import empty_figure, table_figure


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def placement_figure(placement) -> go.Figure:
    """Per traffic class: bytes per step and the shares in a leaf, across leaves, across pods."""
    title = "Placement: where each class's bytes go"
    if placement is None or not placement.evaluated:
        return empty_figure(title, f"not evaluated: {getattr(placement, 'why', None) or 'no placement section'}")
    rows = [{"class": c.name, "bytes per step": bytes_text(c.bytes_per_step), "in leaf": _share(c.in_leaf),
             "across leaves": _share(c.across_leaves), "across pods": _share(c.across_pods)}
            for c in placement.classes]
    more = f" ({placement.unplaced} endpoints unplaced)" if placement.unplaced else ""
    return table_figure(rows, f"{title}; topology {placement.topology or 'unknown'}{more}",
                        empty_text="no class carried bytes")


def crossings_figure(placement) -> go.Figure:
    """The groups and pipelines that span pods, then the pipeline links that cross pods in stage order."""
    title = "Across pods: groups spanning pods, pipeline links crossing them"
    if placement is None or not placement.evaluated:
        return empty_figure(title, "not evaluated")
    rows = [{"what": f"{g.kind} group {g.index}" if g.kind != "pipeline" else f"pipeline {g.index}",
             "link": "", "pods": ", ".join(g.pods)} for g in placement.groups_across_pods]
    rows += [{"what": f"pipeline {c.pipeline} stage {c.stage} -> {c.stage + 1}", "link": f"{c.src} -> {c.dst}",
              "pods": f"{c.src_pod} -> {c.dst_pod}"} for c in placement.pipeline_links_across_pods]
    pods = any(c.across_pods is not None for c in placement.classes)
    return table_figure(rows, title, empty_text="nothing crosses pods" if pods else
                        "the topology has no pods (give --topology with a pod column)")


SHARES = ("reduction", "gain")
"""a proposal's numbers that are shares (shown as percentages)."""


def _number(key: str, v: Any) -> Any:
    """A proposal's number with its unit: bytes, bytes per second, nanoseconds and shares made readable."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return v
    if key.startswith("rate"):
        return bytes_text(float(v)) + "/s"
    if "bytes" in key:
        return bytes_text(float(v))
    if key.endswith("_ns"):
        return f"{v / 1e6:.3f} ms"
    if key in SHARES:
        return _share(float(v))
    return v


def _today_and_proposed(flat: dict) -> list[dict]:
    """Rows (what, today, proposed): ``x`` beside ``proposed_x``; the proposal's own numbers (gain, hosts
    moved, ...) under proposed, what was measured today (the rates) under today."""
    rows, done = [], set()
    for k, v in flat.items():
        if k in done:
            continue
        if f"proposed_{k}" in flat:
            rows.append({"": k.replace("_", " "), "today": _number(k, v),
                         "proposed": _number(k, flat[f"proposed_{k}"])})
            done |= {k, f"proposed_{k}"}
        elif not k.startswith("proposed_"):
            side = "today" if k.startswith("rate") else "proposed"
            rows.append({"": k.replace("_", " "), "today": "", "proposed": "", side: _number(k, v)})
    return rows


def _rows_of(value: Any) -> list[dict]:
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def proposal_figures(placement) -> dict[str, go.Figure]:
    """The proposed mapping beside today's, when the placement section has an evaluated ``proposal``
    (read by name, whatever fields it has): per class today's and the proposed shares, the proposal's
    numbers (predicted step time now and proposed, ...), and each moved endpoint's hosts."""
    prop = getattr(placement, "proposal", None) if placement is not None else None
    if prop is None or not getattr(prop, "evaluated", True):
        return {}
    data = to_json(prop) if not isinstance(prop, dict) else prop
    lists = {k: _rows_of(v) for k, v in data.items() if _rows_of(v)}
    today = {c.name: c for c in placement.classes}
    figs = {}
    shares = next((v for v in lists.values() if all("name" in r and "across_pods" in r for r in v)), None)
    if shares:
        rows = []
        for r in shares:
            now = today.get(r["name"])
            row = {"class": r["name"]}
            for k, label in (("in_leaf", "in leaf"), ("across_leaves", "across leaves"),
                             ("across_pods", "across pods")):
                row[f"{label} today"] = _share(getattr(now, k, None))
                row[f"{label} proposed"] = _share(r.get(k))
            rows.append(row)
        figs["proposal_shares"] = table_figure(rows, "Proposed mapping beside today's: crossing shares per class")
    flat = {}
    for k, v in data.items():
        if isinstance(v, dict):
            flat.update({f"{k} {kk}": vv for kk, vv in v.items() if not isinstance(vv, (list, dict))})
        elif not isinstance(v, list) and k not in ("evaluated", "why"):
            flat[k] = v
    numbers = _today_and_proposed(flat)
    if numbers:
        figs["proposal_numbers"] = table_figure(numbers, "Proposed mapping beside today's: cross-pod bytes and "
                                                         "the step time the replay predicts")
    moves = next((v for k, v in lists.items() if v is not shares and any("endpoint" in r for r in v)), None)
    if moves:
        figs["proposal_moves"] = table_figure(moves, f"Proposed mapping: {len(moves)} endpoint(s) moved, "
                                                     "today's host -> proposed host", first=("endpoint",))
    return figs
