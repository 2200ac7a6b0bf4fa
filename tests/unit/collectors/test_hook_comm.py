"""The torch.distributed wrappers on a one-rank gloo group, in this process."""

from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from rankscope.collectors import hooks  # noqa: E402
from rankscope.collectors.hooks.hook_comm import HUB, HookedWork  # noqa: E402
from rankscope.collectors.store import Store  # noqa: E402


@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    if not dist.is_available():
        pytest.skip("torch.distributed not available")
    ours = not dist.is_initialized()
    if ours:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    if ours:
        dist.destroy_process_group()


@pytest.fixture
def hooked(pg, tmp_path):
    assert hooks.enable(store=str(tmp_path), job="unit", flush_interval_s=60, watchdog=False, signals=False)
    yield tmp_path
    hooks.disable()


def written(tmp_path):
    HUB.session.writer.flush()
    return Store(tmp_path).read("comm_op").sort("start_ns")


def test_collectives_become_rows_with_binding_names_and_sizes(hooked):
    t = torch.ones(8)  # 32 bytes
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.reduce(t, dst=0)
    dist.all_gather([torch.empty(8)], t)
    dist.all_gather_into_tensor(torch.empty(8), t)
    dist.reduce_scatter(torch.empty(8), [t])
    dist.reduce_scatter_tensor(torch.empty(8), t)
    dist.all_to_all_single(torch.empty(8), t)
    dist.all_to_all([torch.empty(8)], [t])
    dist.gather(t, [torch.empty(8)], dst=0)
    dist.scatter(torch.empty(8), [t], src=0)
    dist.barrier()
    ops = written(hooked)
    assert ops["op"].to_list() == ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather",
                                   "reduce_scatter", "reduce_scatter", "all_to_all", "all_to_all", "gather",
                                   "scatter", "barrier"]
    assert ops["size_bytes"].to_list() == [32] * 11 + [0]
    assert ops["seq"].to_list() == list(range(12))
    assert set(ops["dtype"].drop_nulls()) == {"float32"}
    assert ops.filter(ops["op"] == "all_gather")["out_size_bytes"].to_list() == [32, 32]
    assert ops["group_ranks"].to_list()[0] == [0] and ops["state"].unique().to_list() == ["completed"]


def test_object_collectives_are_one_row_each_not_their_inner_calls(hooked):
    out = [None]
    dist.all_gather_object(out, {"a": 1})
    dist.broadcast_object_list([1, 2], src=0)
    ops = written(hooked)
    assert ops["op"].to_list() == ["all_gather", "broadcast"]
    assert ops["size_bytes"].null_count() == 2 and out == [{"a": 1}]


def test_async_op_completes_at_wait(hooked):
    t = torch.ones(4)
    w = dist.all_reduce(t, async_op=True)
    assert isinstance(w, HookedWork) and len(HUB.session.pending) == 1
    w.wait()
    assert not HUB.session.pending
    ops = written(hooked)
    assert ops["op"].to_list() == ["all_reduce"] and (ops["end_ns"] >= ops["start_ns"]).all()
    assert w.is_completed()  # anything else is passed to the real Work


def test_job_errors_pass_through_and_are_recorded_failed(hooked):
    t = torch.ones(4)
    with pytest.raises((ValueError, RuntimeError)) as info:
        dist.broadcast(t, src=7)  # no such rank
    assert "rankscope" not in repr(info.value)
    ops = written(hooked)
    assert ops["state"].to_list() == ["failed"]


def test_our_bookkeeping_failing_never_stops_the_call(hooked, monkeypatch):
    def broken(group):
        raise KeyError("boom")
    monkeypatch.setattr(HUB.session, "group_info", broken)
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [1.0] * 4
    assert HUB.session.counts["internal errors"] == 1


def test_steps_from_optimizer_until_the_job_marks_its_own(hooked):
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(2):
        m(torch.ones(1, 2)).sum().backward()
        opt.step()
    dist.barrier()
    hooks.step()
    opt.step()  # no longer counted: the job marks steps itself
    hooks.batch_meta(seq_lens=[128, 64])
    s = HUB.session
    assert s.step_no == 3 and s.user_steps
    s.writer.flush()
    st = Store(hooked)
    assert st.read("step_mark")["step"].to_list() == [0, 1, 2]
    assert st.read("comm_op")["step"].to_list() == [2]
    assert st.read("batch_meta").sort("microbatch")["seq_len"].to_list() == [128, 64]


def test_p2pop_identity_checks_still_hold(hooked):
    op = dist.P2POp(dist.isend, torch.ones(2), 0)
    assert op.op is dist.distributed_c10d.isend


def test_disable_restores_torch_and_reports(pg, tmp_path):
    orig = dist.all_reduce
    hooks.enable(store=str(tmp_path), job="unit", watchdog=False, signals=False)
    assert getattr(dist.all_reduce, "_rankscope_hook", False)
    dist.all_reduce(torch.ones(1))
    rep = hooks.disable()
    assert dist.all_reduce is orig and dist.distributed_c10d.all_reduce is orig
    assert rep["written"] == {"comm_op": 1} and rep["lost_total"] == 0
    assert [m.format for m in Store(tmp_path).manifest()] == ["hook"]
