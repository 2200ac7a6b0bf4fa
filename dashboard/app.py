"""The Dash app for SREs: pick a store and a job, see the verdict and its culprit first, then the
strategy, timelines, stragglers, findings, regressions, hangs and a diff against a baseline run.

It reads the store and the analysis API through dashboard/analysis_source.py
(one cached analysis per store version) and computes nothing of its own. An
interval re-reads the store; a job is re-diagnosed only when its part files or
the manifest changed, so a live store shows fresh data without re-analysing an
idle one on every tick.

Never a stale page: every render carries the (store, job) it was computed for
(``rendered``); a gate in the page (GATE_JS) shows the content only while that
matches the boxes, and a loading banner naming the job otherwise. A late answer
for a job no longer selected stays hidden and the selection is asked for again.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from rankscope.analysis.report import degree_text, to_json
from rankscope.collectors.store import Store
from rankscope.dashboard.analysis_source import JobViews, load_planned, store_problem
from rankscope.dashboard.data_tables import data_table, findings_rows
from rankscope.dashboard.figures import all_figures
from rankscope.dashboard.network import network_figures
from rankscope.dashboard.report_html import key_numbers
from rankscope.dashboard.report_text import tied_labellings
from rankscope.dashboard.security import Access, checked_job, public_error
from rankscope.dashboard.summary_band import live_text, summary_band
from rankscope.dashboard.table_figures import empty_figure

if TYPE_CHECKING:
    from rankscope.analysis.report import Diagnosis

__all__ = ["GRAPHS", "TABLES", "JobViews", "create_app", "load_planned", "page_content", "serve", "strategy_summary"]

ANALYSIS_MODULES = ("rankscope.analysis.diagnose", "rankscope.analysis.run_diff")
"""imported on first use (or by :func:`serve`'s warm-up thread), so the server answers at once."""

GRAPHS = ("strategy", "step_series", "timeline", "critical_path", "path_shares", "heatmap", "optype", "cause")
TITLES = {"strategy": "Strategy", "step_series": "Step time", "timeline": "Per-rank step timeline",
          "critical_path": "Critical path of a step", "path_shares": "Critical path shares",
          "heatmap": "Straggler heatmap", "optype": "Slowdown by op type", "cause": "What-if by cause"}
TABLES = {"findings": ("Findings (the verdict's culprit first)", "no findings: nothing stands out",
                       ("finding", "kind", "factor")),
          "regressions": ("Kernel regressions", "no kernel regressions found",
                          ("kernel", "ratio", "reason", "ranks", "shape", "dtype")),
          "hangs": ("Hangs (collectives some rank never joined)", "no hangs found", ("group", "seq", "missing", "op")),
          "diff": ("Run diff (baseline -> this run)", "no baseline to compare with: choose a baseline store",
                   ("change", "aspect", "item", "ratio", "baseline", "current", "unit"))}
TEXT_OUTPUTS = ("status", "summary-band", "strategy-summary", "cards")
OUTPUTS = (["shown.data", "rendered.data", "rendered-tag.children"] + [f"{t}.children" for t in TEXT_OUTPUTS]
           + [f"fig-{g}.figure" for g in GRAPHS] + [f"table-{t}.children" for t in TABLES] + ["network.children"])
"""what one render sets, in this order (``page_content``'s keys)."""

# The gate: a MutationObserver runs after every DOM change and before the next paint, so the frame that
# shows a new value in the job or store box already hides content rendered for another selection.
# React never touches <body>'s class or the loading text (a span rendered without children).
GATE_JS = """
(function () {
  function text(id) { const e = document.getElementById(id); return e ? e.textContent.trim() : ''; }
  function sync() {
    const job = text('job-value'), store = text('store-value');
    let tag = null;
    try { tag = JSON.parse(text('rendered-tag') || 'null'); } catch (e) { tag = null; }
    const ok = !!tag && (tag.store || '') === store && (tag.job || '') === job;
    if (document.body.classList.contains('rs-current') !== ok) document.body.classList.toggle('rs-current', ok);
    const lt = document.getElementById('loading-text');
    const what = job ? 'job ' + job : (store ? 'store ' + store : '');
    const want = what ? 'Loading ' + what + ': analysing (the first view of a store version can take '
      + 'minutes for thousands of ranks; later views come from the cache)' : 'Loading';
    if (!ok && lt && lt.textContent !== want) lt.textContent = want;
  }
  new MutationObserver(sync).observe(document.documentElement, {subtree: true, childList: true,
                                                                characterData: true});
})();
"""

# An answer for a selection no longer in the boxes arrived after the current one was asked for (or
# instead of it): ask again, so the page never waits forever behind a dropped answer.
RETRY_JS = """
function(rendered, store, job, retry) {
    const ok = !!rendered && (rendered.store || null) === (store || null) && (rendered.job || null) === (job || null);
    return ok || !rendered ? window.dash_clientside.no_update : (retry || 0) + 1;
}
"""

PAGE_CSS = """
@keyframes rs-spin{to{transform:rotate(360deg)}}
#content{display:none} body.rs-current #content{display:block}
#loading{display:flex;align-items:center;margin:10px 0} body.rs-current #loading{display:none}
"""


def strategy_summary(d: Diagnosis, max_groups: int = 8) -> str:
    """One line naming the degrees and the first groups, e.g. for the page header."""
    s = d.strategy
    parts = [f"DP {degree_text(s.dp)} x PP {degree_text(s.pp)} x TP {degree_text(s.tp)}", f"{s.world_size} endpoints"]
    if s.ep is not None:
        parts.append(f"EP {s.ep}")
    if s.cp is not None:
        parts.append(f"CP {s.cp}")

    def groups(gs):
        shown = " ".join("[" + ",".join(map(str, g[:16])) + (",..." if len(g) > 16 else "") + "]"
                         for g in gs[:max_groups])
        return shown + (f" ... ({len(gs)} in all)" if len(gs) > max_groups else "")

    if s.dp_groups:
        parts.append("DP groups " + groups(s.dp_groups))
    if s.pp_groups:
        parts.append("pipelines " + groups(s.pp_groups))
    tied = tied_labellings(s)
    if tied:
        parts.append(f"ambiguous: the flows fit as well {tied}")
    return " | ".join(parts)


def build_layout(access: Access, interval_s: float):
    from dash import dcc, html

    card_style = {"display": "flex", "flexWrap": "wrap", "gap": "8px", "margin": "8px 0"}
    section = {"background": "#fff", "border": "1px solid #dde2e8", "borderRadius": "6px", "margin": "8px 0",
               "padding": "6px"}
    half = {**section, "flex": "1 1 560px", "margin": "0"}
    graph = lambda name, style=section: html.Div(  # noqa: E731
        dcc.Graph(id=f"fig-{name}", config={"displaylogo": False}), style=style)
    table = lambda name: html.Div(id=f"table-{name}", style=section)  # noqa: E731
    spinner = html.Div(style={"width": "18px", "height": "18px", "border": "3px solid #c8d3e0",
                              "borderTopColor": "#2c6fbb", "borderRadius": "50%",
                              "animation": "rs-spin 0.9s linear infinite", "flex": "none"})
    return html.Div(style={"fontFamily": "system-ui, sans-serif", "background": "#f6f7f9", "padding": "0 18px"},
                    children=[
        html.H2("rankscope", style={"margin": "8px 0"}),
        html.Div(style={"display": "flex", "gap": "10px", "flexWrap": "wrap", "alignItems": "center"}, children=[
            # hardstore: the page chooses only among the stores given at start (dashboard/security.py)
            html.Label("store"), dcc.Dropdown(id="store", options=list(access.stores), value=access.stores[0],
                                              clearable=False, style={"width": "28em"}),
            html.Label("job"), dcc.Dropdown(id="job", clearable=False, style={"width": "18em"}),
            html.Label("baseline store"), dcc.Dropdown(
                id="baseline-store", options=list(access.baselines + access.stores),
                value=access.baselines[0] if access.baselines else None,
                placeholder="optional, for the run diff", style={"width": "20em"}),
            html.Label("baseline job"), dcc.Dropdown(id="baseline-job", style={"width": "14em"}),
        ]),
        html.Div(id="loading", role="status", className="loading-banner", children=[
            spinner, html.Span(id="loading-text", style={"fontSize": "15px", "marginLeft": "10px"})]),
        html.Div(id="content", children=[
            html.Span(id="rendered-tag", style={"display": "none"}),
            # the latest live window (rankscope watch), read from its file each tick, never re-analysed
            html.Div(id="live-window", role="status", style={"fontSize": "14px", "fontWeight": 600,
                                                              "color": "#8e4b00", "margin": "4px 0"}),
            html.Div(id="status", style={"color": "#666", "fontSize": "12px", "margin": "4px 0"}),
            html.Div(id="summary-band", style={**section, "borderLeft": "5px solid #2c6fbb", "padding": "8px 14px"}),
            html.Div(id="strategy-summary", style={"fontSize": "13px", "fontWeight": 600, "color": "#334"}),
            html.Div(id="cards", style=card_style),
            graph("strategy"),
            html.Div([graph("step_series", half), graph("cause", half)], style={"display": "flex", "gap": "8px",
                                                                                  "flexWrap": "wrap"}),
            graph("timeline"), graph("critical_path"), graph("path_shares"), graph("heatmap"), graph("optype"),
            # the network view: filled only for a job with an evaluated traffic or placement section
            html.Div(id="network", role="region", **{"aria-label": "Network"}),
            *[table(t) for t in TABLES],
        ]),
        dcc.Interval(id="tick", interval=int(interval_s * 1000)), dcc.Store(id="shown"), dcc.Store(id="rendered"),
        dcc.Store(id="retry", data=0),
    ])


def _cards(d: Diagnosis):
    from dash import html

    colour = {"bad": "#c0392b", "ok": "#1e8449"}
    return [html.Div(className=f"card {c}", style={"background": "#fff", "border": "1px solid #dde2e8",
                                                     "borderRadius": "6px", "padding": "6px 12px"},
                     children=[html.Div(k, style={"fontSize": "11px", "color": "#667"}),
                               html.Div(v, style={"fontSize": "18px", "fontWeight": 600,
                                                  "color": colour.get(c, "#222")})])
            for k, v, c in key_numbers(d)]


def _job_options(views: JobViews, store_dir: str | None) -> list[str]:
    if not store_dir or not Path(store_dir).is_dir():
        return []
    try:
        return list(views.plan(store_dir))
    except Exception:  # noqa: BLE001 - a store mid-write or a failing recogniser: list the raw jobs
        return Store(store_dir).jobs()


def no_job_message(store: str | None) -> str:
    """Why there is no job to show: no store chosen, a missing or empty store, or no job recognised (then
    what each flow capture set apart, as `rankscope analyze` says it)."""
    problem = store_problem(store)
    if problem:
        return problem
    try:
        from rankscope.analysis.fabric import FlowConfig
        from rankscope.analysis.runner import why_no_jobs

        why = why_no_jobs(Store(store), FlowConfig())
    except Exception:  # noqa: BLE001 - a store mid-write: the plain message still holds
        why = []
    return (f"store {store} has records but no training job was recognised in them"
            + ("; " + "; ".join(why) if why else " (see `rankscope info --store ...`)"))


def _tables(d: Diagnosis | None, tables: dict | None) -> dict:
    tables = tables or {}
    rows = {"findings": findings_rows(d.findings) if d else [],
            "regressions": [to_json(r) for r in d.regressions] if d else [],
            "hangs": [to_json(h) for h in d.hangs] if d else [],
            "diff": tables.get("diff") or []}
    out = {}
    for t, (title, empty, first) in TABLES.items():
        why = empty if d is not None else "no job selected"
        out[f"table-{t}.children"] = data_table(f"dt-{t}", rows[t], title, why, first)
    return out


def _message_page(store: str | None, job: str | None, status: str, version: str = "") -> dict:
    page = {"shown.data": version, "rendered.data": {"store": store, "job": job},
            "rendered-tag.children": json.dumps({"store": store, "job": job}),
            "status.children": status, "summary-band.children": status, "strategy-summary.children": "",
            "cards.children": []}
    page.update({f"fig-{g}.figure": empty_figure(TITLES[g], status) for g in GRAPHS})
    page.update(_tables(None, None))
    page["network.children"] = []
    return page


def network_children(d: Diagnosis, tables: dict, uirevision: str | None = None) -> list:
    """The network section of the page (the pair heatmaps side by side, the placement tables, a proposed
    mapping when the report has one); [] when the report has no evaluated traffic or placement section."""
    from dash import dcc, html

    figs = network_figures(d, tables)
    if not figs:
        return []
    section = {"background": "#fff", "border": "1px solid #dde2e8", "borderRadius": "6px", "padding": "6px"}
    graph = lambda name, style: html.Div(dcc.Graph(id=f"net-{name}", figure=figs[name].update_layout(  # noqa: E731
        uirevision=uirevision), config={"displaylogo": False}), style=style)
    heat = [k for k in figs if k.startswith("traffic_")]
    where = [f"topology: {s.topology}" for s in (d.traffic, d.placement) if s is not None and s.topology][:1]
    errors = (tables or {}).get("errors", {}).get("traffic_pairs")
    note = "; ".join(where + ([errors] if errors else []))
    return [html.H3("Network", style={"margin": "14px 0 2px"}),
            html.Div(note, style={"color": "#666", "fontSize": "12px", "margin": "0 0 6px"}),
            html.Div([graph(k, {**section, "flex": "1 1 480px"}) for k in heat],
                     style={"display": "flex", "gap": "8px", "flexWrap": "wrap"}),
            *[graph(k, {**section, "margin": "8px 0"}) for k in figs if k not in heat]]


PAGE_CACHE_SIZE = 8
_pages: OrderedDict[str, dict] = OrderedDict()
"""built pages by analysis version: a cached analysis is drawn once, not on every page load."""
_pages_lock = threading.Lock()


def page_content(views: JobViews, store: str | None, job: str | None, baseline_store: str | None = None,
                 baseline_job: str | None = None, shown: str | None = None) -> dict | None:
    """What the page shows for one job, keyed by :data:`OUTPUTS`; None when ``shown`` (the version on the
    page) is still current. ``rendered.data`` names the (store, job) it was computed for."""
    if not job or not store:
        listed = bool(store and store_problem(store) is None and _job_options(views, store))
        return _message_page(store, job, "choose a job" if listed else no_job_message(store))
    try:
        version = views.version(store, job, baseline_store or None, baseline_job)
        if version == shown:
            return None
        with _pages_lock:
            hit = _pages.get(version)
        if hit is not None:
            return dict(hit)
        a = views.get(store, job, baseline_store or None, baseline_job)
    except Exception as e:  # noqa: BLE001 - one failing analyzer must not take the page down; say why
        return _message_page(store, job, public_error(f"could not analyse job {job}", e))
    page = _built_page(store, job, a)
    with _pages_lock:
        _pages[a.version] = page
        while len(_pages) > PAGE_CACHE_SIZE:
            _pages.popitem(last=False)
    return dict(page)


def _built_page(store: str, job: str, a) -> dict:
    d, tables = a.diagnosis, a.tables
    figs = all_figures(d, tables)
    status = f"store {store} | job {job} | sources: {', '.join(d.sources) or 'none'}"
    if tables.get("errors"):
        status += f" | not computed: {', '.join(tables['errors'])} (details in the server log)"
    for fig in figs.values():
        fig.update_layout(uirevision=job)  # keep the user's zoom across refreshes
    page = {"shown.data": a.version, "rendered.data": {"store": store, "job": job},
            "rendered-tag.children": json.dumps({"store": store, "job": job}), "status.children": status,
            "summary-band.children": summary_band(d), "strategy-summary.children": strategy_summary(d, max_groups=3),
            "cards.children": _cards(d)}
    page.update({f"fig-{g}.figure": figs[g] for g in GRAPHS})
    page.update(_tables(d, tables))
    page["network.children"] = network_children(d, tables, job)
    return page


def create_app(store_dir: str | list[str], interval_s: float = 15.0, baseline_dir: str | list[str] | None = None):
    """The Dash app over the stores given (the page picks among them). ``interval_s``: how often it re-reads."""
    import dash
    from dash import Input, Output, State

    views = JobViews()
    access = Access.of(store_dir, baseline_dir)
    app = dash.Dash(__name__, title="rankscope", update_title=None)
    app.index_string = (app.index_string.replace("</head>", f"<style>{PAGE_CSS}</style></head>")
                        .replace("{%renderer%}", "{%renderer%}<script>" + GATE_JS + "</script>"))
    app.layout = build_layout(access, interval_s)

    @app.callback(Output("job", "options"), Output("job", "value"),
                  Input("store", "value"), Input("tick", "n_intervals"), State("job", "value"))
    def _jobs(store, _tick, current):
        jobs = _job_options(views, access.store(store))
        value = current if current in jobs else (jobs[0] if jobs else None)
        return jobs, dash.no_update if value == current else value

    @app.callback(Output("baseline-job", "options"), Output("baseline-job", "value"),
                  Input("baseline-store", "value"), State("baseline-job", "value"), State("job", "value"))
    def _baseline_jobs(store, current, job):
        jobs = _job_options(views, access.baseline(store))
        if current in jobs:
            return jobs, current
        return jobs, job if job in jobs else (jobs[0] if jobs else None)

    app.clientside_callback(RETRY_JS, Output("retry", "data"), Input("rendered", "data"), State("store", "value"),
                            State("job", "value"), State("retry", "data"))

    @app.callback(Output("live-window", "children"), Input("store", "value"), Input("job", "value"),
                  Input("tick", "n_intervals"))
    def _live(store_value, job_value, _tick):
        store = access.store(store_value)
        return live_text(live_window(store, job_value)) if store else ""

    outputs = [Output(*o.split(".")) for o in OUTPUTS]

    @app.callback(outputs, Input("store", "value"), Input("job", "value"), Input("tick", "n_intervals"),
                  Input("baseline-job", "value"), Input("retry", "data"),
                  State("baseline-store", "value"), State("shown", "data"))
    def _render(store_value, job_value, _tick, baseline_job, _retry, baseline_store, shown):
        # hardstore: only stores given at start, only jobs those stores list (a crafted request gets nothing)
        store, baseline_store = access.store(store_value), access.baseline(baseline_store)
        job = checked_job(job_value, _job_options(views, store))
        baseline_job = checked_job(baseline_job, _job_options(views, baseline_store)) if baseline_store else None
        trig = {t["prop_id"] for t in dash.callback_context.triggered or []}
        if shown and trig == {"tick.n_intervals"} and live_window(store, job) is not None:
            # a job rankscope watch follows: the band above follows each window; the whole store is not
            # re-analysed on every tick (choose the job again to redraw the full analysis)
            return [dash.no_update] * len(outputs)
        content = page_content(views, store, job, baseline_store, baseline_job,
                               None if "retry.data" in trig else shown)
        # an unchanged store sends nothing back: no re-download of figures every tick
        if content is None:
            return [dash.no_update] * len(outputs)
        # tag the answer with the selection as the browser sent it, so the gate can match it
        content["rendered.data"] = {"store": store_value, "job": job_value}
        content["rendered-tag.children"] = json.dumps(content["rendered.data"])
        return [content[o] for o in OUTPUTS]

    return app


def live_window(store: str | None, job: str | None) -> dict | None:
    """The latest live window of a job (``rankscope watch`` keeps it in the store), or None."""
    if not store or not job or not Path(store).is_dir():
        return None
    return Store(store).live().get(job)


def warm_up(stores: list[str]) -> None:
    """Import the analysis and analyse each store's first job, so the first page view comes from the cache."""
    import importlib
    import logging

    for m in ANALYSIS_MODULES:
        importlib.import_module(m)
    views = JobViews()
    for store in stores:
        try:
            jobs = _job_options(views, store)
            if jobs:
                page_content(views, store, jobs[0])  # analysis and figures, both cached
        except Exception as e:  # noqa: BLE001 - a failing warm-up only costs the first viewer a wait
            logging.getLogger("rankscope.dashboard").warning("warm-up of %s failed: %s", store, e)


def serve(store_dir: str | list[str], host: str = "127.0.0.1", port: int = 8050, interval_s: float = 15.0,
          baseline_dir: str | list[str] | None = None, auth: tuple[str, str] | None = None,
          warm: bool = True) -> None:
    """Run the app in this process until interrupted. ``warm``: analyse each store's first job at start
    (in the background; the server answers at once and shows the loading banner meanwhile)."""
    import importlib

    from rankscope.dashboard.security import check_bind, install

    check_bind(host, auth)
    app = create_app(store_dir, interval_s, baseline_dir)
    install(app.server, host, port, auth)
    stores = list(Access.of(store_dir).stores)
    # the analysis imports (polars plans, scipy, scikit-learn) load while the server already answers
    target = (lambda: warm_up(stores)) if warm else (
        lambda: [importlib.import_module(m) for m in ANALYSIS_MODULES])
    threading.Thread(target=target, daemon=True, name="rankscope-warm-up").start()
    app.run(host=host, port=port, debug=False)
