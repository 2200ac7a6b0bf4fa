"""The real gloo DP x PP job under torch.profiler and the flight recorder, imported with `rankscope ingest`.

One 4-rank run (DP2 x PP2, 3 steps) writes Kineto traces and flight recorder
dumps; what the importers store is checked against the calls the job itself
logged (``issued``) and against the model's own shapes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from rankscope.collectors.importers.contract import ImportOptions
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.ingest.registry import detect
from rankscope.collectors.store import Store

pytestmark = pytest.mark.torchjob
REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "jobs" / "train_dp_pp.py"
STEPS, MICRO, MBS, HIDDEN = 3, 4, 8, 64



def run_job(out: Path, *extra: str, timeout: int = 240) -> subprocess.CompletedProcess:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun not installed")
    cmd = [str(torchrun), "--nproc_per_node=4", "--standalone", str(JOB),
           "--steps", str(STEPS), "--microbatches", str(MICRO), "--microbatch-size", str(MBS),
           "--hidden", str(HIDDEN), "--out", str(out / "out"), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("gloo_job")
    r = run_job(d, "--profile", str(d / "prof"), "--fr-dump", str(d / "fr"))
    assert r.returncode == 0, r.stderr[-3000:]
    issued = {int(p.stem[4:]): json.loads(p.read_text()) for p in (d / "out").glob("rank*.json")}
    st = Store(d / "store")
    summaries = {
        "k": ingest(st, [d / "prof"], opts=ImportOptions(job="k")),
        "frp": ingest(st, sorted((d / "fr").glob("*.pkl")), opts=ImportOptions(job="frp")),
        "frj": ingest(st, sorted((d / "fr").glob("*.fr.json")), opts=ImportOptions(job="frj")),
    }
    return d, issued, st, summaries


def test_every_file_detected_and_ingested(job):
    d, _, _, summaries = job
    assert {detect(p) for p in (d / "prof").iterdir()} == {"kineto"}
    assert {detect(p) for p in (d / "fr").iterdir()} == {"flight_recorder"}
    for s in summaries.values():
        assert [f.status for f in s.files] == ["ingested"] * 4, [f.error for f in s.files]
        assert not s.rejects


def test_kineto_comm_ops_equal_what_the_job_issued(job):
    _, issued, st, _ = job
    comm = st.read("comm_op", "k")
    for rank, res in issued.items():
        # the final barrier runs after the profiler window closed
        want = Counter((c["op"], c["peer"], c["size_bytes"], c["dtype"], c["step"])
                       for c in res["issued"] if c["op"] != "barrier")
        mine = comm.filter(comm["rank"] == rank)
        got = Counter(zip(mine["op"], mine["peer"], mine["size_bytes"], mine["dtype"], mine["step"], strict=True))
        assert got == want, rank
        assert set(mine["host"]) == {socket.gethostname()} and mine["pid"].n_unique() == 1
        assert (mine["launch_ns"] <= mine["start_ns"]).all()


def test_kineto_sequence_numbers_follow_call_order(job):
    _, _, st, _ = job
    comm = st.read("comm_op", "k").sort("start_ns")
    for rank in range(4):
        ar = comm.filter((comm["rank"] == rank) & (comm["op"] == "all_reduce"))
        assert ar["seq"].to_list() == list(range(1, 2 * STEPS + 1))


def test_kineto_compute_spans_and_gemm_shapes(job):
    _, issued, st, _ = job
    comp = st.read("compute_op", "k")
    steps = st.read("step_mark", "k")
    assert Counter(steps["rank"]) == dict.fromkeys(range(4), STEPS)
    for rank, res in issued.items():
        mine = comp.filter(comp["rank"] == rank)
        per_step = Counter(zip(mine["category"], mine["step"], strict=True))
        for s in range(STEPS):
            assert per_step[("forward", s)] == MICRO and per_step[("backward", s)] == MICRO
            assert per_step[("optimizer", s)] == 1
        fwd = mine.filter((mine["category"] == "gemm") & (mine["name"] == "aten::addmm"))
        # stage blocks are Linear(h, 2h) -> Linear(2h, h); the last stage adds Linear(h, h)
        shapes = {(m, n, k) for m, n, k in zip(fwd["m"], fwd["n"], fwd["k"], strict=True)}
        want = {(MBS, 2 * HIDDEN, HIDDEN), (MBS, HIDDEN, 2 * HIDDEN)}
        if res["stage"] == res["pp"] - 1:
            want.add((MBS, HIDDEN, HIDDEN))
        assert shapes == want, rank
        assert set(fwd["dtype"]) == {"float32"}


def test_flight_recorder_pickle_and_json_agree_with_the_job(job):
    _, issued, st, _ = job
    p = st.read("comm_op", "frp").sort("rank", "start_ns")
    j = st.read("comm_op", "frj").sort("rank", "start_ns")
    # state is left out: the two dumps are snapshots a moment apart, and gloo marks the final
    # barrier completed asynchronously, so one dump may still see it pending.
    cols = ["rank", "op", "group_id", "seq", "size_bytes", "dtype", "start_ns"]
    assert p.select(cols).equals(j.select(cols))
    for rank, res in issued.items():
        mine = p.filter(p["rank"] == rank)
        # torch 2.13's gloo recorder keeps collectives only (no send/recv)
        want = [(c["op"], c["size_bytes"]) for c in res["issued"] if c["op"] in ("all_reduce", "barrier")]
        assert list(zip(mine["op"], mine["size_bytes"], strict=True)) == \
            [(o, s if o != "barrier" else 0) for o, s in want]
        ar = mine.filter(mine["op"] == "all_reduce")
        assert ar["seq"].to_list() == list(range(1, 2 * STEPS + 1))
        assert set(ar["state"]) == {"completed"}

