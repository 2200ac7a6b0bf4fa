"""analyze and diff report the same step time for every kind of store (the one step definition)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankscope.cli.main import main
from rankscope.collectors.ingest import ingest
from rankscope.collectors.store import Store

REPO = Path(__file__).resolve().parents[2]


def _analyze_and_diff(store: Path, job: str, tmp: Path) -> tuple[float, float]:
    out = tmp / f"out-{job}"
    assert main(["analyze", "--store", str(store), "--job", job, "--out-dir", str(out), "--no-html"]) == 0
    analyze_ms = json.loads((out / f"{job}.json").read_text())["steps"]["median_ns"] / 1e6
    dj = tmp / f"diff-{job}.json"
    assert main(["diff", "--baseline", str(store), "--store", str(store), "--job", job, "--json", str(dj)]) == 0
    rows = [r for r in json.loads(dj.read_text())["rows"] if r["aspect"] == "step"]
    assert len(rows) == 1 and rows[0]["baseline"] == rows[0]["current"]
    return analyze_ms, rows[0]["current"]


def test_simulated_store(tmp_path):
    st = tmp_path / "sim"
    assert main(["simulate", "--out", str(st), "--dp", "2", "--pp", "2", "--steps", "4", "--microbatches", "2",
                 "--no-flows", "--fault", "clock-skew:max_ms=4"]) == 0
    a, d = _analyze_and_diff(st, "default", tmp_path)
    assert a == pytest.approx(d, rel=1e-12)
    truth = json.loads((st / "truth.json").read_text())["jobs"]["default"]["step_times_ns"]
    # per-rank period: within 0.5 % of the simulator's own steps (job-wide spans are ~18 % off here)
    assert a == pytest.approx(sorted(truth)[len(truth) // 2] / 1e6, rel=0.005)


def test_bundled_demo_store(tmp_path):
    st = Store(tmp_path / "demo")
    ingest(st, [REPO / "datasets" / "samples" / "demo"])
    a, d = _analyze_and_diff(st.root, "default", tmp_path)
    assert a == pytest.approx(d, rel=1e-12) and a > 0


@pytest.mark.parametrize("job", ["AR", "ST", "SE"])
def test_osdi_reference_stores(reference_dir, tmp_path, job):
    st = Store(tmp_path / "osdi")
    ingest(st, [reference_dir / "stragglers-osdi25" / f"trace-{job}.parquet"])
    a, d = _analyze_and_diff(st.root, job, tmp_path)
    assert a == pytest.approx(d, rel=1e-12) and a > 1000
