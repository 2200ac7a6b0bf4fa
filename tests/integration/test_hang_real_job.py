"""A real gloo job (DP2 x PP2) where rank 1 skips its DP all_reduce: the hang section names the
missing rank, its DP group and the sequence number, from the hook's watchdog dump and from the
flight recorder dump, checked against the calls the job itself says it issued."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.analysis.hangs import stuck_collectives
from rankscope.collectors.job_frames import load_job
from rankscope.collectors.store import Store

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
JOB = REPO / "tests" / "jobs" / "train_dp_pp.py"
SKIP_RANK, SKIP_STEP = 1, 1

pytestmark = [pytest.mark.torchjob, pytest.mark.slow]



@pytest.fixture(scope="module")
def hung_job(tmp_path_factory):
    pytest.importorskip("torch")
    if not (BIN / "torchrun").exists() or not JOB.exists():
        pytest.skip("torchrun or tests/jobs/train_dp_pp.py missing")
    base = tmp_path_factory.mktemp("hang")
    cmd = [str(BIN / "rankscope"), "attach", "--store", str(base / "st"), "--job", "hang", "--hang-timeout-s", "1",
           "--flush-interval-s", "0.5", "--", str(BIN / "torchrun"), "--nproc_per_node=4",
           "--standalone", str(JOB), "--steps", "2", "--skip-collective", f"{SKIP_RANK}:{SKIP_STEP}",
           "--pg-timeout-s", "5", "--out", str(base / "out"), "--fr-dump", str(base / "fr")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    results = {int(p.stem[4:]): json.loads(p.read_text()) for p in (base / "out").glob("rank*.json")}
    assert results.get(SKIP_RANK, {}).get("skipped"), r.stderr[-2000:]
    if (base / "fr").is_dir():
        ing = subprocess.run([str(BIN / "rankscope"), "ingest", str(base / "fr"), "--store", str(base / "st"),
                              "--job", "hang"], capture_output=True, text=True, timeout=120)
        assert ing.returncode == 0, ing.stderr[-2000:]
    return load_job(Store(base / "st"), "hang"), results


def _issued_all_reduces(result: dict) -> tuple[list[int], int]:
    calls = [c for c in result["issued"] if c["op"] == "all_reduce"]
    return sorted(calls[0]["group_ranks"]), len(calls)


def test_hook_watchdog_names_missing_rank_group_and_seq(hung_job):
    frames, results = hung_job
    group, n_done = _issued_all_reduces(results[SKIP_RANK])
    hangs = [h for h in stuck_collectives(frames) if h.source == "hook"]
    assert hangs, "the hook's watchdog dump shows no stuck op"
    first = hangs[0]
    assert first.first and first.op == "all_reduce"
    assert first.group_ranks == group and first.missing == [SKIP_RANK]
    # The hook numbers each group's calls from 0: the stuck one is the first the skipper never issued.
    assert first.seq == n_done
    peer = [r for r in group if r != SKIP_RANK]
    assert first.pending_ranks == peer
    assert first.last_seq[str(SKIP_RANK)] == n_done - 1


def test_flight_recorder_dump_names_the_same_collective(hung_job):
    frames, results = hung_job
    if "flight_recorder" not in frames.sources:
        pytest.skip("this torch wrote no flight recorder dump")
    group, n_done = _issued_all_reduces(results[SKIP_RANK])
    fr = [h for h in stuck_collectives(frames) if h.source == "flight_recorder"]
    assert fr, "the flight recorder dump shows no stuck collective"
    assert fr[0].first and fr[0].missing == [SKIP_RANK] and fr[0].group_ranks == group
    # collective_seq_id counts from 1.
    assert fr[0].seq == n_done + 1
