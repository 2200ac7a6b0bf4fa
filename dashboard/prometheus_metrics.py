"""Prometheus series from rankscope's analysis: the figures SREs already alert on.

Naming follows Prometheus practice: a ``rankscope_`` prefix, base units
(``_seconds``, ``_bytes``), ``_total`` on counters, ``_ratio`` on unitless
fractions. Labels are ``job``, ``rank``, ``stage``, ``dp_rank`` and ``host``
where known; nothing of high cardinality: message sizes are bucketed the way
NCCL Inspector buckets ``message_size`` (powers of 4 from 1 KiB up).

The straggler score per rank follows NVIDIA's straggler detection
(nvidia-resiliency-ext): the *relative* score is the median rank's compute
time per step over this rank's (1 = typical, 0.5 = takes twice as long as its
peers), the *individual* score is this rank's best step over its recent steps
(1 = as fast as it has ever been). Both use only non-warm-up steps.

:func:`job_samples` is pure (a Diagnosis and its tables in, samples out);
:class:`StoreCollector` feeds them to prometheus_client, analysing each job
once per store version.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import field
from pathlib import Path

import polars as pl

from rankscope.analysis.report import Diagnosis
from rankscope.collectors.record_class import record

SIZE_BUCKETS_BYTES = (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28)
"""upper bounds of the comm size buckets (label ``size_bucket``: ``le_1KiB`` ... ``gt_256MiB``)."""
RECENT_STEPS = 3
"""steps that make a rank's *current* time for the individual score."""


@record
class Family:
    name: str
    kind: str
    """``gauge`` or ``counter`` (a counter's name ends in ``_total``)."""
    help: str
    labels: tuple[str, ...]


FAMILIES = {f.name: f for f in (
    Family("rankscope_step_time_seconds", "gauge", "median step time (warm-up steps left out)", ("job",)),
    Family("rankscope_steps", "gauge", "steps the median was taken over", ("job",)),
    Family("rankscope_slowdown_ratio", "gauge",
           "what-if slowdown S = T / T_ideal (1 = no straggling; NaN when not evaluated)", ("job",)),
    Family("rankscope_waste_ratio", "gauge", "share of step time lost to stragglers, 1 - 1/S (0 when S <= 1)",
           ("job",)),
    Family("rankscope_verdict_info", "gauge", "1 for the straggler verdict and its basis", ("job", "verdict", "basis")),
    Family("rankscope_findings", "gauge", "anomalies found, by kind (listed even below the verdict threshold)",
           ("job", "kind")),
    Family("rankscope_regressions", "gauge", "GEMM regression findings", ("job",)),
    Family("rankscope_hangs", "gauge", "stuck collectives", ("job",)),
    Family("rankscope_missing_ranks", "gauge", "ranks the sources declare but no record covers", ("job",)),
    Family("rankscope_rank_compute_seconds", "gauge", "median compute time per step of a rank",
           ("job", "rank", "stage", "dp_rank", "host")),
    Family("rankscope_rank_straggler_score", "gauge",
           "NVIDIA straggler-detection score: relative = peers' median over own compute time, individual = "
           "own best step over own recent steps (1 = no straggling)",
           ("job", "rank", "stage", "dp_rank", "host", "score")),
    Family("rankscope_comm_bytes_total", "counter", "bytes moved by collectives and p2p, by op and size bucket",
           ("job", "op", "size_bucket")),
    Family("rankscope_traffic_bytes_total", "counter", "flow bytes by traffic class (control: rendezvous and control ports)",
           ("job", "traffic_class")),
    Family("rankscope_records_total", "counter", "records stored, by record kind", ("store_job", "kind")),
    Family("rankscope_rejected_records_total", "counter", "records rejected at ingest or collection, by reason",
           ("reason",)),
    Family("rankscope_collector_datagrams_total", "counter", "datagrams the flow collector received",
           ("store_job",)),
    Family("rankscope_collector_dropped_datagrams_total", "counter",
           "datagrams the kernel dropped before the collector read them", ("store_job",)),
    Family("rankscope_last_update_timestamp_seconds", "gauge", "when the store last received records (Unix time)",
           ("store_job",)),
    Family("rankscope_analysis_timestamp_seconds", "gauge", "when this job was last analysed (Unix time)",
           ("job",)),
    # live: the latest window `rankscope watch` analysed (one file per job, replaced per window)
    Family("rankscope_window_step", "gauge", "last step of the latest window rankscope watch analysed", ("job",)),
    Family("rankscope_window_slowdown_ratio", "gauge", "the latest window's S (NaN when not evaluated)", ("job",)),
    Family("rankscope_window_vs_median_ratio", "gauge",
           "the latest window's median step over the job's own median step so far (NaN for the first)", ("job",)),
    Family("rankscope_straggler_info", "gauge", "1 for the straggler the latest window names, by rank and cause",
           ("job", "rank", "cause")),
    Family("rankscope_straggler_windows", "gauge", "consecutive windows that named this straggler",
           ("job", "rank", "cause")),
    Family("rankscope_live_hang_info", "gauge", "1 for each rank a live hang names as never joining a collective",
           ("job", "rank")),
    Family("rankscope_window_dropped_total", "counter", "windows rankscope watch dropped because its analysis lagged",
           ("job",)),
)}


@record(frozen=False)
class Sample:
    family: str
    labels: dict[str, str]
    value: float


@record(frozen=False)
class Samples:
    items: list[Sample] = field(default_factory=list)

    def add(self, family: str, value: float, **labels) -> None:
        fam = FAMILIES[family]
        if set(labels) != set(fam.labels):
            raise ValueError(f"{family}: labels {sorted(labels)}; expected {sorted(fam.labels)}")
        self.items.append(Sample(family, {k: "" if v is None else str(v) for k, v in labels.items()}, float(value)))


def size_bucket(nbytes: int) -> str:
    for hi in SIZE_BUCKETS_BYTES:
        if nbytes <= hi:
            return f"le_{_human(hi)}"
    return f"gt_{_human(SIZE_BUCKETS_BYTES[-1])}"


def _human(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def rank_scores(timeline: pl.DataFrame, steps: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per rank: median compute per step and the relative and individual straggler scores.

    Needs timeline rank, step, compute_ns (one row per rank and step) and, when
    given, steps step, warmup (warm-up steps are left out). Returns rank,
    compute_ns, relative, individual.
    """
    schema = {"rank": pl.Int64, "compute_ns": pl.Float64, "relative": pl.Float64, "individual": pl.Float64}
    if timeline.is_empty():
        return pl.DataFrame(schema=schema)
    tl = timeline.filter(pl.col("compute_ns") > 0)
    if steps is not None and "warmup" in steps.columns and steps.height:
        warm = steps.filter(pl.col("warmup"))["step"].to_list()
        kept = tl.filter(~pl.col("step").is_in(warm))
        tl = kept if kept.height else tl
    if tl.is_empty():
        return pl.DataFrame(schema=schema)
    per = tl.sort("step").group_by("rank").agg(
        pl.col("compute_ns").median().alias("compute_ns"),
        pl.col("compute_ns").min().alias("best"),
        pl.col("compute_ns").tail(RECENT_STEPS).median().alias("recent"))
    typical = per["compute_ns"].median()
    return per.select(
        pl.col("rank").cast(pl.Int64), pl.col("compute_ns").cast(pl.Float64),
        (typical / pl.col("compute_ns")).alias("relative"),
        (pl.col("best") / pl.col("recent")).alias("individual")).sort("rank")


def _place(layout: pl.DataFrame | None, endpoint_map: pl.DataFrame | None) -> dict[int, dict]:
    place: dict[int, dict] = {}
    if layout is not None and layout.height:
        for r in layout.select("rank", "stage", "dp_rank").iter_rows(named=True):
            place[int(r["rank"])] = {"stage": r["stage"], "dp_rank": r["dp_rank"], "host": None}
    if endpoint_map is not None and endpoint_map.height and "rank" in endpoint_map.columns:
        for rank, host in endpoint_map.select("rank", "host").drop_nulls("rank").iter_rows():
            place.setdefault(int(rank), {"stage": None, "dp_rank": None, "host": None})["host"] = host
    return place


def job_samples(d: Diagnosis, tables: dict[str, pl.DataFrame], comm_op: pl.DataFrame | None = None,
                endpoint_map: pl.DataFrame | None = None, analysed_at: float | None = None) -> Samples:
    """The per-job series of one analysed job.

    Needs the Diagnosis and the tables of :func:`rankscope.analysis.diagnose.analyze_job`
    (``timeline``, ``steps``, ``layout`` where present), and optionally the
    job's comm_op (op, size_bytes) and endpoint_map (rank, host).
    """
    out = Samples()
    job = d.job
    ev_steps = d.steps.evaluated and d.steps.count > 0
    if ev_steps:
        out.add("rankscope_step_time_seconds", d.steps.median_ns / 1e9, job=job)
        out.add("rankscope_steps", d.steps.count, job=job)
    st = d.stragglers
    evaluated = st.evaluated
    out.add("rankscope_slowdown_ratio", st.slowdown if evaluated else math.nan, job=job)
    out.add("rankscope_waste_ratio", max(0.0, 1 - 1 / st.slowdown) if evaluated and st.slowdown > 0 else math.nan,
            job=job)
    out.add("rankscope_verdict_info", 1, job=job, verdict=st.verdict if evaluated else "not_evaluated",
            basis=st.basis or "")
    kinds: dict[str, int] = {}
    for f in d.findings:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    for kind, n in sorted(kinds.items()):
        out.add("rankscope_findings", n, job=job, kind=kind)
    out.add("rankscope_regressions", len(d.regressions), job=job)
    out.add("rankscope_hangs", len(d.hangs), job=job)
    out.add("rankscope_missing_ranks", d.data_quality.ranks.missing, job=job)
    place = _place(tables.get("layout"), endpoint_map)
    scores = rank_scores(tables.get("timeline", pl.DataFrame()), tables.get("steps"))
    for r in scores.iter_rows(named=True):
        p = place.get(r["rank"], {})
        lab = {"job": job, "rank": r["rank"], "stage": p.get("stage"), "dp_rank": p.get("dp_rank"),
               "host": p.get("host")}
        out.add("rankscope_rank_compute_seconds", r["compute_ns"] / 1e9, **lab)
        out.add("rankscope_rank_straggler_score", r["relative"], score="relative", **lab)
        out.add("rankscope_rank_straggler_score", r["individual"], score="individual", **lab)
    if comm_op is not None and comm_op.height:
        labels = [size_bucket(hi) for hi in SIZE_BUCKETS_BYTES] + [size_bucket(SIZE_BUCKETS_BYTES[-1] + 1)]
        # the bucket whose upper bound is the first >= the size (polars' cut did this and is deprecated)
        bucket = pl.lit(pl.Series(SIZE_BUCKETS_BYTES)).search_sorted(pl.col("size_bytes"), side="left")
        by = (comm_op.filter(pl.col("size_bytes").is_not_null())
              .with_columns(bucket.replace_strict(dict(enumerate(labels)), return_dtype=pl.Utf8).alias("b"))
              .group_by("op", "b").agg(pl.col("size_bytes").sum()).sort("op", "b"))
        for op, b, n in by.iter_rows():
            out.add("rankscope_comm_bytes_total", n, job=job, op=op, size_bucket=b)
    flows = d.data_quality.flows
    if flows is not None and "control_bytes" in flows:
        # the bytes set apart from the training links (rendezvous and control ports)
        out.add("rankscope_traffic_bytes_total", flows["control_bytes"], job=job, traffic_class="control")
    out.add("rankscope_analysis_timestamp_seconds", analysed_at if analysed_at is not None else time.time(), job=job)
    return out


def store_samples(manifest: Iterable, parts_mtime: dict[str, float]) -> Samples:
    """Store-wide series from the manifest entries (records, rejects, collector figures)."""
    out = Samples()
    records: dict[tuple[str, str], int] = {}
    rejects: dict[str, int] = {}
    datagrams: dict[str, int] = {}
    drops: dict[str, int] = {}
    for m in manifest:
        for kind, n in m.records.items():
            records[(m.job, kind)] = records.get((m.job, kind), 0) + int(n)
        for reason, n in m.rejects.items():
            rejects[reason] = rejects.get(reason, 0) + int(n)
        if m.format == "collect-flows":
            datagrams[m.job] = datagrams.get(m.job, 0) + int(m.notes.get("datagrams", 0) or 0)
            drops[m.job] = drops.get(m.job, 0) + int(m.notes.get("kernel_drops", 0) or 0)
    for (job, kind), n in sorted(records.items()):
        out.add("rankscope_records_total", n, store_job=job, kind=kind)
    for reason, n in sorted(rejects.items()):
        out.add("rankscope_rejected_records_total", n, reason=reason)
    for job, n in sorted(datagrams.items()):
        out.add("rankscope_collector_datagrams_total", n, store_job=job)
        out.add("rankscope_collector_dropped_datagrams_total", drops.get(job, 0), store_job=job)
    for job, t in sorted(parts_mtime.items()):
        out.add("rankscope_last_update_timestamp_seconds", t, store_job=job)
    return out


def _culprit_rank(culprit) -> str:
    """The rank (or address, stage, group) a window's culprit names, as one label value."""
    if isinstance(culprit, dict):
        for key in ("rank", "endpoint", "one_of", "ranks", "stage"):
            if culprit.get(key) is not None:
                v = culprit[key]
                return ",".join(map(str, v)) if isinstance(v, list) else str(v)
        return ""
    return "" if culprit is None else str(culprit)


def live_samples(live: dict[str, dict]) -> Samples:
    """Series of each job's latest live window (job -> the WindowEvent object ``rankscope watch`` keeps)."""
    out = Samples()
    for job, e in sorted(live.items()):
        if e.get("kind") == "hang":
            culprit = e.get("culprit") or {}
            ranks = culprit.get("one_of") or [culprit.get("rank")] if isinstance(culprit, dict) else []
            for r in [r for r in ranks if r is not None]:
                out.add("rankscope_live_hang_info", 1, job=job, rank=r)
        else:
            out.add("rankscope_window_step", e["window_end_step"], job=job)
            out.add("rankscope_window_slowdown_ratio", _num(e.get("slowdown")), job=job)
            out.add("rankscope_window_vs_median_ratio", _num(e.get("vs_job_median")), job=job)
        if e.get("straggler"):
            lab = {"job": job, "rank": _culprit_rank(e.get("culprit")), "cause": e.get("verdict") or ""}
            out.add("rankscope_straggler_info", 1, **lab)
            out.add("rankscope_straggler_windows", e.get("straggler_windows", 1), **lab)
        out.add("rankscope_window_dropped_total", e.get("dropped_windows", 0), job=job)
    return out


def _num(v) -> float:
    return math.nan if v is None else float(v)


def merge_samples(samples: Iterable[Sample]) -> list[Sample]:
    """One sample per series when several stores report it: counters add up, gauges keep the largest."""
    merged: dict[tuple, Sample] = {}
    for s in samples:
        key = (s.family, tuple(sorted(s.labels.items())))
        prev = merged.get(key)
        if prev is None:
            merged[key] = Sample(s.family, s.labels, s.value)
        elif FAMILIES[s.family].kind == "counter":
            prev.value += s.value
        else:
            prev.value = max(prev.value, s.value)
    return list(merged.values())


def families(samples: Iterable[Sample]) -> Iterator:
    """prometheus_client metric families, one per family name that has samples."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    grouped: dict[str, list[Sample]] = {}
    for s in samples:
        grouped.setdefault(s.family, []).append(s)
    for name, items in grouped.items():
        fam = FAMILIES[name]
        if fam.kind == "counter":
            mf = CounterMetricFamily(name.removesuffix("_total"), fam.help, labels=list(fam.labels))
        else:
            mf = GaugeMetricFamily(name, fam.help, labels=list(fam.labels))
        for s in items:
            mf.add_metric([s.labels[k] for k in fam.labels], s.value)
        yield mf


def _metric_inputs(store, planned) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """The comm_op sizes and endpoint_map of a job whose analysis came from the cache."""
    src = planned.source
    comm = store.read("comm_op", src, columns=["op", "size_bytes"]) \
        if planned.kind == "job" and store.count("comm_op", src) else None
    em = store.read("endpoint_map", src) if store.count("endpoint_map", src) else None
    return comm, em


def _job_versions(manifest: Iterable, mtimes: dict[str, float]) -> dict[str, tuple]:
    """Per store job, what changes whenever its records land: its manifest entries and its newest part."""
    entries: dict[str, list] = {}
    for m in manifest:
        entries.setdefault(m.job, []).append((m.key, m.ingested_at))
    return {job: (tuple(sorted(entries.get(job, ()))), mtimes.get(job, 0.0)) for job in set(entries) | set(mtimes)}


def _parts_mtime(store) -> dict[str, float]:
    out: dict[str, float] = {}
    root = Path(store.root)
    for part in root.glob("*/job=*/*.parquet"):
        job = part.parent.name.removeprefix("job=")
        out[job] = max(out.get(job, 0.0), part.stat().st_mtime)
    return out


class StoreCollector:
    """A prometheus_client collector over one or more stores; each job is analysed once per version of its
    records.

    A job that ``rankscope watch`` follows is not re-analysed while its records keep landing: its window
    series come from watch, once per window, so a scrape's cost does not grow with the job's length. It is
    analysed whole once its records have been still for ``settle_s`` (the job ended or paused), and before
    that only if it was never analysed. Any other job is re-analysed when its records change.
    """

    def __init__(self, stores: list, job: str | None = None, config=None, settle_s: float = 30.0,
                 clock=time.time):
        self.stores = stores
        self.job = job
        self.config = config
        self.settle_s = settle_s
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[tuple, list[Sample]]] = {}
        self.analyses = 0
        """whole-job analyses run so far (the figure that must not grow per scrape of a live job)."""

    def _followed_live(self, planned, live: dict[str, dict], mtimes: dict[str, float]) -> bool:
        """Whether watch follows this job and its records are still landing."""
        e = live.get(planned.name) or live.get(planned.source)
        if not e:
            return False
        return self.clock() - mtimes.get(planned.source, 0.0) < self.settle_s

    def _analyse_job(self, store, planned) -> list[Sample]:
        from rankscope.analysis.diagnose import analyze_job
        from rankscope.analysis.runner import ResultCache, cached_analysis, load_planned, with_capture

        loaded = {}

        def compute():
            frames = load_planned(store, planned)
            d, tables = analyze_job(frames, self.config)
            loaded["frames"] = frames
            return with_capture(d, planned), tables

        # the one computation `analyze` also caches: a store analysed there is not analysed again here
        d, tables, _hit = cached_analysis(store, planned, self.config, compute, ResultCache(store))
        self.analyses += 1
        if "frames" in loaded:
            comm_op, endpoint_map = loaded["frames"].comm_op, loaded["frames"].endpoint_map
        else:
            comm_op, endpoint_map = _metric_inputs(store, planned)
        return job_samples(d, tables, comm_op, endpoint_map).items

    def _store_samples(self, store, live: dict[str, dict]) -> list[Sample]:
        """Every job's series (analysed or cached) and the store's own series, from one snapshot."""
        from rankscope.analysis.runner import plan_jobs

        store = store.snapshot()  # one set of commits for the plan, every job's frames and the manifest
        manifest, mtimes = store.manifest(), _parts_mtime(store)  # read once per scrape, for every job
        versions = _job_versions(manifest, mtimes)
        out: list[Sample] = []
        for planned in plan_jobs(store, self.job):
            key = (str(store.root), f"{planned.source}/{planned.name}")
            version = versions.get(planned.source, ((), 0.0))
            cached = self._cache.get(key)
            if cached is None or (cached[0] != version and not self._followed_live(planned, live, mtimes)):
                cached = (version, self._analyse_job(store, planned))
                self._cache[key] = cached
            out.extend(cached[1])
        out.extend(store_samples(manifest, mtimes).items)
        return out

    def samples(self) -> list[Sample]:
        out: list[Sample] = []
        for store in self.stores:
            live = {j: e for j, e in store.live().items() if self.job is None or j == self.job}
            out.extend(self._store_samples(store, live))
            out.extend(live_samples(live).items)
        return merge_samples(out)

    def collect(self):
        yield from families(self.samples())
