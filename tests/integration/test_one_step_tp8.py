"""A real TP8 one-step Kineto set (tests/data/gloo_tp8_one_step): all-reduces inside forward and backward.

The only collective family runs inside every forward and backward pass: tensor parallel, not data
parallel. One step of one microbatch is one sample: the straggler section says so instead of an S.
"""

from __future__ import annotations

import json
from pathlib import Path

from rankscope.cli.main import main

DATA = Path(__file__).resolve().parents[1] / "data" / "gloo_tp8_one_step" / "kineto"


def test_tp8_one_step_is_tensor_parallel_and_gives_no_slowdown(tmp_path, monkeypatch):
    monkeypatch.setenv("RANKSCOPE_NO_CACHE", "1")
    assert main(["analyze", "--ingest", str(DATA), "--job", "tp8", "--store", str(tmp_path / "st"),
                 "--out-dir", str(tmp_path / "out"), "--no-html"]) == 0
    report = json.loads((tmp_path / "out" / "tp8.json").read_text())
    st = report["strategy"]
    assert st["tp"] in (8, None) and st["dp"] != 8
    assert st["tp"] == 8 and st["dp"] == 1 and st["tp_groups"] == [list(range(8))]
    s = report["stragglers"]
    assert s["evaluated"] is False and "one step of one microbatch" in s["why"]
    assert s["verdict"] == "none" and not s.get("top_workers")
    assert not [f for f in report["findings"] if f["kind"] in ("slow_worker", "slow_stage", "slow_link")]
