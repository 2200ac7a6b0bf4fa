"""analyze and diff report the same step time for every kind of store (the one step definition)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankscope.cli.main import main
from rankscope.collectors.ingest.files import ingest
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


@pytest.mark.torchjob
def test_real_job_step_time_is_the_jobs_own(tmp_path):
    """A real gloo DP2 x PP2 job's Kineto traces: analyze (= diff) gives the job's own step time, without
    its start-up step, even when it ran only 2 steps."""
    import statistics
    import subprocess
    import sys

    pytest.importorskip("torch")
    torchrun = Path(sys.executable).with_name("torchrun")
    job = REPO / "tests" / "jobs" / "train_dp_pp.py"
    if not torchrun.exists() or not job.is_file():
        pytest.skip("torchrun or the shared job script missing")
    out, prof = tmp_path / "out", tmp_path / "prof"
    subprocess.run([str(torchrun), "--nproc_per_node=4", "--standalone", str(job), "--steps", "2", "--hidden", "64",
                    "--out", str(out), "--profile", str(prof)], check=True, capture_output=True, timeout=600)
    st = Store(tmp_path / "st")
    ingest(st, [prof])
    a, d = _analyze_and_diff(st.root, "default", tmp_path)
    assert a == pytest.approx(d, rel=1e-12)
    own = [json.loads((out / f"rank{r}.json").read_text())["step_times_s"] for r in range(4)]
    last = statistics.median(s[-1] for s in own) * 1e3
    both = statistics.median(statistics.mean(s) for s in own) * 1e3
    # the job's own last step (per-rank median), not a mix with the start-up step
    assert a == pytest.approx(last, rel=0.05), (a, last, both)
