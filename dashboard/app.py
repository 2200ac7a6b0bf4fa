"""The Dash app for SREs: pick a store and a job, see its strategy, timelines, stragglers,
regressions, hangs and a diff against a baseline run.

It reads the store (collectors.job_frames.load_job) and the analysis API
(analysis.diagnose.analyze_job: the Diagnosis and its tables; analysis.run_diff
for the diff; analysis.flow_jobs for the jobs of a flow capture) and computes
nothing of its own. An interval re-reads the store; a job is re-diagnosed only
when its part files or the manifest changed, so a live store shows fresh data
without re-analysing an idle one on every tick.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from rankscope.collectors.errors import RankscopeError
from rankscope.collectors.job_frames import KINDS_FOR_ANALYSIS, JobFrames
from rankscope.collectors.store import MANIFEST_DIR, Store
from rankscope.dashboard.figures import all_figures
from rankscope.dashboard.report_html import key_numbers
from rankscope.dashboard.security import Access, checked_job, public_error
from rankscope.dashboard.table_figures import diff_figure, empty_figure

if TYPE_CHECKING:
    from rankscope.analysis.diagnosis import Diagnosis
    from rankscope.analysis.jobs import PlannedJob

ANALYSIS_MODULES = ("rankscope.analysis.diagnose", "rankscope.analysis.run_diff")
"""imported on first use (or by :func:`serve`'s warm-up thread), so the server answers at once."""

GRAPHS = ("strategy", "step_series", "timeline", "heatmap", "optype", "cause", "regressions", "hangs", "diff")
_CACHE_SIZE = 8


def store_signature(store: Store, job: str | None) -> tuple:
    """What changes when a live store gets new data for a job (None: any job): its part files and the
    manifest entries."""
    sig = []
    for kind in KINDS_FOR_ANALYSIS:
        for p in store.parts(kind, job):
            sig.append((p.name, p.stat().st_size))
    man = store.root / MANIFEST_DIR
    if man.is_dir():
        sig.append(tuple(sorted((p.name, p.stat().st_mtime_ns) for p in man.glob("*.json"))))
    return tuple(sig)


def job_plan(store: Store) -> dict[str, PlannedJob]:
    """Job name -> how to load it: the one job plan of ``rankscope analyze`` (analysis.jobs.plan_jobs)."""
    from rankscope.analysis.jobs import plan_jobs

    return {p.name: p for p in plan_jobs(store)}


def load_planned(store: Store, name: str, how: PlannedJob) -> JobFrames:
    """The frames of one planned job (analysis.jobs.load_planned), named ``name``."""
    from rankscope.analysis.jobs import load_planned as load

    frames = load(store, how)[0]
    frames.job = name
    return frames


def analysis_tables(frames: JobFrames, tables: dict, baseline: JobFrames | None = None) -> dict:
    """The figures' tables: those analysis.diagnose.analyze_job returned, plus the run diff with a baseline."""
    from rankscope.analysis.run_diff import diff_runs

    tables = dict(tables)
    if baseline is not None:
        try:
            tables["diff"] = diff_runs(baseline, frames).rows
        except RankscopeError as e:
            tables.setdefault("errors", {})["diff"] = public_error("run diff failed", e)
    return tables


def _version(key: tuple, sig: tuple) -> str:
    import hashlib

    return hashlib.sha1(repr((key, sig)).encode()).hexdigest()[:16]


class JobViews:
    """Small LRUs of job plans per store and of (Diagnosis, tables) per (store, job, baseline),
    invalidated by the store signature."""

    def __init__(self, size: int = _CACHE_SIZE):
        self._size = size
        self._cache: OrderedDict[tuple, tuple[tuple, Diagnosis, dict]] = OrderedDict()
        self._plans: dict[str, tuple[tuple, dict]] = {}
        self._lock = threading.Lock()

    def plan(self, store_dir: str) -> dict[str, PlannedJob]:
        """The store's jobs (see :func:`job_plan`), recomputed only when the store changed."""
        store = Store(store_dir)
        sig = store_signature(store, None)
        with self._lock:
            hit = self._plans.get(str(store_dir))
            if hit is not None and hit[0] == sig:
                return hit[1]
        plan = job_plan(store)
        with self._lock:
            self._plans[str(store_dir)] = (sig, plan)
        return plan

    def _frames(self, store_dir: str, job: str) -> tuple[Store, PlannedJob, tuple]:
        from rankscope.analysis.jobs import PlannedJob

        how = self.plan(store_dir).get(job) or PlannedJob(job, "job", job)
        store = Store(store_dir)
        return store, how, store_signature(store, how.source)

    def get(self, store_dir: str, job: str, baseline_dir: str | None = None,
            baseline_job: str | None = None) -> tuple[Diagnosis, dict]:
        d, tables, _ = self.get_versioned(store_dir, job, baseline_dir, baseline_job)
        return d, tables

    def get_versioned(self, store_dir: str, job: str, baseline_dir: str | None = None,
                      baseline_job: str | None = None) -> tuple[Diagnosis, dict, str]:
        """Like :meth:`get`, plus a version string that changes whenever the inputs changed."""
        store, how, sig_job = self._frames(store_dir, job)
        bjob = baseline_job or job
        base = self._frames(baseline_dir, bjob) if baseline_dir else None
        sig = (how, sig_job, base[1:] if base else None)
        key = (str(store_dir), job, baseline_dir or "", bjob if base else "")
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] == sig:
                self._cache.move_to_end(key)
                return hit[1], hit[2], _version(key, sig)
        from rankscope.analysis.diagnose import analyze_job

        frames = load_planned(store, job, how)
        baseline = load_planned(base[0], bjob, base[1]) if base else None
        diag, tables = analyze_job(frames, baseline=baseline)
        tables = analysis_tables(frames, tables, baseline)
        with self._lock:
            self._cache[key] = (sig, diag, tables)
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return diag, tables, _version(key, sig)


def strategy_summary(d: Diagnosis, max_groups: int = 8) -> str:
    """One line naming the degrees and the first groups, e.g. for the page header."""
    s = d.strategy
    parts = [f"DP {s.dp} x PP {s.pp} x TP {s.tp if s.tp is not None else '?'}", f"{s.world_size} endpoints"]
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
    return " | ".join(parts)


def build_layout(store_dir: str, interval_s: float, baseline_dir: str | None, access: Access | None = None):
    from dash import dcc, html

    card_style = {"display": "flex", "flexWrap": "wrap", "gap": "8px", "margin": "8px 0"}
    section = {"background": "#fff", "border": "1px solid #dde2e8", "borderRadius": "6px", "margin": "8px 0",
               "padding": "6px"}
    half = {**section, "flex": "1 1 560px", "margin": "0"}
    graph = lambda name, style=section: html.Div(  # noqa: E731
        dcc.Graph(id=f"fig-{name}", config={"displaylogo": False}), style=style)
    return html.Div(style={"fontFamily": "system-ui, sans-serif", "background": "#f6f7f9", "padding": "0 18px"},
                    children=[
        html.H2("rankscope", style={"margin": "8px 0"}),
        html.Div(style={"display": "flex", "gap": "10px", "flexWrap": "wrap", "alignItems": "center"}, children=[
            # hardstore: the page chooses only among the stores given at start (dashboard/security.py)
            html.Label("store"), dcc.Dropdown(id="store", options=list(access.stores) if access else [store_dir],
                                              value=access.stores[0] if access else str(store_dir),
                                              clearable=False, style={"width": "28em"}),
            html.Label("job"), dcc.Dropdown(id="job", clearable=False, style={"width": "18em"}),
            html.Label("baseline store"), dcc.Dropdown(
                id="baseline-store", options=list(access.baselines + access.stores) if access else [],
                value=(access.baselines[0] if access and access.baselines else None),
                placeholder="optional, for the run diff", style={"width": "20em"}),
            html.Label("baseline job"), dcc.Dropdown(id="baseline-job", style={"width": "14em"}),
        ]),
        html.Div(id="status", style={"color": "#666", "fontSize": "12px", "margin": "4px 0"}),
        html.Div(id="strategy-summary", style={"fontSize": "14px", "fontWeight": 600}),
        html.Div(id="cards", style=card_style),
        graph("strategy"),
        html.Div([graph("step_series", half), graph("cause", half)], style={"display": "flex", "gap": "8px",
                                                                              "flexWrap": "wrap"}),
        graph("timeline"), graph("heatmap"), graph("optype"),
        graph("regressions"), graph("hangs"), graph("diff"),
        dcc.Interval(id="tick", interval=int(interval_s * 1000)), dcc.Store(id="shown"),
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


def page_content(views: JobViews, store: str | None, job: str | None, baseline_store: str | None = None,
                 baseline_job: str | None = None, shown: str | None = None) -> list | None:
    """What the page shows for one job: [version, status, strategy summary, cards, one figure per GRAPHS
    entry]; None when ``shown`` (the version on the page) is still current."""
    def blank():
        return [empty_figure(g, "no job selected") for g in GRAPHS]

    if not job or not store:
        return ["", "no job in this store yet" if store else "choose a store", "", []] + blank()
    try:
        d, tables, version = views.get_versioned(store, job, baseline_store or None, baseline_job)
    except Exception as e:  # noqa: BLE001 - one failing analyzer must not take the page down; say why
        return ["", public_error(f"could not analyse job {job}", e), "", []] + blank()
    if version == shown:
        return None
    figs = all_figures(d, tables)
    if "diff" not in figs:
        figs["diff"] = diff_figure(None)
    status = f"store {store} | job {job} | sources: {', '.join(d.sources) or 'none'}"
    if tables.get("errors"):
        status += f" | not computed: {', '.join(tables['errors'])} (details in the server log)"
    for fig in figs.values():
        fig.update_layout(uirevision=job)  # keep the user's zoom across refreshes
    return [version, status, strategy_summary(d), _cards(d)] + [figs[g] for g in GRAPHS]


def create_app(store_dir: str | list[str], interval_s: float = 15.0, baseline_dir: str | list[str] | None = None):
    """The Dash app over the stores given (the page picks among them). ``interval_s``: how often it re-reads."""
    import dash
    from dash import Input, Output, State

    views = JobViews()
    access = Access.of(store_dir, baseline_dir)
    app = dash.Dash(__name__, title="rankscope", update_title=None)
    app.layout = build_layout(access.stores[0], interval_s, None, access)

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

    outputs = [Output("shown", "data"), Output("status", "children"), Output("strategy-summary", "children"),
               Output("cards", "children")] + [Output(f"fig-{g}", "figure") for g in GRAPHS]

    @app.callback(outputs, Input("job", "value"), Input("tick", "n_intervals"), Input("baseline-job", "value"),
                  State("store", "value"), State("baseline-store", "value"), State("shown", "data"))
    def _render(job, _tick, baseline_job, store, baseline_store, shown):
        # hardstore: only stores given at start, only jobs those stores list (a crafted request gets nothing)
        store, baseline_store = access.store(store), access.baseline(baseline_store)
        job = checked_job(job, _job_options(views, store))
        baseline_job = checked_job(baseline_job, _job_options(views, baseline_store)) if baseline_store else None
        content = page_content(views, store, job, baseline_store, baseline_job, shown)
        # an unchanged store sends nothing back: no re-download of figures every tick
        return [dash.no_update] * len(outputs) if content is None else content

    return app


def serve(store_dir: str | list[str], host: str = "127.0.0.1", port: int = 8050, interval_s: float = 15.0,
          baseline_dir: str | list[str] | None = None, auth: tuple[str, str] | None = None) -> None:
    """Run the app in this process until interrupted."""
    import importlib

    from rankscope.dashboard.security import check_bind, install

    check_bind(host, auth)
    app = create_app(store_dir, interval_s, baseline_dir)
    install(app.server, host, port, auth)
    # the analysis imports (polars plans, scipy, scikit-learn) load while the server already answers
    threading.Thread(target=lambda: [importlib.import_module(m) for m in ANALYSIS_MODULES], daemon=True,
                     name="rankscope-warm-up").start()
    app.run(host=host, port=port, debug=False)
