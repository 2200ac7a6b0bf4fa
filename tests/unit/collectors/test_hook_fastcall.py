"""The hook's C hot path (collectors/hooks/hook_fastcall.c) against its Python reference, row for row."""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from rankscope.collectors import hooks  # noqa: E402
from rankscope.collectors.hooks import hook_comm  # noqa: E402
from rankscope.collectors.hooks.hook_comm import HUB  # noqa: E402
from tests.unit.collectors.test_hook_comm import pg  # noqa: E402,F401 - the one-rank gloo group fixture

reason = hook_comm.fast_path_available()
pytestmark = [pytest.mark.skipif(reason is not None, reason=f"C hot path off: {reason}"),
              pytest.mark.usefixtures("pg")]


def calls():
    """A mix of fast-path calls, slow-path calls and calls that switch between them on one group."""
    t32, t64 = torch.ones(8), torch.ones(3, dtype=torch.int64)
    sub = dist.new_group([0])
    dist.all_reduce(t32)
    dist.all_reduce(t64)  # second dtype
    dist.all_reduce(t32, group=sub)  # second group
    dist.broadcast(t32, src=0)
    dist.reduce(t32, 0)
    dist.all_gather_into_tensor(torch.empty(8), t32)  # one tensor out
    dist.reduce_scatter_tensor(torch.empty(8), t32)
    dist.all_to_all_single(torch.empty(8), t32)
    dist.all_reduce(t32, async_op=True).wait()  # async: the Python path, same counter
    dist.all_gather([torch.empty(8)], t32)  # tensor list out: the Python path
    dist.all_reduce(tensor=t32, group=None, async_op=False)  # by keyword
    dist.barrier()  # no tensor: the Python path
    dist.destroy_process_group(sub)
    hooks.step()
    dist.all_reduce(t32)


def recorded(tmp_path, monkeypatch, pure: bool):
    monkeypatch.setenv("RANKSCOPE_HOOK_PURE_PYTHON", "1" if pure else "0")
    assert hooks.enable(store=str(tmp_path), job="unit", flush_interval_s=60, watchdog=False, signals=False)
    try:
        fast = isinstance(dist.all_reduce, _fastcall().FastHook)
        calls()
        rows = HUB.session.buffer.take()
    finally:
        hooks.disable()
    return fast, [r for r in rows if r[0] == "c"]


def _fastcall():
    from rankscope.collectors.hooks import hook_fastcall

    return hook_fastcall


def test_c_path_rows_equal_the_python_paths(tmp_path, monkeypatch):
    fast, c_rows = recorded(tmp_path / "c", monkeypatch, pure=False)
    slow, py_rows = recorded(tmp_path / "py", monkeypatch, pure=True)
    assert fast and not slow

    def keys(rows):  # times differ, and torch numbers new groups per process; nothing else may
        order = {}
        return Counter((r[0], r[1], order.setdefault(r[2], len(order)), *r[3:7], *r[9:])
                       for r in sorted(rows, key=lambda r: r[7]))

    assert keys(c_rows) == keys(py_rows)
    assert len(c_rows) == 13
    assert all(r[7] <= r[8] for r in c_rows)
    seqs = sorted(r[10] for r in c_rows if r[2] == c_rows[0][2])  # the default group
    assert seqs == list(range(len(seqs)))  # both paths drew from one counter: no gap, no repeat
    assert {r[11] for r in c_rows} == {0, 1}  # the step mark reached the ring


def test_a_running_call_is_pending_for_the_watchdog_and_blocks_later_rows(tmp_path):
    assert hooks.enable(store=str(tmp_path), job="unit", flush_interval_s=60, watchdog=False, signals=False)
    try:
        s = HUB.session
        t = torch.ones(2)
        dist.all_reduce(t)  # caches the group and dtype
        seen = {}

        def stuck(tensor, op=None, group=None, async_op=False):
            seen["pending"] = s.pending_rows()
            seen["taken"] = s.buffer.take()  # the writer draining while the call runs

        hook = hook_comm.make_hook(stuck, hook_comm.SPECS["all_reduce"], HUB, nests=False, fast=True)
        hook(t)
        (row,) = seen["pending"]
        assert row[1] == "all_reduce" and row[9] == "pending" and row[8] is None and row[10] == 1
        assert [r[10] for r in seen["taken"]] == [0]  # the finished one; the running one waits
        (done,) = s.buffer.take()
        assert done[9] == "completed" and done[10] == 1
    finally:
        hooks.disable()


def test_job_exception_passes_through_and_is_recorded_failed(tmp_path):
    assert hooks.enable(store=str(tmp_path), job="unit", flush_interval_s=60, watchdog=False, signals=False)
    try:
        t = torch.ones(2)
        dist.all_reduce(t)

        def boom(tensor, op=None, group=None, async_op=False):
            raise RuntimeError("the job's own error")

        hook = hook_comm.make_hook(boom, hook_comm.SPECS["all_reduce"], HUB, nests=False, fast=True)
        with pytest.raises(RuntimeError, match="the job's own error"):
            hook(t)
        rows = HUB.session.buffer.take()
        assert [r[9] for r in rows] == ["completed", "failed"]
    finally:
        hooks.disable()


def test_ring_grows_to_its_cap_then_drops_the_oldest_and_counts_them(tmp_path):
    ring = _fastcall().Ring(8, initial_rows=2)
    assert ring.capacity == 2
    assert hooks.enable(store=str(tmp_path), job="unit", flush_interval_s=60, watchdog=False, signals=False)
    try:
        t = torch.ones(1)
        dist.all_reduce(t)  # a group's first call goes through Python, which caches it
        hook_comm.use_ring(ring)
        for _ in range(8):
            dist.all_reduce(t)
        assert ring.capacity == 8 and ring.appended == 8 and ring.dropped == 0 and len(ring) == 8
        for _ in range(3):
            dist.all_reduce(t)
        assert ring.appended == 11 and ring.dropped == 3
        assert [row[10] for row in ring.take()] == list(range(4, 12))
    finally:
        hook_comm.use_ring(None)
        hooks.disable()


def test_a_new_session_or_forgotten_groups_never_reuse_stale_caches(tmp_path):
    t = torch.ones(1)
    for k in range(2):  # a second session: new ring, new counters
        assert hooks.enable(store=str(tmp_path / str(k)), job="unit", flush_interval_s=60, watchdog=False,
                            signals=False)
        try:
            dist.all_reduce(t)
            g = dist.new_group([0])
            dist.all_reduce(t, group=g)
            dist.destroy_process_group(g)  # forgets the groups
            g2 = dist.new_group([0])
            dist.all_reduce(t, group=g2)
            rows = HUB.session.buffer.take()
        finally:
            hooks.disable()
        gids = [r[2] for r in rows]
        assert [r[10] for r in rows] == [0, 0, 0]
        assert gids[1] != gids[2] and len(set(gids)) == 3


def test_cuda_tensors_take_the_python_path_and_its_cuda_events(tmp_path):
    from rankscope.collectors.hooks.hook_fastcall import FastHook

    class OnGpu:  # what the C path reads of a tensor, on a GPU
        dtype, is_cuda = torch.float32, True

        def numel(self):
            return 1

    assert hooks.enable(store=str(tmp_path), job="unit", flush_interval_s=60, watchdog=False, signals=False)
    try:
        ring = HUB.session.ring
        dist.all_reduce(torch.ones(1))  # caches the group and dtype
        slow_calls = []
        hook = FastHook(orig=lambda *a, **k: None, slow=lambda *a, **k: slow_calls.append(a), hub=HUB,
                        busy=hook_comm._busy, op="all_reduce", group=(2, "group"), tensor=(0, "tensor"),
                        async_arg=(3, "async_op"), peer=(None, None), out=(None, None), p2p=False, nests=False)
        ring.cuda = 1  # as on a machine with CUDA
        before = ring.appended
        gpu = OnGpu()
        hook(gpu)
        assert slow_calls == [(gpu,)] and ring.appended == before
        hook(torch.ones(1))  # a CPU tensor on that machine: still the C path
        assert len(slow_calls) == 1 and ring.appended == before + 1
    finally:
        hooks.disable()


def test_threads_calling_at_once_lose_nothing_and_share_the_counter(tmp_path):
    import threading
    import time

    assert hooks.enable(store=str(tmp_path), job="unit", flush_interval_s=60, watchdog=False, signals=False)
    try:
        s = HUB.session
        t = torch.ones(1)
        dist.all_reduce(t)  # caches the group and dtype
        ring = _fastcall().Ring(1 << 12, initial_rows=1)  # grows while the threads run
        hook_comm.use_ring(ring)

        def stand_in(tensor, op=None, group=None, async_op=False):
            time.sleep(0)  # lets the GIL go, as a real collective does

        hook = hook_comm.make_hook(stand_in, hook_comm.SPECS["all_reduce"], HUB, nests=False, fast=True)
        taken = []

        def caller():
            for _ in range(500):
                hook(t)

        def drainer():  # the writer thread, taking rows while calls run
            while any(th.is_alive() for th in callers):
                taken.extend(ring.take())

        callers = [threading.Thread(target=caller) for _ in range(3)]
        for th in callers:
            th.start()
        d = threading.Thread(target=drainer)
        d.start()
        for th in callers:
            th.join()
        d.join()
        taken.extend(ring.take())
        assert ring.appended == 1500 and ring.dropped == 0 and len(taken) == 1500
        assert sorted(r[10] for r in taken) == list(range(1, 1501))
        assert all(r[9] == "completed" and r[7] <= r[8] for r in taken)
        assert not s.pending_rows()
    finally:
        hook_comm.use_ring(None)
        hooks.disable()
