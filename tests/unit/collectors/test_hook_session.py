"""The session without torch: call bookkeeping, hang dumps, writer restarts, the CUDA path with fake events."""

from __future__ import annotations

import ctypes
import time

import pytest

from rankscope.collectors.hooks import hook_comm
from rankscope.collectors.hooks.hook_config import HookConfig
from rankscope.collectors.hooks.hook_session import HookSession
from rankscope.collectors.hooks.hook_watchdog import Watchdog
from rankscope.collectors.hooks.hook_writer import EventClock
from rankscope.collectors.store import Store


def session(tmp_path, **kw) -> HookSession:
    cfg = HookConfig(store=str(tmp_path), job="s", watchdog=False, auto_step=False, signals=False,
                     flush_interval_s=60, **kw)
    return HookSession(cfg, rank=1)


def call(s, op="all_reduce", gid="0", ranks=(0, 1), peer=None, p2p=False):
    return s.begin(op, gid, ranks, peer, 16, "float32", 4, None, p2p, False)


def test_sequence_numbers_per_group_and_per_p2p_direction(tmp_path):
    s = session(tmp_path)
    recs = [call(s), call(s, gid="1"), call(s), call(s, "send", peer=0, p2p=True),
            call(s, "recv", peer=0, p2p=True), call(s, "send", peer=0, p2p=True)]
    assert [r[10] for r in recs] == [0, 0, 1, 0, 0, 1]
    for r in recs:
        s.finish(r, "completed")
    assert not s.pending and len(s.buffer) == 6


def test_watchdog_dumps_pending_calls_once(tmp_path):
    s = session(tmp_path, hang_timeout_s=0.05)
    done = call(s)
    s.finish(done, "completed")
    stuck = [call(s, gid="1"), call(s, "recv", peer=0, p2p=True)]
    dog = Watchdog(s, 0.05)
    assert dog.check(time.time_ns()) == 0  # not overdue yet
    later = time.time_ns() + 10**9
    assert dog.check(later) == 2 and dog.check(later) == 0
    ops = Store(tmp_path).read("comm_op").sort("group_id")
    assert ops["state"].to_list() == ["completed", "pending", "pending"]
    assert ops["end_ns"].null_count() == 2
    s.finish(stuck[0], "completed")  # it completes after all: written as usual
    s.writer.flush()
    assert Store(tmp_path).read("comm_op").height == 4


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_killed_writer_is_restarted_and_counted(tmp_path):
    s = session(tmp_path)
    s.start()
    t = s.writer.thread
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident), ctypes.py_object(SystemExit))
    s.writer.wake()
    t.join(5)
    assert not t.is_alive()
    r = call(s)
    s.finish(r, "completed")
    s.mark_step()  # step boundaries check the writer
    assert s.writer.alive() and s.counts["writer restarts"] == 1
    rep = s.close()
    assert rep["writer_restarts"] == 1 and rep["written"]["comm_op"] == 1


def test_write_failure_disables_and_reports(tmp_path, caplog):
    root = tmp_path / "gone"
    root.write_text("x")
    s = HookSession(HookConfig(store=str(root), job="s", watchdog=False, signals=False), rank=0)
    s.finish(call(s), "completed")
    s.writer.flush()
    assert not s.active
    assert "NotADirectory" in s.disabled_reason or "FileExists" in s.disabled_reason
    rep = s.close()
    assert rep["lost"]["write failed"] == 1 and rep["lost_total"] == 1
    warnings = [r for r in caplog.records if "cannot write to the trace store" in r.getMessage()]
    assert len(warnings) == 1


class FakeEvent:
    def __init__(self, gpu_ms):
        self.gpu_ms = gpu_ms

    def query(self):
        return True

    def elapsed_time(self, other):
        return other.gpu_ms - self.gpu_ms


def test_cuda_calls_use_events_resolved_by_the_writer(tmp_path, monkeypatch):
    ticks = iter([3.0, 4.5])
    monkeypatch.setattr(hook_comm, "cuda_event", lambda: FakeEvent(next(ticks)))
    cfg = HookConfig(store=str(tmp_path), job="s", watchdog=False, signals=False)
    s = HookSession(cfg, rank=0, writer_clock=EventClock(lambda: (FakeEvent(1.0), 10**15)))
    r = s.begin("all_reduce", "0", (0,), None, 4, "bfloat16", 2, None, False, True)
    assert isinstance(r[7], FakeEvent) and isinstance(r[15], int)  # launch time on the CPU clock
    s.finish(r, "completed")
    s.writer.flush()
    ops = Store(tmp_path).read("comm_op")
    assert ops["start_ns"].to_list() == [10**15 + 2_000_000]
    assert ops["end_ns"].to_list() == [10**15 + 3_500_000]


def test_forked_child_stays_silent(tmp_path):
    s = session(tmp_path)
    s.after_fork_in_child()
    s.finish(call(s), "completed")
    assert s.close()["written"] == {} and not Store(tmp_path).manifest()


@pytest.mark.parametrize("name,cat", [("ampere_sgemm_128x64_nn", "gemm"), ("flash_fwd_kernel", "attention"),
                                      ("vectorized_elementwise_kernel", "elementwise"), ("foo", "other")])
def test_kernel_categories(name, cat):
    from rankscope.collectors.hooks.hook_cupti import kernel_category

    assert kernel_category(name) == cat
