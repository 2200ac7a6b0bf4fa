"""rankscope analyze --engine ray: a real local Ray cluster on 127.0.0.1 analyses a store of several jobs
and gives the same strategy, steps and verdict as the embedded engine, key by key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.datasets.simulator import Fault, SimConfig, simulate, write_store

pytest.importorskip("ray")
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ray") / "st"
    kw = dict(steps=4, microbatches=4, layers=8, flows=False, gemm_records=False)
    write_store(simulate(SimConfig(job="slow", dp=4, pp=2, seed=3,
                                   faults=(Fault("slow-worker", {"rank": 5, "factor": 1.5}),), **kw)), out)
    write_store(simulate(SimConfig(job="clean", dp=2, pp=4, seed=4, **kw)), out)
    return out


def _analyze(store: Path, out: Path, *extra: str) -> dict[str, dict]:
    r = subprocess.run([str(BIN / "rankscope"), "analyze", "--store", str(store), "--out-dir", str(out),
                        "--no-html", *extra], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def test_ray_engine_gives_the_embedded_reports(store, tmp_path):
    embedded = _analyze(store, tmp_path / "embedded")
    on_ray = _analyze(store, tmp_path / "ray", "--engine", "ray")
    assert sorted(embedded) == sorted(on_ray) == ["clean", "slow"]
    for job, a in embedded.items():
        b = on_ray[job]
        for key in ("world_size", "dp", "pp", "tp", "dp_groups", "pp_groups", "confidence"):
            assert a["strategy"][key] == b["strategy"][key], (job, key)
        for key in ("count", "median_ns", "boundaries_ns"):
            assert a["steps"].get(key) == b["steps"].get(key), (job, key)
        for key in ("verdict", "slowdown", "by_cause"):
            assert a["stragglers"][key] == b["stragglers"][key], (job, key)
    assert embedded["slow"]["stragglers"]["verdict"] == "worker"


def test_address_without_ray_engine_is_a_usage_error(store, tmp_path):
    r = subprocess.run([str(BIN / "rankscope"), "analyze", "--store", str(store), "--out-dir", str(tmp_path),
                        "--address", "127.0.0.1:1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2


def test_partition_rows_without_ray_engine_is_a_usage_error(store, tmp_path):
    r = subprocess.run([str(BIN / "rankscope"), "analyze", "--store", str(store), "--out-dir", str(tmp_path),
                        "--partition-rows", "1000"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--partition-rows" in r.stderr
