"""The hook's per-rank bounded buffer and the background thread that writes it to the store.

The hot path only appends a tuple to :class:`RowBuffer` (a ``deque`` with a
``maxlen``: when full, appending drops the oldest row, which is exactly the
policy wanted; the drops are counted afterwards as appended - taken - held, so
the hot path pays no check). :class:`HookWriter` wakes every
``flush_interval_s`` (or when asked), turns the rows into Arrow tables of the
declared kinds (``schema.validate``) and writes them as new Parquet parts with
:class:`~rankscope.collectors.store.Store`. A write that fails (store deleted,
replaced by a file, disk full, read-only mount) calls ``on_failure`` once;
the session then disables itself. Nothing raised here reaches the training loop.

Row tuples (first element is the kind tag):

- ``["c", op, group_id, group_ranks, peer, size_bytes, dtype, start, end, state, seq, step,
  num_elements, out_size_bytes, stream, launch_ns]`` (a list: the hook fills in the end);
  ``start``/``end`` are ints (ns) or CUDA event objects that the writer resolves
  (see :class:`EventClock`)
- ``("s", step, start_ns, end_ns)`` step_mark; ``("b", step, microbatch, seq_len)`` batch_meta
- ``("k", dict)`` compute_op (CUPTI kernels; the dict holds compute_op columns)
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, deque

log = logging.getLogger("rankscope.hooks")

COMM_FIELDS = ("op", "group_id", "group_ranks", "peer", "size_bytes", "dtype", "start_ns", "end_ns",
               "state", "seq", "step", "num_elements", "out_size_bytes", "stream", "launch_ns")
KIND_OF_TAG = {"c": "comm_op", "s": "step_mark", "b": "batch_meta", "k": "compute_op"}


class RowBuffer:
    """Bounded FIFO of row tuples; append is the only thing the hot path does.

    With ``ring`` (the C hot path's :class:`~rankscope.collectors.hooks.hook_fastcall.Ring`), the calls the
    C path records wait there as structs, and :meth:`take`, :attr:`appended`, :attr:`dropped` and
    ``len`` count both. Each holds up to ``max_rows``.
    """

    def __init__(self, max_rows: int, ring=None):
        self.q: deque = deque(maxlen=max_rows)
        self.counter = itertools.count(1)
        self.appended_at = 0
        """Rows appended so far (the hook's wrappers inline :meth:`append` as these two lines)."""
        self._taken = 0
        self.max_rows = max_rows
        self.ring = ring

    def append(self, row) -> None:
        self.q.append(row)
        # next() on itertools.count is atomic under the GIL, unlike ``+= 1`` from several threads.
        self.appended_at = next(self.counter)

    def take(self, limit: int | None = None, final: bool = False) -> list[tuple]:
        """Remove and return up to ``limit`` of the oldest rows (all when None).

        The ring's rows stop at a call still running (it ends later); ``final`` drops those instead.
        """
        q, out = self.q, []
        n = len(q) if limit is None else min(limit, len(q))
        pop = q.popleft
        try:
            for _ in range(n):
                out.append(pop())
        except IndexError:  # emptied by a concurrent taker
            pass
        self._taken += len(out)
        if self.ring is not None and (limit is None or len(out) < limit):
            out.extend(self.ring.take(None if limit is None else limit - len(out), final=final))
        return out

    def __len__(self) -> int:
        return len(self.q) + (len(self.ring) if self.ring is not None else 0)

    @property
    def appended(self) -> int:
        return self.appended_at + (self.ring.appended if self.ring is not None else 0)

    @property
    def dropped(self) -> int:
        """Rows pushed out by newer ones because the buffer was full."""
        return max(0, self.appended_at - self._taken - len(self.q)) + (self.ring.dropped if self.ring is not None
                                                                         else 0)


class EventClock:
    """Turns CUDA events into wall-clock ns without ever synchronising the training stream.

    The anchor is an event the writer thread records on a side stream of its own
    and waits for (blocking only the writer), timing the wait with the wall clock;
    every later event is placed by ``anchor.elapsed_time(event)``. ``anchor_factory``
    returns ``(event, wall_ns)``; tests pass a fake.
    """

    def __init__(self, anchor_factory=None):
        self._factory = anchor_factory or _cuda_anchor
        self._anchor = None

    def resolve(self, ev) -> int | None:
        """Wall ns of a completed event; None while the GPU has not reached it."""
        if isinstance(ev, int) or ev is None:
            return ev
        if not ev.query():
            return None
        if self._anchor is None:
            self._anchor = self._factory()
        anchor, wall_ns = self._anchor
        return wall_ns + round(anchor.elapsed_time(ev) * 1e6)


def _cuda_anchor():
    import torch

    side = torch.cuda.Stream()
    ev = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(side):
        t0 = time.time_ns()
        ev.record(side)
        ev.synchronize()
        t1 = time.time_ns()
    return ev, (t0 + t1) // 2


class HookWriter:
    """Background thread that drains a :class:`RowBuffer` into a store."""

    def __init__(self, buffer: RowBuffer, store, identity: dict, flush_interval_s: float,
                 on_failure, clock: EventClock | None = None, gpu_wait_s: float = 2.0):
        self.buffer = buffer
        self.store = store  # a Store, or its root directory (opened on first use)
        self.identity = identity  # job, rank, host, pid: constant columns
        self.interval = flush_interval_s
        self.on_failure = on_failure
        self.clock = clock or EventClock()
        self.gpu_wait_s = gpu_wait_s
        self._unresolved: list[tuple] = []  # comm rows whose CUDA events have not completed yet
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.failed: str | None = None
        self.written: Counter = Counter()
        self.lost_on_failure = 0
        self.lost_killed = 0
        self.rejects: Counter = Counter()
        self.num_parts = 0

    # ----------------------------------------------------------- thread
    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="rankscope-hook-writer", daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, final_flush: bool = True, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout_s)
        if final_flush:
            self.flush(final=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            self.flush()

    # ------------------------------------------------------------ write
    def open_store(self):
        if isinstance(self.store, str):
            from rankscope.collectors.store import Store

            self.store = Store(self.store)
        return self.store

    def flush(self, final: bool = False, extra_rows: list[tuple] | None = None, lock_timeout_s: float = 5.0) -> bool:
        """Write what the buffer holds (plus ``extra_rows``); False when nothing could be written."""
        if not self._lock.acquire(timeout=lock_timeout_s):
            return False
        try:
            if self.failed:
                self.lost_on_failure += len(self.buffer.take()) + len(extra_rows or ())
                return False
            rows = self._unresolved + self.buffer.take(final=final) + list(extra_rows or ())
            self._unresolved = []
            if not rows:
                return True
            try:
                store = self.open_store()
                tables = self._tables(rows, final)
                for kind, table in tables.items():
                    store.write(kind, table)
                    self.written[kind] += table.num_rows
                    self.num_parts += 1
                    rows_left = [r for r in rows if KIND_OF_TAG[r[0]] != kind]
                    rows = rows_left
            except Exception as e:  # noqa: BLE001 - a failing writer must never reach the job
                self.lost_on_failure += len(rows)
                self.failed = f"{type(e).__name__}: {e}"
                try:
                    self.on_failure(self.failed)
                except Exception:  # noqa: BLE001
                    pass
                return False
            except BaseException:
                # Something killed this thread mid-write (SystemExit raised into it): the rows in
                # hand are lost and counted; the session restarts the thread, the store is fine.
                self.lost_killed += len(rows)
                raise
            return True
        finally:
            self._lock.release()

    def _tables(self, rows: list[tuple], final: bool) -> dict:
        import pyarrow as pa

        from rankscope.collectors.schema import validate

        by_kind: dict[str, list] = {}
        for r in rows:
            by_kind.setdefault(KIND_OF_TAG[r[0]], []).append(r)
        out = {}
        for kind, rs in by_kind.items():
            cols = self._columns(kind, rs, final)
            if cols is None:
                continue
            n = len(next(iter(cols.values())))
            if n == 0:
                continue
            for k, v in self.identity.items():
                cols[k] = [v] * n
            cols["source"] = ["hook"] * n
            v = validate(pa.table(cols), kind)
            if v.rejects:
                self.rejects.update(v.rejects)
                log.debug("rankscope hook: %s rows rejected: %s", kind, dict(v.rejects))
            if v.table.num_rows:
                out[kind] = v.table
        return out

    def _columns(self, kind: str, rs: list[tuple], final: bool) -> dict | None:
        if kind == "comm_op":
            rs = self._resolve_events(rs, final)
            cols = {name: list(vals) for name, vals in zip(COMM_FIELDS, zip(*rs))} if rs else {}
            if cols:
                cols["group_ranks"] = [list(g) if g is not None else None for g in cols["group_ranks"]]
            return cols
        if kind == "step_mark":
            return dict(zip(("step", "start_ns", "end_ns"), map(list, zip(*(r[1:] for r in rs)))))
        if kind == "batch_meta":
            return dict(zip(("step", "microbatch", "seq_len"), map(list, zip(*(r[1:] for r in rs)))))
        if kind == "compute_op":
            names = sorted({k for r in rs for k in r[1]})
            return {k: [r[1].get(k) for r in rs] for k in names}
        return None

    def _resolve_events(self, rs: list[tuple], final: bool) -> list[tuple]:
        """Replace CUDA events by wall ns; rows whose events are not done wait for the next flush."""
        done = []
        deadline = time.monotonic() + (self.gpu_wait_s if final else 0.0)
        for r in rs:
            start, end = r[7], r[8]
            if isinstance(start, int) and (end is None or isinstance(end, int)):
                done.append(r[1:])
                continue
            s, e = self.clock.resolve(start), self.clock.resolve(end)
            while final and (s is None or (end is not None and e is None)) and time.monotonic() < deadline:
                time.sleep(0.01)
                s, e = self.clock.resolve(start), self.clock.resolve(end)
            if s is not None and (end is None or e is not None):
                done.append(tuple(r[1:7]) + (s, e) + tuple(r[9:]))
            elif final:
                # The GPU never got there before exit; there is no time we could trust, so count it.
                self.rejects["cuda event unresolved at exit"] += 1
            else:
                self._unresolved.append(r)
        excess = len(self._unresolved) - self.buffer.max_rows
        if excess > 0:  # keep the memory cap even if the GPU stalls for a long time
            del self._unresolved[:excess]
            self.rejects["cuda event unresolved, buffer full"] += excess
        return done
