"""Where the dashboard gets a job's analysis: the store, the job plan, and one cached analysis call.

Everything the page shows comes from :func:`cached_analysis`, the dashboard's
only call into the analysis. Its results are kept per *store version*: a hash
of the job's committed part files (name and size) and the manifest entries, so
a live store that gains data is re-analysed and an idle one never is. It is
the one place that reaches the store's shared result cache (analysis/runner/cache.py).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from rankscope.collectors.errors import RankscopeError
from rankscope.collectors.job_frames import KINDS_FOR_ANALYSIS, JobFrames
from rankscope.collectors.record_class import record
from rankscope.collectors.store import MANIFEST_DIR, Store
from rankscope.dashboard.security import public_error

if TYPE_CHECKING:
    from rankscope.analysis.model import JobModel
    from rankscope.analysis.report import Diagnosis
    from rankscope.analysis.runner import PlannedJob

CACHE_SIZE = 8
"""analyses kept in memory (one per store version, job and baseline): a 2,048-rank job is a few tens of MB."""


@record
class JobAnalysis:
    """One job's Diagnosis and the tables its figures draw from, for one store version."""

    diagnosis: Diagnosis
    tables: dict
    version: str


def store_signature(store: Store, job: str | None) -> tuple:
    """What changes when a live store gets new data for a job (None: any job): its part files and the
    manifest entries."""
    sig = []
    for kind in KINDS_FOR_ANALYSIS:
        for p in store.parts(kind, job):
            sig.append((p.name, p.stat().st_size))
    man = store.root / MANIFEST_DIR
    if man.is_dir():
        keys = store.committed_keys()  # a snapshot's own commits, not those written since
        sig.append(tuple(sorted((p.name, p.stat().st_mtime_ns) for p in man.glob("*.json") if p.name[:16] in keys)))
    return tuple(sig)


def version_of(*parts: object) -> str:
    """A short stable hash of what identifies one analysis (store, job, baseline and their signatures)."""
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]


def store_problem(store_dir: str | None) -> str | None:
    """Why a store cannot be shown (missing, not a folder, or empty), in words; None when it has records."""
    if not store_dir:
        return "choose a store"
    p = Path(store_dir)
    if not p.exists():
        return f"store {store_dir} does not exist (check the --store path)"
    if not p.is_dir():
        return f"store {store_dir} is not a folder"
    if not (p / MANIFEST_DIR).is_dir() and not any(p.glob("*/job=*")):
        return (f"store {store_dir} holds no records yet (ingest traces with `rankscope ingest`, or collect "
                "flows with `rankscope collect`; the page refreshes by itself)")
    return None


def job_plan(store: Store) -> dict[str, PlannedJob]:
    """Job name -> how to load it: the one job plan of ``rankscope analyze`` (analysis.jobs.plan_jobs)."""
    from rankscope.analysis.runner import plan_jobs

    return {p.name: p for p in plan_jobs(store)}


def load_planned(store: Store, name: str, how: PlannedJob) -> JobFrames:
    """The frames of one planned job (analysis.runner.plan.load_planned), named ``name``."""
    from rankscope.analysis.runner import load_planned as load

    frames = load(store, how)
    frames.job = name
    return frames


def analysis_tables(model: JobModel, tables: dict, baseline: JobModel | None = None) -> dict:
    """The figures' tables: those analysis.diagnose.analyze_model returned, plus the run diff with a baseline."""
    from rankscope.analysis.run_diff import diff_runs

    tables = dict(tables)
    if baseline is not None:
        try:
            tables["diff"] = diff_runs(baseline, model).rows
        except RankscopeError as e:
            tables.setdefault("errors", {})["diff"] = public_error("run diff failed", e)
    return tables


_options: dict = {"config": None}
"""the analysis options of this dashboard process (``rankscope dashboard --topology``): one per process."""


def use_config(config) -> None:
    """Analyse every job with these DiagnoseConfig options (None: the defaults), as ``analyze`` would with
    the same flags; cached analyses of other options are not reused (the result cache keys on them)."""
    _options["config"] = config
    with _cache_lock:
        _cache.clear()


_cache: OrderedDict[str, JobAnalysis] = OrderedDict()
_cache_lock = threading.Lock()
_version_locks: dict[str, threading.Lock] = {}


def cached_analysis(version: str, store: Store, job: str, how: PlannedJob,
                    baseline: tuple[Store, str, PlannedJob] | None = None) -> JobAnalysis:
    """The dashboard's one analysis call: the job's Diagnosis and tables for store version ``version``.

    A version already analysed is answered from memory; concurrent requests for the same version
    (a refresh tick racing a page load) wait for one analysis instead of running two.
    """
    with _cache_lock:
        hit = _cache.get(version)
        if hit is not None:
            _cache.move_to_end(version)
            return hit
        lock = _version_locks.setdefault(version, threading.Lock())
    with lock:
        with _cache_lock:
            hit = _cache.get(version)
        if hit is not None:
            return hit
        diag, tables = _analysed(store, job, how, baseline)
        result = JobAnalysis(diag, tables, version)
        with _cache_lock:
            _cache[version] = result
            _version_locks.pop(version, None)
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
        return result


def _analysed(store: Store, job: str, how: PlannedJob,
              baseline: tuple[Store, str, PlannedJob] | None) -> tuple[Diagnosis, dict]:
    """Run the analysis. Without a baseline it goes through the store's result cache
    (analysis.result_cache), with the very computation ``rankscope analyze`` caches, so one entry serves
    both; the records are loaded only on a miss."""
    from rankscope.analysis.diagnose import analyze_model, model_of
    from rankscope.analysis.runner import analyse_planned, with_capture

    config = _options["config"]
    if baseline is not None:
        model = model_of(load_planned(store, job, how), config)
        base = load_planned(*baseline)
        diag, tables = analyze_model(model, config, baseline=base)
        diag = with_capture(diag, how)
        return diag, _merged(analysis_tables(model, tables, model_of(base, config)),
                             network_tables(store, how, diag, model))

    def compute():
        # as cli/commands/analyze.py computes it (load-time data quality included): one cache entry, one answer
        return analyse_planned(store, how, config)

    from rankscope.analysis.runner import cached_analysis as stored_analysis

    diag, tables, _hit = stored_analysis(store, how, config, compute)
    return diag, _merged(tables, network_tables(store, how, diag))


def _merged(tables: dict, more: dict) -> dict:
    """tables plus more of them, their ``errors`` joined."""
    out = {**tables, **more}
    if "errors" in tables and "errors" in more:
        out["errors"] = {**tables["errors"], **more["errors"]}
    return out


NETWORK_TABLES = ("traffic_pairs", "endpoints")
"""the tables the network view adds: every endpoint pair of the traffic section (the report lists only the
worst and the costliest), and where each endpoint hangs (the topology the section used)."""


def network_tables(store: Store, how: PlannedJob, diag: Diagnosis, model: JobModel | None = None) -> dict:
    """``traffic_pairs`` (analysis.network.matrix.pair_table: every pair, not only the listed ones) and
    ``endpoints`` (endpoint, host, leaf, pod, spine) of a job whose traffic section is evaluated; {} otherwise.

    Kept in the store's result cache under the analysis' own key inputs (store version, planned job, default
    options), so the job model is rebuilt for them once per store version, not on every page view.
    """
    traffic = getattr(diag, "traffic", None)
    if traffic is None or not traffic.evaluated:
        return {}
    from rankscope.analysis.diagnose import DiagnoseConfig, model_of
    from rankscope.analysis.network import pair_table
    from rankscope.analysis.runner import ResultCache, result_key, store_version

    config = _options["config"] or DiagnoseConfig()
    cache = ResultCache(store)
    keys = {name: result_key(f"dashboard:{name}", [store_version(store, [how.source, how.flow_job])],
                             (how, config)) for name in NETWORK_TABLES}
    got = {name: _ipc(cache.get_bytes(k)) for name, k in keys.items()}
    if all(v is not None for v in got.values()):
        return got
    try:
        model = model or model_of(load_planned(store, how.name, how), config)
        found = pair_table(model.strategy, model.flows.inference.job_flows if model.flows else None,
                           model.steps_section.count, config.topology)
    except RankscopeError as e:
        return {"errors": {"traffic_pairs": public_error("pair matrix failed", e)}}
    if found is None:
        return {}
    out = {"traffic_pairs": found[0], "endpoints": found[1].frame}
    for name, k in keys.items():
        cache.put_bytes(k, _ipc_bytes(out[name]))
    return out


def _ipc(data: bytes | None):
    import io

    import polars as pl

    if data is None:
        return None
    try:
        return pl.read_ipc(io.BytesIO(data))
    except (OSError, ValueError, pl.exceptions.PolarsError):
        return None


def _ipc_bytes(frame) -> bytes:
    import io

    buf = io.BytesIO()
    frame.write_ipc(buf)
    return buf.getvalue()


def clear_cache() -> None:
    """Forget every cached analysis (tests)."""
    with _cache_lock:
        _cache.clear()


class JobViews:
    """The job plans per store (recomputed only when the store changed) and the route to
    :func:`cached_analysis` for one (store, job, baseline)."""

    def __init__(self):
        self._plans: dict[str, tuple[tuple, dict]] = {}
        self._lock = threading.Lock()

    def plan(self, store_dir: str) -> dict[str, PlannedJob]:
        """The store's jobs (see :func:`job_plan`), recomputed only when the store changed."""
        store = Store(store_dir).snapshot()  # one set of commits for the signature and the plan
        sig = store_signature(store, None)
        with self._lock:
            hit = self._plans.get(str(store_dir))
            if hit is not None and hit[0] == sig:
                return hit[1]
        plan = job_plan(store)
        with self._lock:
            self._plans[str(store_dir)] = (sig, plan)
        return plan

    def _located(self, store_dir: str, job: str) -> tuple[Store, PlannedJob, tuple]:
        from rankscope.analysis.runner import PlannedJob

        how = self.plan(store_dir).get(job) or PlannedJob(job, "job", job)
        store = Store(store_dir).snapshot()  # the frames read later see the commits the signature names
        return store, how, store_signature(store, how.source)

    def version(self, store_dir: str, job: str, baseline_dir: str | None = None,
                baseline_job: str | None = None) -> str:
        """The version :meth:`get` would answer for, without analysing (cheap: file names and sizes)."""
        return self._where(store_dir, job, baseline_dir, baseline_job)[0]

    def _where(self, store_dir, job, baseline_dir, baseline_job):
        store, how, sig = self._located(store_dir, job)
        bjob = baseline_job or job
        base = self._located(baseline_dir, bjob) if baseline_dir else None
        version = version_of(str(store_dir), job, how, sig, baseline_dir or "", bjob if base else "",
                             base[1:] if base else None)
        return version, store, how, ((base[0], bjob, base[1]) if base else None)

    def get(self, store_dir: str, job: str, baseline_dir: str | None = None,
            baseline_job: str | None = None) -> JobAnalysis:
        """The analysis of one job (against a baseline run when given) at the store's current version."""
        version, store, how, base = self._where(store_dir, job, baseline_dir, baseline_job)
        return cached_analysis(version, store, job, how, base)
