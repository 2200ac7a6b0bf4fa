"""`rankscope attach` over a real torchrun job (DP2 x PP2, 1F1B, gloo): what the hook recorded
equals, op by op, what the job says it issued, and the job's losses are bit-identical."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

pytestmark = pytest.mark.torchjob

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "jobs" / "train_dp_pp.py"
BIN = Path(sys.executable).parent
STEPS = 3



def torchrun(nproc: int, out: Path, *job_args: str) -> list[str]:
    return [str(BIN / "torchrun"), f"--nproc_per_node={nproc}", "--standalone",
            str(JOB), "--out", str(out), *job_args]


def run(cmd: list[str], timeout_s: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=REPO)


def results(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    if not JOB.is_file():
        pytest.skip(f"{JOB} not found")
    base = tmp_path_factory.mktemp("attach")
    plain = run(torchrun(4, base / "plain", "--steps", str(STEPS)))
    assert plain.returncode == 0, plain.stderr[-3000:]
    store = base / "store"
    hooked = run([str(BIN / "rankscope"), "attach", "--store", str(store), "--job", "real",
                  "--flush-interval-s", "0.5", "--", *torchrun(4, base / "hooked", "--steps", str(STEPS))])
    assert hooked.returncode == 0, hooked.stderr[-3000:]
    return {"plain": results(base / "plain", 4), "hooked": results(base / "hooked", 4),
            "store": store, "stderr": hooked.stderr}


def test_losses_bit_identical_with_and_without_hook(jobs):
    for plain, hooked in zip(jobs["plain"], jobs["hooked"]):
        assert hooked["losses"] == plain["losses"]
        assert hooked["final_loss"] == plain["final_loss"]
    assert any(r["final_loss"] for r in jobs["hooked"])  # the last stage reported a loss


def test_recorded_ops_equal_issued_ops_in_order(jobs):
    from rankscope.collectors.store import Store

    ops = Store(jobs["store"]).read("comm_op", job="real").sort("rank", "start_ns")
    assert set(ops["source"]) == {"hook"} and set(ops["state"]) == {"completed"}
    assert (ops["end_ns"] >= ops["start_ns"]).all()
    for res in jobs["hooked"]:
        mine = ops.filter(ops["rank"] == res["rank"]).to_dicts()
        issued = res["issued"]
        assert len(mine) == len(issued), (res["rank"], len(mine), len(issued))
        for i, (got, want) in enumerate(zip(mine, issued)):
            where = (res["rank"], i, got, want)
            assert got["op"] == want["op"], where
            assert got["group_ranks"] == want["group_ranks"], where
            assert got["peer"] == want["peer"], where
            assert got["size_bytes"] == want["size_bytes"], where
            assert got["dtype"] == want["dtype"], where
            # The job files its closing barrier under its last loop step; the hook counts steps by
            # optimizer.step, so a call after the last step belongs to the next one.
            want_step = want["step"] + 1 if i == len(issued) - 1 and want["op"] == "barrier" else want["step"]
            assert got["step"] == want_step, where
            assert got["pid"] > 0 and got["host"]


def test_sequence_numbers_match_across_ranks(jobs):
    import polars as pl

    from rankscope.collectors.store import Store

    ops = Store(jobs["store"]).read("comm_op", job="real")
    ar = ops.filter(pl.col("op") == "all_reduce")
    # Every member of a DP group sees the same calls with the same numbers and sizes.
    by_group = ar.group_by("group_id", "seq").agg(n=pl.col("rank").n_unique(),
                                                    sizes=pl.col("size_bytes").n_unique())
    assert (by_group["n"] == 2).all() and (by_group["sizes"] == 1).all()
    # A send's (seq) pairs with the receiver's recv of the same seq from that sender, same bytes.
    sends = ops.filter(ops["op"] == "send").select("rank", "peer", "seq", "size_bytes")
    recvs = ops.filter(ops["op"] == "recv").select(src="peer", dst="rank", seq="seq", rbytes="size_bytes")
    pairs = sends.join(recvs, left_on=["rank", "peer", "seq"], right_on=["src", "dst", "seq"], how="left")
    assert pairs.height == sends.height > 0
    assert (pairs["rbytes"] == pairs["size_bytes"]).all()


def test_steps_marked_from_optimizer_and_nothing_lost(jobs):
    from rankscope.collectors.store import Store

    st = Store(jobs["store"])
    marks = st.read("step_mark", job="real").sort("rank", "step")
    for r in range(4):
        mine = marks.filter(marks["rank"] == r)
        assert mine["step"].to_list() == list(range(STEPS))
        assert (mine["end_ns"] >= mine["start_ns"]).all()
        assert (mine["start_ns"][1:] == mine["end_ns"][:-1]).all()
    reports = [m for m in st.manifest() if m.format == "hook"]
    assert sorted(m.notes["rank"] for m in reports) == [0, 1, 2, 3]
    for m in reports:
        assert m.rejects == {}, m.rejects
        assert m.records["comm_op"] == len(jobs["hooked"][m.notes["rank"]]["issued"])
    assert "4 rank(s) wrote" in jobs["stderr"]
