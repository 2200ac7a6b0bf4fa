"""The bounded buffer and the background writer: drops, writes, failures, CUDA event resolution."""

from __future__ import annotations

import threading

import pytest

from rankscope.collectors.hooks.hook_writer import EventClock, HookWriter, RowBuffer
from rankscope.collectors.store import Store

IDENT = {"job": "w", "rank": 3, "host": "h", "pid": 42}


def comm_row(i, start=None, end=None, op="all_reduce"):
    start = 1_000 + i * 10 if start is None else start
    end = start + 5 if end is None else end
    return ["c", op, "0", (0, 3), None, 64, "float32", start, end, "completed", i, 0, 16, None, None, None]


def test_buffer_drops_oldest_and_counts():
    b = RowBuffer(4)
    for i in range(10):
        b.append(("s", i, i, i + 1))
    assert [r[1] for r in b.take()] == [6, 7, 8, 9]
    assert (b.appended, b.dropped, len(b)) == (10, 6, 0)
    b.append(("s", 10, 0, 1))
    assert b.dropped == 6 and [r[1] for r in b.take(5)] == [10]


def test_buffer_counts_appends_from_many_threads():
    b = RowBuffer(100)
    def push():
        for i in range(2000):
            b.append(("s", i, 0, 1))
    ts = [threading.Thread(target=push) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert b.appended == 8000 and b.dropped == 8000 - 100


def test_flush_writes_each_kind_with_identity_columns(tmp_path):
    b = RowBuffer(100)
    for i in range(3):
        b.append(comm_row(i))
    b.append(("s", 0, 1_000, 2_000))
    b.append(("b", 0, 1, 512))
    w = HookWriter(b, str(tmp_path), IDENT, 60, on_failure=lambda r: None)
    assert w.flush()
    st = Store(tmp_path)
    ops = st.read("comm_op")
    assert ops["seq"].to_list() == [0, 1, 2]
    assert set(ops["rank"]) == {3} and set(ops["job"]) == {"w"} and set(ops["source"]) == {"hook"}
    assert ops["group_ranks"].to_list()[0] == [0, 3]
    assert st.read("step_mark")["end_ns"].to_list() == [2_000]
    assert st.read("batch_meta")["seq_len"].to_list() == [512]
    assert dict(w.written) == {"comm_op": 3, "step_mark": 1, "batch_meta": 1}


def test_bad_rows_are_counted_not_written(tmp_path):
    b = RowBuffer(10)
    b.append(comm_row(0))
    b.append(comm_row(1, start=100, end=50))  # ends before it starts
    w = HookWriter(b, str(tmp_path), IDENT, 60, on_failure=lambda r: None)
    w.flush()
    assert w.written["comm_op"] == 1 and w.rejects == {"end_ns < start_ns": 1}


def test_store_replaced_by_a_file_fails_once_and_counts_the_loss(tmp_path):
    root = tmp_path / "st"
    root.write_text("not a directory")
    failures = []
    b = RowBuffer(10)
    b.append(comm_row(0))
    b.append(comm_row(1))
    w = HookWriter(b, str(root), IDENT, 60, on_failure=failures.append)
    assert not w.flush()
    b.append(comm_row(2))
    assert not w.flush()
    assert len(failures) == 1 and "Error" in failures[0]
    assert w.lost_on_failure == 3 and not w.written


class FakeEvent:
    def __init__(self, gpu_ms, done=True):
        self.gpu_ms, self.done = gpu_ms, done

    def query(self):
        return self.done

    def elapsed_time(self, other):
        return other.gpu_ms - self.gpu_ms


def test_cuda_events_resolve_against_the_anchor_and_wait_for_the_gpu(tmp_path):
    anchor = (FakeEvent(10.0), 5_000_000_000)
    clock = EventClock(anchor_factory=lambda: anchor)
    b = RowBuffer(10)
    late_end = FakeEvent(12.5, done=False)
    b.append(comm_row(0, start=FakeEvent(11.0), end=FakeEvent(11.25)))
    b.append(comm_row(1, start=FakeEvent(12.0), end=late_end))
    w = HookWriter(b, str(tmp_path), IDENT, 60, on_failure=lambda r: None, clock=clock, gpu_wait_s=0.05)
    w.flush()
    ops = Store(tmp_path).read("comm_op")
    assert ops["start_ns"].to_list() == [5_001_000_000] and ops["end_ns"].to_list() == [5_001_250_000]
    late_end.done = True  # the GPU got there: the next flush writes the held row
    w.flush()
    ops = Store(tmp_path).read("comm_op").sort("seq")
    assert ops["end_ns"].to_list() == [5_001_250_000, 5_002_500_000]


def test_events_never_completed_are_counted_at_exit(tmp_path):
    b = RowBuffer(10)
    b.append(comm_row(0, start=FakeEvent(1.0, done=False), end=FakeEvent(2.0, done=False)))
    w = HookWriter(b, str(tmp_path), IDENT, 60, on_failure=lambda r: None,
                   clock=EventClock(lambda: (FakeEvent(0.0), 0)), gpu_wait_s=0.02)
    w.flush(final=True)
    assert w.rejects["cuda event unresolved at exit"] == 1 and not w.written


def test_thread_flushes_on_interval_and_stop_flushes_the_rest(tmp_path):
    b = RowBuffer(100)
    w = HookWriter(b, str(tmp_path), IDENT, 0.05, on_failure=lambda r: None)
    w.start()
    b.append(comm_row(0))
    for _ in range(200):
        if w.written["comm_op"]:
            break
        threading.Event().wait(0.02)
    assert w.written["comm_op"] == 1
    b.append(comm_row(1))
    w.stop()
    assert not w.alive() and w.written["comm_op"] == 2


@pytest.mark.parametrize("n", [0, 1])
def test_empty_or_single_flush_is_fine(tmp_path, n):
    b = RowBuffer(10)
    for i in range(n):
        b.append(comm_row(i))
    w = HookWriter(b, str(tmp_path), IDENT, 60, on_failure=lambda r: None)
    assert w.flush() and w.written["comm_op"] == n
