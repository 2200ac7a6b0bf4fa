"""The real gloo DP2 x PP2 x TP2 Kineto traces (tests/data/gloo_dp2pp2tp2), with and without the
``distributedInfo.pg_config`` that declares the process groups: TP and DP groups exact or undecided,
never swapped (the DP groups were once reported as tp_groups)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rankscope.cli.main import main

DATA = Path(__file__).resolve().parents[1] / "data" / "gloo_dp2pp2tp2" / "kineto"
TP = [[0, 1], [2, 3], [4, 5], [6, 7]]  # Megatron order: tp fastest, then dp
DP = [[0, 2], [1, 3], [4, 6], [5, 7]]


def _report(tmp_path, inputs) -> dict:
    assert main(["analyze", "--ingest", str(inputs), "--job", "g", "--store", str(tmp_path / "st"),
                 "--out-dir", str(tmp_path / "out"), "--no-html"]) == 0
    return json.loads((tmp_path / "out" / "g.json").read_text())["strategy"]


@pytest.mark.parametrize("pg_config", [True, False], ids=["with-pg_config", "without-pg_config"])
def test_tp_and_dp_groups_exact_or_undecided_never_swapped(tmp_path, monkeypatch, pg_config):
    monkeypatch.setenv("RANKSCOPE_NO_CACHE", "1")
    inputs = DATA
    if not pg_config:
        inputs = tmp_path / "traces"
        inputs.mkdir()
        for p in sorted(DATA.glob("rank*.json.gz")):
            trace = json.loads(gzip.decompress(p.read_bytes()))
            trace["distributedInfo"].pop("pg_config", None)
            (inputs / p.name).write_bytes(gzip.compress(json.dumps(trace).encode()))
    st = _report(tmp_path, inputs)
    assert st["pp"] == 2
    assert st["tp"] in (2, None) and st["dp"] in (2, None)
    assert st["tp_groups"] in (TP, None)
    assert sorted(st["dp_groups"]) == DP or (st["dp"] is None and not st["dp_groups"])
    assert st["tp"] == 2  # where the all-reduces sit (inside every forward and backward) says TP
    if st["dp"] is None:
        assert any(u["field"] == "dp" for u in st["undecided"])
