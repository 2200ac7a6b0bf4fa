"""A flow capture recognised from partitions (runner.capture_split) equals the capture recognised whole
(fabric.recognise.recognise_jobs), piece by piece: the pair table frame for frame, the quality counts, the
clock, the bursts job evidence counts, the recognised jobs and their endpoints; and a recognised job's
records read alone equal those the embedded plan filters from the whole capture.

Real captures (every tests/data/netns_gloo capture: softflowd and nfpcapd IPFIX, pmacct sFlow at 1 in
16..512) and simulated ones (a shared fabric with background, rail copies, sampling, exporter clocks,
millisecond timestamps, TCP, a second exporter that times some pairs, or sees every pair's bytes too), each cut into partitions of a few records, so that pairs, connections,
bursts and clocks straddle them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.fabric.clock import flow_resolution_ns
from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.job_evidence import burst_counts
from rankscope.analysis.fabric.pair_traffic import pair_traffic
from rankscope.analysis.fabric.rails import peak_correlation
from rankscope.analysis.fabric.recognise import recognise_jobs
from rankscope.analysis.runner import capture_rails
from rankscope.analysis.runner.capture_partials import (
    BURST_HULL_GAP_NS,
    bucket_burst_counts,
    capture_resolution,
    flow_partial,
    merge_partials,
    pair_quality,
    pair_table,
)
from rankscope.analysis.runner.capture_split import (
    capture_partitions,
    load_capture_job,
    partition_partial,
    partition_partial_buckets,
    plan_jobs_split,
    recognise_split,
)
from rankscope.analysis.runner.plan import load_planned, plan_jobs
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.schema import conform
from rankscope.collectors.store import Store

sim = pytest.importorskip("rankscope.datasets.simulator")
DATA = Path(__file__).resolve().parents[3] / "data" / "netns_gloo"
TRUTH = json.loads((DATA / "truth.json").read_text())


def _real(name: str) -> pl.DataFrame:
    nfdump = DATA / f"{name}.nfdump.json"
    if nfdump.exists():
        from rankscope.collectors.flows.flow_files import read_nfdump_json

        df = read_nfdump_json(nfdump, nfdump.read_text(), {"tz_offset_s": "0"})
        return pl.from_arrow(conform(df.with_columns(job=pl.lit("fabric")), "flow"))
    return pl.read_parquet(DATA / f"{name}.flows.parquet").with_columns(job=pl.lit("fabric"), source=pl.lit("ipfix"))


def _sim(realism: str = "", **kw) -> pl.DataFrame:
    from rankscope.datasets.sim.realism import realism_from

    cfg = dict(job="r", dp=4, pp=2, tp=2, gpus_per_host=2, steps=4, seed=5, rank_order="tp-cp-ep-pp-dp")
    cfg.update(kw)
    if realism:
        cfg["realism"] = realism_from(realism)
    return pl.from_arrow(sim.simulate(sim.SimConfig(**cfg)).tables["flow"])


def _fabric() -> pl.DataFrame:
    cfgs = [sim.SimConfig(job="a", dp=4, pp=2, gpus_per_host=1, steps=4, seed=1),
            sim.SimConfig(job="b", dp=2, pp=2, tp=2, gpus_per_host=2, steps=4, seed=2, rank_order="tp-cp-ep-pp-dp")]
    return pl.from_arrow(sim.simulate_fabric(cfgs, background=True).flow)


def _two_exporters(tied: bool = False) -> pl.DataFrame:
    """The rails job seen by a second exporter too, 1 us later: a spine that saw twice the bytes of the
    pairs going up the address order (it times those pairs) and half of those going down (the leaf times
    them); ``tied``: the same bytes as the leaf (both saw every transfer whole)."""
    flow = _sim()
    up = pl.col("src_addr") < pl.col("dst_addr")
    scaled = [pl.when(up).then(pl.col(c) * 2).otherwise(pl.col(c) // 2).alias(c) for c in ("size_bytes", "est_size_bytes")]
    spine = flow.with_columns(*([] if tied else scaled), exporter=pl.lit("10.254.0.1/0"),
                              start_ns=pl.col("start_ns") + 1_000, end_ns=pl.col("end_ns") + 1_000)
    return pl.concat([flow, spine]).sort("start_ns")


CAPTURES = {
    **{f"real:{n}": (lambda n=n: _real(n)) for n in sorted(TRUTH)},
    "sim:fabric": _fabric,
    "sim:rails": _sim,
    "sim:rails_ms_clock": lambda: _sim("timestamp_ns=1000000"),
    "sim:rails_exporter_offsets": lambda: _sim("exporter_offset_ms=2,hosts_per_pod=4"),
    "sim:tcp_reverse": lambda: _sim("transport=tcp,reverse=true"),
    "sim:two_exporters": _two_exporters,
    "sim:two_exporters_tied": lambda: _two_exporters(tied=True),
    "sim:sampled": lambda: _sim(dp=4, pp=2, tp=1, gpus_per_host=1, steps=6, seed=3, sampling=64),
}


def _config(name: str) -> FlowConfig:
    real = name.removeprefix("real:")
    return FlowConfig.with_rendezvous(TRUTH[real]["master_port"]) if real in TRUTH else FlowConfig()


@pytest.fixture(scope="module", params=sorted(CAPTURES))
def capture(request, tmp_path_factory):
    """(name, store holding the capture ``fabric`` as 3 part files, its partitions of ~1/7 each, config)."""
    flow = CAPTURES[request.param]()
    store = Store(tmp_path_factory.mktemp("cap") / "st")
    step = -(-flow.height // 3)
    for i in range(0, flow.height, step):
        store.write("flow", conform(flow.slice(i, step), "flow"), job="fabric")
    parts = capture_partitions(store, "fabric", max(1, flow.height // 7))
    return request.param, store, parts, _config(request.param)


def test_merged_partials_give_the_whole_capture_s_pairs_quality_and_clock(capture):
    _, store, parts, cfg = capture
    whole = store.read("flow", "fabric")
    pt = pair_traffic(whole, cfg)
    merged = merge_partials([partition_partial(p, cfg) for p in parts])
    assert len(parts) > 3
    assert pair_table(merged).equals(pt.pairs)
    assert pair_quality(merged) == pt.quality
    assert capture_resolution(merged) == flow_resolution_ns(pt.training_flows)


def test_burst_hulls_count_the_records_bursts(capture):
    _, store, parts, cfg = capture
    payload = pair_traffic(store.read("flow", "fabric"), cfg).training_flows.filter(pl.col("is_data"))
    hulls = merge_partials([partition_partial(p, cfg) for p in parts]).bursts
    for gap in (BURST_HULL_GAP_NS, 20 * 1_000_000, 10**9):
        key = ["src_addr", "dst_addr"]
        assert burst_counts(hulls, gap).sort(key).equals(burst_counts(payload, gap).sort(key)), gap


def test_bucketed_bursts_count_the_records_bursts(capture):
    """Each partition's hulls split by pair into 3 buckets, each bucket's pairs counted across all
    partitions (a reduce task's work): every pair in exactly one bucket, with the records' count."""
    _, store, parts, cfg = capture
    payload = pair_traffic(store.read("flow", "fabric"), cfg).training_flows.filter(pl.col("is_data"))
    outs = [partition_partial_buckets(p, cfg, 3) for p in parts]
    assert all(o[0].bursts.is_empty() and len(o) == 4 for o in outs)
    key = ["src_addr", "dst_addr"]
    for gap in (BURST_HULL_GAP_NS, 20 * 1_000_000, 10**9):
        counts = pl.concat([bucket_burst_counts(gap, *[o[1 + k] for o in outs]) for k in range(3)])
        assert counts.sort(key).equals(burst_counts(payload, gap).sort(key)), gap


@pytest.mark.parametrize("num_buckets", [None, 3])
def test_split_recognition_gives_the_embedded_jobs_and_quality(capture, num_buckets):
    name, store, parts, cfg = capture
    whole = recognise_jobs(store.read("flow", "fabric"), "fabric", cfg)
    split = recognise_split(parts, "fabric", cfg, num_buckets=num_buckets)
    assert whole.jobs, name
    assert split.jobs == whole.jobs
    assert split.quality == whole.quality


def test_split_recognition_holds_burst_counts_not_bursts(capture, monkeypatch):
    """The driver's merged partial holds no burst; job evidence gets one count per directed pair."""
    from rankscope.analysis.fabric import recognise

    _, _, parts, cfg = capture
    seen = []
    real = recognise._with_evidence

    def spy(members, rails, nodes, heavy, flows, resolution, c, quality, bursts=None):
        seen.append((flows, bursts))
        return real(members, rails, nodes, heavy, flows, resolution, c, quality, bursts)

    monkeypatch.setattr(recognise, "_with_evidence", spy)
    recognise_split(parts, "fabric", cfg, num_buckets=2)
    (flows, bursts), = seen
    assert flows.is_empty() and bursts is not None
    assert bursts.columns == ["src_addr", "dst_addr", "bursts"]
    assert bursts.select("src_addr", "dst_addr").is_unique().all()


def test_a_recognised_job_reads_only_its_own_records(capture):
    _, store, _, cfg = capture
    plan = [p for p in plan_jobs(store, None, None, cfg) if p.kind == "capture"]
    assert plan_jobs_split(store, None, None, cfg) == plan
    for planned in plan:
        alone, embedded = load_capture_job(store, planned), load_planned(store, planned)
        assert alone.flow.equals(embedded.flow)
        assert alone.job_endpoints == embedded.job_endpoints and alone.job == embedded.job


def test_rail_copies_are_joined_by_the_second_pass(monkeypatch, tmp_path):
    """Two rails of one job with no rendezvous traffic: only their lockstep activity, binned in the
    second pass, joins them; with one rail an hour off, nothing does, in both engines."""
    planned = []
    real_plan = capture_rails.rail_plan

    def spy(*a, **k):
        planned.append(real_plan(*a, **k))
        return planned[-1]

    monkeypatch.setattr("rankscope.analysis.runner.capture_split.rail_plan", spy)
    flow = _sim()
    off = flow.with_columns(pl.when(pl.col("src_addr").str.starts_with("10.1.")).then(pl.col(c) + 3_600_000_000_000)
                            .otherwise(pl.col(c)).alias(c) for c in ("start_ns", "end_ns"))
    for f, one_job in ((flow, True), (off, False)):
        store = Store(tmp_path / str(one_job))
        store.write("flow", conform(f, "flow"), job="fabric")
        parts = capture_partitions(store, "fabric", max(1, f.height // 5))
        split, whole = recognise_split(parts, "fabric", FlowConfig()), recognise_jobs(f, "fabric")
        assert planned[-1].pairs and split.jobs == whole.jobs
        assert (len(split.jobs) == 1 and len(split.jobs[0].endpoints) == 16) == one_job


def test_an_empty_partition_adds_nothing():
    cfg = FlowConfig()
    flow = _sim()
    a = merge_partials([flow_partial(flow, cfg)])
    b = merge_partials([flow_partial(flow.head(0), cfg), flow_partial(flow, cfg), flow_partial(flow.head(0), cfg)])
    assert pair_table(a).equals(pair_table(b)) and pair_quality(a) == pair_quality(b)
    assert capture_resolution(a) == capture_resolution(b)
    assert np.array_equal(a.bursts.sort(["src_addr", "dst_addr", "start_ns"]).to_numpy(),
                          b.bursts.sort(["src_addr", "dst_addr", "start_ns"]).to_numpy())


@pytest.mark.parametrize("n,max_lag", [(50, 3), (1000, 20), (10, 30), (300, 0), (5000, 7), (20, 9)])
def test_peak_correlation_lag_by_lag_is_the_fft_s(n, max_lag):
    """fabric.rails.peak_correlation correlates lag by lag (or by a short FFT) where a whole-series FFT
    gives the same peak."""
    rng = np.random.default_rng(n)
    a = rng.normal(size=n)
    b = np.roll(a, 2) + 0.1 * rng.normal(size=n)
    a, b = ((x - x.mean()) / np.linalg.norm(x - x.mean()) for x in (a, b))
    size = 1 << int(np.ceil(np.log2(2 * n + 1)))
    lags = np.r_[np.arange(size - max_lag, size), np.arange(0, max_lag + 1)]
    cc = np.fft.irfft(np.fft.rfft(a, size) * np.conj(np.fft.rfft(b, size)), size)[lags]
    k = int(np.argmax(cc))
    fft_peak = -1.0 if 0 < max_lag and k in (0, len(lags) - 1) else float(cc[k])
    assert peak_correlation([a], [b], max_lag)[0] == pytest.approx(fft_peak, abs=1e-12)


def test_a_pair_two_exporters_saw_alike_is_timed_by_the_same_one_every_run():
    """Leaf and spine saw each transfer whole: the pair table names the first exporter by name, every
    run (the pick went by row order, which polars' group_by does not keep)."""
    flow = _two_exporters(tied=True)
    picks = {tuple(pair_traffic(flow).pairs["exporter"].to_list()) for _ in range(6)}
    assert picks == {("10.254.0.1/0",) * 32}


def test_a_part_file_over_the_partition_size_splits_into_equal_ranges(tmp_path):
    """A file just over the limit gives two halves, not a full partition and a sliver; the ranges cover
    every row once, in order."""
    store = Store(tmp_path / "st")
    flow = pl.concat([_sim()] * 4).head(1_003)
    store.write("flow", conform(flow, "flow"), job="fabric")
    parts = capture_partitions(store, "fabric", 1_000)
    assert [(p.offset, p.num_rows) for p in parts] == [(0, 501), (501, 502)]
    sizes = [p.num_rows for p in capture_partitions(store, "fabric", 300)]
    assert sum(sizes) == 1_003 and max(sizes) - min(sizes) <= 1 and max(sizes) <= 300
    with pytest.raises(ConfigError, match="partition rows"):
        capture_partitions(store, "fabric", 0)


def test_partials_folded_as_they_arrive_give_the_same_jobs(capture, monkeypatch):
    """The driver merges the partitions' partials a few at a time (MERGE_EVERY), not all at the end:
    any grouping gives the same jobs and quality."""
    name, store, parts, cfg = capture
    whole = recognise_split(parts, "fabric", cfg, num_buckets=2)
    monkeypatch.setattr("rankscope.analysis.runner.capture_split.MERGE_EVERY", 1)
    folded = recognise_split(parts, "fabric", cfg, num_buckets=2)
    assert folded.jobs == whole.jobs and folded.quality == whole.quality, name
