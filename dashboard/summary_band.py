"""The band at the top of the page: the verdict, the culprit by name, and what the slowdown costs.

The words come from analysis/report/summary.py and findings.py (summary_text, describe), the numbers
straight from the Diagnosis; the only arithmetic here is turning the waste
fraction into GPU-hours per day (every GPU of the job waits that share of each
step, around the clock).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rankscope.analysis.report import Diagnosis

HOURS_PER_DAY = 24.0


def _endpoints_are_gpus(d: Diagnosis) -> bool:
    # flow-only jobs name NIC addresses, not ranks: their "hours" are endpoint-hours
    members = [m for g in (d.strategy.dp_groups or [])[:1] for m in g[:1]]
    return not members or not isinstance(members[0], str)


def summary_facts(d: Diagnosis) -> dict:
    """The band's content as plain values: job, evaluated, why, headline, verdict, culprit, factor, slowdown,
    waste_pct, step_ms, lost_ms_per_step, hours_per_day, hours_unit, other_findings."""
    from rankscope.analysis.report import describe, summary_text

    st = d.stragglers
    evaluated = st.evaluated
    found = d.findings
    lead = found[0] if found else None
    step_ms = d.steps.median_ns / 1e6 if d.steps.median_ns else None
    waste = st.waste_fraction if evaluated else None
    facts = {
        "job": d.job, "evaluated": evaluated, "why": st.why,
        "headline": summary_text(d), "verdict": st.verdict if evaluated else "not evaluated",
        "culprit": describe(lead) if lead else None,
        "culprit_kind": lead.kind if lead else None,
        "factor": lead.factor if lead else None,
        "slowdown": st.slowdown if evaluated else None,
        "waste_pct": 100.0 * waste if waste is not None else None,
        "step_ms": step_ms,
        "lost_ms_per_step": step_ms * waste if (step_ms and waste is not None) else None,
        "hours_per_day": d.strategy.world_size * HOURS_PER_DAY * waste if waste is not None else None,
        "hours_unit": "GPU-hours/day" if _endpoints_are_gpus(d) else "endpoint-hours/day",
        "other_findings": [describe(f) for f in found[1:4]],
    }
    return facts


def _fmt(v, spec: str, none: str = "n/a") -> str:
    return none if v is None else format(v, spec)


def summary_band(d: Diagnosis):
    """The band as Dash components (id ``summary-band``'s children)."""
    from dash import html

    f = summary_facts(d)
    bad = f["evaluated"] and f["verdict"] != "none"
    colour = "#c0392b" if bad else ("#1e8449" if f["evaluated"] else "#666")

    def stat(label: str, value: str, title: str, cls: str):
        return html.Div(className=f"band-stat {cls}", title=title, children=[
            html.Div(label, style={"fontSize": "11px", "color": "#667"}),
            html.Div(value, style={"fontSize": "20px", "fontWeight": 700})])

    if f["evaluated"]:
        culprit = f["culprit"] or "no culprit found: no rank, stage or link stands out"
        if f["culprit"] and f["verdict"] == "none":
            # a finding apart from cost: named even when S is under the verdict threshold
            culprit = f"finding (costs too little for a verdict): {culprit}"
        costs = [
            stat("slowdown S", _fmt(f["slowdown"], ".3f"), "step time / step time with no straggler (what-if)",
                 "band-s"),
            stat("waste", _fmt(f["waste_pct"], ".1f") + " %", "1 - 1/S: the share of each step lost", "band-waste"),
            stat("lost per step", _fmt(f["lost_ms_per_step"], ".1f") + " ms",
                 f"of a median step of {_fmt(f['step_ms'], '.1f')} ms", "band-lost"),
            stat(f["hours_unit"], _fmt(f["hours_per_day"], ",.1f"),
                 f"{d.strategy.world_size} endpoints x 24 h x waste, at this step time", "band-hours"),
        ]
    else:
        culprit = f"stragglers not evaluated: {f['why'] or 'unknown'}"
        costs = []
    others = ([html.Div("also: " + " | ".join(f["other_findings"]), className="band-others",
                        style={"fontSize": "12px", "color": "#555"})] if f["other_findings"] else [])
    return [
        html.Div([html.Span(f"job {f['job']}", className="band-job",
                            style={"fontWeight": 600, "marginRight": "12px"}),
                  html.Span(f"verdict: {f['verdict']}", className="band-verdict",
                            style={"color": colour, "fontWeight": 700})]),
        html.Div(culprit, className="band-culprit", style={"fontSize": "18px", "fontWeight": 600,
                                                           "margin": "4px 0"}),
        html.Div(costs, style={"display": "flex", "gap": "22px", "flexWrap": "wrap"}),
        *others,
    ]


def live_text(event: dict | None) -> str:
    """One line for the latest window ``rankscope watch`` analysed (its event object), '' without one."""
    if not event:
        return ""
    step = event.get("window_end_step")
    if event.get("kind") == "hang":
        return f"live, step {step}: HANG: {event.get('why') or 'a collective waits past the hook timeout'}"
    s = event.get("slowdown")
    culprit = event.get("culprit")
    who = ""
    if event.get("straggler") and isinstance(culprit, dict):
        who = ", ".join(f"{k} {v}" for k, v in culprit.items() if v is not None)
        who = f": {who} in {event.get('straggler_windows', 1)} window(s) in a row"
    verdict = event.get("verdict") or "not evaluated"
    vs = event.get("vs_job_median")
    pace = f", step {vs:.2f}x the job's median" if isinstance(vs, (int, float)) else ""
    s_text = f"S {s:.2f}" if isinstance(s, (int, float)) else "S n/a"
    return f"live, window ending at step {step}: {s_text}, {verdict}{who}{pace}"
