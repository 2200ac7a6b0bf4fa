"""rankscope analyze --engine ray on flow captures: job recognition split into Ray tasks (one per part file
of the capture, merged partial features, a second round for the rails' activity), then one task per
recognised job reading only its own records, gives the embedded engine's reports, whole.

Captures: a real gloo DP2 x PP2 x TP2 job under pmacct's 1-in-N sFlow (tests/data/netns_gloo), a
simulated shared fabric of two jobs with storage, checkpoint and rendezvous background, and a simulated
rail-optimised job whose two rails only their lockstep activity joins (the second round decides). Each
capture is written as several part files, so partials really are merged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from rankscope.collectors.schema import conform
from rankscope.collectors.store import Store
from rankscope.datasets.simulator import SimConfig, simulate, simulate_fabric

pytest.importorskip("ray")
BIN = Path(sys.executable).parent
DATA = Path(__file__).resolve().parents[1] / "data" / "netns_gloo"
pytestmark = pytest.mark.slow


def _write_parts(flow: pl.DataFrame, root: Path, parts: int) -> Path:
    """The capture ``fabric`` of a new store at ``root``, as ``parts`` part files (ingests of parts)."""
    store = Store(root)
    step = -(-flow.height // parts)
    for i in range(0, flow.height, step):
        store.write("flow", conform(flow.slice(i, step), "flow"), job="fabric")
    assert len(store.parts("flow", "fabric")) == parts
    return root


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict[str, tuple[Path, list[str]]]:
    base = tmp_path_factory.mktemp("split")
    real = pl.read_parquet(DATA / "dp2pp2tp2_sflow_pmacct.flows.parquet").with_columns(
        job=pl.lit("fabric"), source=pl.lit("sflow"))
    port = json.loads((DATA / "truth.json").read_text())["dp2pp2tp2_sflow_pmacct"]["master_port"]
    fab = simulate_fabric([SimConfig(job="a", dp=4, pp=2, gpus_per_host=1, steps=4, seed=1),
                           SimConfig(job="b", dp=2, pp=2, tp=2, gpus_per_host=2, steps=4, seed=2,
                                     rank_order="tp-cp-ep-pp-dp")], background=True)
    rails = simulate(SimConfig(job="r", dp=4, pp=2, tp=2, gpus_per_host=2, steps=4, seed=5,
                               rank_order="tp-cp-ep-pp-dp"))
    return {
        "real_sflow": (_write_parts(real, base / "real", 4), ["--control-port", str(port)]),
        "shared_fabric": (_write_parts(pl.from_arrow(fab.flow), base / "fabric", 5), []),
        "rails": (_write_parts(pl.from_arrow(rails.tables["flow"]), base / "rails", 3), []),
    }


def _analyze(store: Path, out: Path, *extra: str) -> dict[str, dict]:
    r = subprocess.run([str(BIN / "rankscope"), "analyze", "--store", str(store), "--out-dir", str(out),
                        "--no-html", *extra], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


@pytest.mark.parametrize("name", ["real_sflow", "shared_fabric", "rails"])
def test_split_capture_on_ray_gives_the_embedded_reports(captures, name, tmp_path):
    store, extra = captures[name]
    # a copy each: neither engine may answer from the other's result cache
    shutil.copytree(store, tmp_path / "a")
    shutil.copytree(store, tmp_path / "b")
    embedded = _analyze(tmp_path / "a", tmp_path / "embedded", *extra)
    # partitions of a few dozen records: pairs, bursts and rails straddle them (analyze --partition-rows)
    on_ray = _analyze(tmp_path / "b", tmp_path / "ray", "--engine", "ray", "--partition-rows", "50", *extra)
    assert sorted(embedded) == sorted(on_ray) and embedded
    for job, a in embedded.items():
        b = on_ray[job]
        for key in ("strategy", "stragglers", "data_quality", "steps", "findings"):
            assert a.get(key) == b.get(key), (job, key)
        assert a == b, job
