"""The static HTML report of one job: one self-contained page that works offline.

plotly.js is inlined once in the page head; each figure is a div that uses it.
Key numbers come straight from the Diagnosis (nothing is computed here).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import plotly.io as pio

from rankscope.analysis.report import degree_text, to_json
from rankscope.dashboard.figures import all_figures
from rankscope.dashboard.network import network_figures
from rankscope.dashboard.report_text import tied_labellings
from rankscope.dashboard.table_figures import fmt_value

if TYPE_CHECKING:
    from rankscope.analysis.report import Diagnosis

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#f6f7f9;color:#222}
header{background:#1f2d3d;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:20px} header p{margin:4px 0 0;font-size:13px;color:#cdd6e0}
main{padding:16px 24px;max-width:1400px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin-bottom:14px}
.card{background:#fff;border:1px solid #dde2e8;border-radius:6px;padding:8px 14px;min-width:130px}
.card .k{font-size:11px;color:#667;text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:20px;font-weight:600}
.card.bad .v{color:#c0392b} .card.ok .v{color:#1e8449}
section{background:#fff;border:1px solid #dde2e8;border-radius:6px;margin:0 0 14px;padding:8px}
table.kv{border-collapse:collapse;font-size:13px} table.kv td{padding:2px 10px;border-bottom:1px solid #eee}
details{font-size:12px} pre{white-space:pre-wrap;word-break:break-all}
"""


def _num(v: Any, fmt: str = "{:.3f}") -> str:
    if v is None:
        return "n/a"
    try:
        return fmt.format(v)
    except (TypeError, ValueError):
        return str(v)


def key_numbers(d: Diagnosis) -> list[tuple[str, str, str]]:
    """(label, value, css class) of the report's headline figures, straight from the Diagnosis."""
    s, st, sg = d.strategy, d.steps, d.stragglers
    evaluated = sg.evaluated
    verdict_cls = "ok" if sg.verdict == "none" else "bad"
    cards = [
        ("world size", str(s.world_size), ""),
        ("DP x PP x TP", f"{degree_text(s.dp)} x {degree_text(s.pp)} x {degree_text(s.tp)}", ""),
        ("strategy confidence", _num(s.confidence, "{:.2f}"), ""),
        ("steps", str(st.count), ""),
        ("median step", _num(st.median_ns / 1e6 if st.median_ns else None, "{:.3f} ms"), ""),
        ("slowdown S", _num(sg.slowdown) if evaluated else "not evaluated", verdict_cls if evaluated else ""),
        ("waste 1-1/S", _num(sg.waste_fraction * 100, "{:.1f} %") if evaluated else "n/a", ""),
        ("verdict", sg.verdict if evaluated else "not evaluated", verdict_cls if evaluated else ""),
        ("regressions", str(len(d.regressions)), "bad" if d.regressions else "ok"),
        ("hangs", str(len(d.hangs)), "bad" if d.hangs else "ok"),
        ("rejected records", str(d.data_quality.num_rejected), ""),
    ]
    tied = tied_labellings(s)
    if tied:
        cards.insert(3, ("the flows fit as well", tied, ""))
    if s.ep is not None:
        cards.insert(2, ("EP", str(s.ep), ""))
    if s.cp is not None:
        cards.insert(2, ("CP", str(s.cp), ""))
    return cards


def _cards_html(cards) -> str:
    return "".join(f'<div class="card {c}"><div class="k">{html.escape(k)}</div>'
                   f'<div class="v">{html.escape(v)}</div></div>' for k, v, c in cards)


def _top_workers_html(d: Diagnosis, limit: int = 10) -> str:
    tw = d.stragglers.top_workers[:limit]
    if not tw:
        return ""

    def evidence(w) -> str:
        return html.escape(fmt_value({k: v for k, v in to_json(w).items() if k not in ("endpoint", "slowdown")})[:400])

    rows = "".join(f"<tr><td>{html.escape(str(w.endpoint))}</td><td>{_num(w.slowdown)}</td>"
                   f"<td>{evidence(w)}</td></tr>" for w in tw)
    return ('<section><h3>Top workers by S_w</h3><table class="kv"><tr><td><b>endpoint</b></td>'
            f"<td><b>S_w</b></td><td><b>evidence</b></td></tr>{rows}</table></section>")


def render_report(diagnosis: Diagnosis, tables: dict | None = None) -> str:
    """One self-contained HTML page (plotly.js inlined once, no network needed) for one job.

    ``tables`` optionally holds analysis tables the figures draw from: ``timeline`` (per rank per
    step phases), ``heatmap`` (worker x step slowdown), ``steps`` (step, duration_ns), ``diff``.
    """
    from plotly.offline import get_plotlyjs

    d = diagnosis
    figs = all_figures(d, tables)
    divs = "\n".join(f'<section id="fig-{name}">'
                     + pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"plot-{name}",
                                   config={"displaylogo": False, "responsive": True})
                     + "</section>" for name, fig in figs.items())
    net = network_figures(d, tables)
    if net:  # the network view: only for a report with an evaluated traffic or placement section
        divs += '\n<section id="network"><h3>Network</h3></section>\n' + "\n".join(
            f'<section id="net-{name}">' + pio.to_html(fig, full_html=False, include_plotlyjs=False,
                                                       div_id=f"plot-net-{name}", config={"displaylogo": False})
            + "</section>" for name, fig in net.items())
    sources = ", ".join(d.sources) or "none"
    quality = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(fmt_value(v)[:600])}</td></tr>"
                      for k, v in to_json(d.data_quality).items())
    title = f"rankscope report: {d.job}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<header><h1>{html.escape(title)}</h1><p>sources: {html.escape(sources)}</p></header>
<main>
<div class="cards">{_cards_html(key_numbers(d))}</div>
{_top_workers_html(d)}
{divs}
<section><h3>Data quality</h3><table class="kv">{quality}</table>
<p>The full report is <code>{html.escape(d.job)}.json</code> beside this page.</p></section>
</main></body></html>
"""
