"""Hang watchdog: dumps a rank's pending calls into the store when one is stuck too long.

A rank stuck in a collective whose peers never arrive blocks in the job's
thread, so nothing the job does will ever report it. This thread looks at the
session's pending calls every ``min(timeout / 4, 5 s)``; when the oldest has
been waiting longer than ``hang_timeout_s`` it writes every pending call of
the rank (``state = pending``, ``end_ns`` null) together with what the buffer
holds, so the hang analysis can see which ranks reached which call and which
never did. Each call is dumped at most once; if it completes later, its
completed row is written as usual (analysis keeps the completed state).
The watchdog also restarts the writer thread if something killed it.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("rankscope.hooks")


class Watchdog:
    """Background thread watching one session's pending calls."""

    def __init__(self, session, timeout_s: float):
        self.session = session
        self.timeout_ns = int(timeout_s * 1e9)
        self.period_s = watchdog_period_s(timeout_s)
        self.dumped: set[int] = set()
        self.num_dumped = 0
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="rankscope-hook-watchdog", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(2.0)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.session.check_writer()
                self.check(time.time_ns())
            except Exception:  # noqa: BLE001 - the watchdog must never take anything down
                self.session.internal_error()

    def check(self, now_ns: int) -> int:
        """Dump the pending calls if the oldest is overdue; returns how many rows were dumped."""
        s = self.session
        if not s.active:
            return 0
        rows = s.pending_rows()
        if not rows:
            return 0
        issued = [r[7] if r[7].__class__ is int else r[15] for r in rows]
        overdue = [r for r, t in zip(rows, issued) if t is not None and now_ns - t > self.timeout_ns]
        if not overdue:
            return 0
        new = [r for r in rows if _key(r) not in self.dumped]
        if not new:
            return 0
        oldest = min(overdue, key=lambda r: r[7] if r[7].__class__ is int else r[15])
        log.warning("rankscope hook: rank %d: %s on group %s (seq %s) pending for %.0f s; dumping %d pending "
                    "call(s) to %s", s.rank, oldest[1], oldest[2], oldest[10],
                    (now_ns - (oldest[7] if oldest[7].__class__ is int else oldest[15])) / 1e9, len(new),
                    s.config.store)
        for r in new:
            self.dumped.add(_key(r))
            r[8], r[9] = None, "pending"
        if s.writer.flush(extra_rows=new):
            self.num_dumped += len(new)
            return len(new)
        return 0


def watchdog_period_s(timeout_s: float) -> float:
    """How often the watchdog looks: a call is dumped at most this long after it passed the timeout."""
    return min(max(timeout_s / 4, 0.01), 5.0)


def _key(r: list) -> tuple:
    """Identity of a call across snapshots: group, op, peer and sequence number."""
    return (r[2], r[1], r[4], r[10])
