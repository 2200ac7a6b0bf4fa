"""rankscope metrics: Prometheus series of a simulated store, scraped over HTTP and read as a textfile,
parsed with prometheus_client's own parser."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from rankscope.collectors.store import Store  # noqa: E402
from rankscope.dashboard.prometheus_metrics import rank_scores, size_bucket  # noqa: E402
from rankscope.datasets.simulator import Fault, SimConfig, simulate, write_store  # noqa: E402

BIN = Path(sys.executable).parent
SLOW_RANK = 5


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    cfg = SimConfig(dp=4, pp=2, steps=5, microbatches=4, layers=8, seed=3, flows=False, gemm_records=False,
                    faults=(Fault("slow-worker", {"rank": SLOW_RANK, "factor": 1.5}),))
    out = tmp_path_factory.mktemp("metrics") / "st"
    write_store(simulate(cfg), out)
    return out


def metric_series(text: str) -> dict[str, list]:
    """Prometheus exposition text parsed into samples by series name (also used by the watch tests)."""
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _check(series: dict[str, list]) -> None:
    assert all(name.startswith("rankscope_") for name in series)
    step = series["rankscope_step_time_seconds"]
    assert len(step) == 1 and step[0].labels["job"] and 0 < step[0].value < 60
    (S,) = series["rankscope_slowdown_ratio"]
    assert S.value > 1.05
    scores = [s for s in series["rankscope_rank_straggler_score"] if s.labels["score"] == "relative"]
    assert len(scores) == 8 and all(s.labels["job"] == step[0].labels["job"] for s in scores)
    worst = min(scores, key=lambda s: s.value)
    # the slowed rank computes 1.5x its peers: the relative score is the peers' median over its own
    assert worst.labels["rank"] == str(SLOW_RANK) and worst.value == pytest.approx(1 / 1.5, rel=0.05)
    assert worst.labels["stage"] != "" and worst.labels["dp_rank"] != ""
    assert series["rankscope_records_total"]
    # counters carry _total, per Prometheus naming
    assert any(n.endswith("_total") for n in series)


def test_textfile_parses_and_names_the_slow_rank(store, tmp_path):
    out = tmp_path / "rankscope.prom"
    r = subprocess.run([str(BIN / "rankscope"), "metrics", "--store", str(store), "--textfile", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    series = metric_series(out.read_text())
    _check(series)
    # bytes per op and size bucket: each record in the bucket size_bucket names for it
    comm = Store(store).read("comm_op", columns=["op", "size_bytes"]).drop_nulls("size_bytes")
    want: dict[tuple[str, str], int] = {}
    for op, size in comm.iter_rows():
        want[op, size_bucket(size)] = want.get((op, size_bucket(size)), 0) + size
    got = {(s.labels["op"], s.labels["size_bucket"]): s.value for s in series["rankscope_comm_bytes_total"]}
    assert len(want) > 1 and got == want


def test_http_endpoint_serves_the_same_series(store):
    proc = subprocess.Popen([str(BIN / "rankscope"), "metrics", "--store", str(store), "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()  # "serving metrics on http://127.0.0.1:PORT/metrics"
        assert "serving metrics on" in line, line
        url = line.split()[-1]
        deadline = time.monotonic() + 120
        while True:
            try:
                body = urllib.request.urlopen(url, timeout=120).read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        _check(metric_series(body))
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_missing_store_is_a_usage_error(tmp_path):
    r = subprocess.run([str(BIN / "rankscope"), "metrics", "--store", str(tmp_path / "nope"), "--textfile",
                        str(tmp_path / "x.prom")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "nope" in r.stderr


def test_scores_leave_warmup_out_and_compare_a_rank_with_its_own_best():
    tl = pl.DataFrame({"rank": [0, 0, 0, 1, 1, 1, 2, 2, 2], "step": [0, 1, 2] * 3,
                       "compute_ns": [900, 100, 100, 900, 100, 100, 900, 200, 400]})
    steps = pl.DataFrame({"step": [0, 1, 2], "warmup": [True, False, False]})
    s = {r["rank"]: r for r in rank_scores(tl, steps).iter_rows(named=True)}
    assert s[0]["relative"] == pytest.approx(1.0) and s[1]["relative"] == pytest.approx(1.0)
    assert s[2]["relative"] == pytest.approx(100 / 300)  # median of medians 100; rank 2's median 300
    assert s[2]["individual"] == pytest.approx(200 / 300)  # best 200, recent steps' median 300
    assert s[0]["individual"] == pytest.approx(1.0)


def test_size_buckets_are_few_and_bounded():
    assert size_bucket(1) == "le_1KiB" and size_bucket(1024) == "le_1KiB" and size_bucket(1025) == "le_4KiB"
    assert size_bucket(1 << 40) == "gt_256MiB"


def test_a_job_watch_follows_is_not_reanalysed_per_scrape_until_it_settles(store, tmp_path):
    import os
    import shutil

    from rankscope.collectors.store import Store
    from rankscope.dashboard.prometheus_metrics import StoreCollector

    root = tmp_path / "st"
    shutil.copytree(store, root)
    st = Store(root)
    (job,) = st.jobs()
    part = next(root.glob("comm_op/job=*/*.parquet"))
    now = [part.stat().st_mtime]

    def land():  # records land: the job's newest part is now
        now[0] += 1.0
        os.utime(part, (now[0], now[0]))

    col = StoreCollector([st], settle_s=30.0, clock=lambda: now[0])
    col.samples()
    assert col.analyses == 1
    land()
    col.samples()
    assert col.analyses == 2  # no watch follows it: records that land are analysed
    st.write_live(job, {"kind": "window", "job": job, "window_end_step": 3, "slowdown": 1.4, "straggler": True,
                        "verdict": "worker", "culprit": {"rank": SLOW_RANK}, "straggler_windows": 2})
    for step in (4, 5, 6):
        land()
        st.write_live(job, {"kind": "window", "job": job, "window_end_step": step, "slowdown": 1.4})
        series = {s.family: s for s in col.samples()}
        assert series["rankscope_window_step"].value == step  # the window series follow watch
        assert "rankscope_step_time_seconds" in series  # the last whole analysis is still served
    assert col.analyses == 2  # and the job was not analysed again while it ran
    now[0] += 31.0  # still for longer than settle_s: the job ended
    col.samples()
    assert col.analyses == 3
    col.samples()
    assert col.analyses == 3
