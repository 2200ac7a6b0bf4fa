"""One rank's recording session: the state the wrappers report to, and its lifecycle.

A session starts once the process group exists (the rank is known), owns the
row buffer, the writer thread and the watchdog, numbers calls per group,
counts steps, and at the end writes what it recorded and what it lost into
the store's manifest (and logs one line when something was lost). Every
method the hot path calls is guarded so that nothing escapes into the job.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections import Counter, defaultdict
from itertools import count

from rankscope.collectors.hooks import hook_comm
from rankscope.collectors.hooks.hook_config import HookConfig
from rankscope.collectors.hooks.hook_writer import HookWriter, RowBuffer

log = logging.getLogger("rankscope.hooks")
_now = time.time_ns


class HookSession:
    """Recording state of one rank process."""

    def __init__(self, config: HookConfig, rank: int, store=None, writer_clock=None):
        self.config = config
        self.rank = int(rank)
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.active = True
        self.started_ns = _now()
        self.ring = hook_comm.new_ring(config.buffer_rows)
        """The C hot path's ring of calls (None without it); part of the buffer."""
        self.buffer = RowBuffer(config.buffer_rows, ring=self.ring)
        self.identity = {"job": config.job, "rank": self.rank, "host": self.host, "pid": self.pid}
        # The store (and pyarrow with it) is opened by the writer thread, off the job's thread.
        self.writer = HookWriter(self.buffer, store if store is not None else config.store, self.identity,
                                 config.flush_interval_s, self._on_write_failure, clock=writer_clock)
        self.pending: dict[int, list] = {}
        self.seqs: defaultdict = defaultdict(count)
        """Next sequence number per group (per group, op and peer for point-to-point), as counters."""
        self.groups: dict = {}
        self.dtypes: dict = {}
        self.cuda = _cuda_possible()
        if self.ring is not None:
            self.ring.cuda = int(self.cuda)
        self.step_no = 0
        self.step_start_ns = self.started_ns
        self.user_steps = False
        self._lead_optimizer = None
        self.counts: Counter = Counter()  # internal errors, unwaited ops, writer restarts
        self.disabled_reason: str | None = None
        self.watchdog = None
        self._closed = False
        self._warned = set()
        self._prev_handlers: dict = {}
        self._handles: list = []

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.writer.start()
        if self.ring is not None:
            hook_comm.use_ring(self.ring)
        if self.config.watchdog:
            from rankscope.collectors.hooks.hook_watchdog import Watchdog

            self.watchdog = Watchdog(self, self.config.hang_timeout_s)
            self.watchdog.start()
        if self.config.auto_step:
            self._hook_optimizer()
        if self.config.signals:
            self._install_signal_handlers()

    def _hook_optimizer(self) -> None:
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except ImportError:
            return
        self._handles.append(register_optimizer_step_post_hook(self._after_optimizer_step))

    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        try:
            if self.user_steps or not self.active:
                return
            # With several optimizers per rank, the first one that steps defines the step.
            if self._lead_optimizer is None:
                self._lead_optimizer = id(optimizer)
            if id(optimizer) == self._lead_optimizer:
                self.mark_step()
        except Exception:  # noqa: BLE001
            self.internal_error()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._prev_handlers[sig] = signal.getsignal(sig)
                signal.signal(sig, self._on_signal)
            except (ValueError, OSError, TypeError):
                continue

    def _on_signal(self, signum, frame) -> None:
        try:
            self.close(reason=f"signal {signal.Signals(signum).name}", join_timeout_s=1.0)
        except Exception:  # noqa: BLE001
            pass
        prev = self._prev_handlers.get(signum)
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_DFL or prev is None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def after_fork_in_child(self) -> None:
        """A forked child (DataLoader worker) inherits the session but not its threads: stay silent."""
        self._deactivate()
        self._closed = True

    def close(self, reason: str = "exit", join_timeout_s: float = 10.0) -> dict:
        """Stop recording, write what is buffered and the loss report; returns the report."""
        if self._closed or os.getpid() != self.pid:
            return self.report()
        self._closed = True
        self._deactivate()
        if self.watchdog is not None:
            self.watchdog.stop()
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001
                pass
        # Async ops still open at exit were never waited on: they are lost, not guessed.
        open_ops = len(self.pending) + (len(self.ring.pending()) if self.ring is not None else 0)
        if open_ops:
            self.counts["ops still open at exit"] += open_ops
            self.pending.clear()
        self.writer.stop(final_flush=True, timeout_s=join_timeout_s)
        rep = self.report()
        self._write_manifest(rep, reason)
        if rep["lost_total"]:
            log.warning("rankscope hook: rank %d recorded %d rows, wrote %d, lost %d (%s)%s", self.rank,
                        rep["recorded"], sum(rep["written"].values()), rep["lost_total"],
                        ", ".join(f"{k}: {v}" for k, v in rep["lost"].items() if v),
                        f"; writing stopped: {rep['failure']}" if rep["failure"] else "")
        return rep

    def report(self) -> dict:
        """What this rank recorded, wrote and lost (by reason)."""
        w = self.writer
        lost = {
            "buffer full (dropped oldest)": self.buffer.dropped,
            "write failed": w.lost_on_failure,
            "writer thread killed mid-write": w.lost_killed,
            "not recorded after the hook disabled itself": self.counts["calls after disable"],
            "async op never waited": self.counts["async op never waited"],
            "ops still open at exit": self.counts["ops still open at exit"],
        }
        lost.update(w.rejects)
        return {"rank": self.rank, "pid": self.pid, "host": self.host, "job": self.config.job,
                "recorded": self.buffer.appended, "written": dict(w.written), "parts": w.num_parts,
                "lost": lost, "lost_total": sum(lost.values()),
                "failure": w.failed or self.disabled_reason,
                "internal_errors": self.counts["internal errors"],
                "writer_restarts": self.counts["writer restarts"]}

    def _write_manifest(self, rep: dict, reason: str) -> None:
        if self.writer.failed:
            return
        try:
            from rankscope.collectors.store import ManifestEntry

            key = f"hook-{self.config.job}-r{self.rank}-{self.pid}-{self.started_ns}"
            self.writer.open_store().add_manifest(ManifestEntry(
                key=key, source=f"hook:{self.host}:{self.pid}", format="hook", job=self.config.job,
                records=rep["written"], rejects={k: v for k, v in rep["lost"].items() if v},
                notes={"rank": self.rank, "closed_by": reason, "recorded": rep["recorded"],
                       "internal_errors": rep["internal_errors"], "writer_restarts": rep["writer_restarts"]}))
        except Exception as e:  # noqa: BLE001 - the store may be gone by now
            self._warn_once("manifest", "rankscope hook: could not write the loss report to %s: %s",
                            self.config.store, e)

    # ------------------------------------------------------------- failures
    def _deactivate(self) -> None:
        """Stop recording new calls, on both paths."""
        self.active = False
        if self.ring is not None:
            self.ring.active = False
            hook_comm.use_ring(None, unless_other=self.ring)

    def _on_write_failure(self, reason: str) -> None:
        self._deactivate()
        self.disabled_reason = reason
        self._warn_once("write", "rankscope hook: rank %d cannot write to the trace store %s (%s); "
                        "recording stops here, the job runs on unaffected", self.rank, self.config.store, reason)

    def _warn_once(self, key: str, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    def internal_error(self) -> None:
        """A bug or surprise in our own bookkeeping: counted, logged once, never raised."""
        self.counts["internal errors"] += 1
        if "internal" not in self._warned:
            self._warned.add("internal")
            log.warning("rankscope hook: internal error while recording a call (counted; the call ran)",
                        exc_info=True)

    def check_writer(self) -> None:
        """Restart the writer thread if something killed it (counted and logged once)."""
        if self._closed or not self.active or self.writer.alive():
            return
        self.counts["writer restarts"] += 1
        self._warn_once("writer", "rankscope hook: rank %d's writer thread died; restarting it", self.rank)
        self.writer.start()

    # ------------------------------------------------------------- hot path
    def group_info(self, group):
        """(group_id, global member ranks by group rank, group) or None when this rank is not a member."""
        key = id(group) if group is not None else None
        info = self.groups.get(key)
        if info is not None:
            return info if info[1] is not None else None
        import torch.distributed as dist

        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        ranks = dist.get_process_group_ranks(pg)
        if self.rank not in ranks:
            self.groups[key] = (None, None, group)
            return None
        order = sorted(ranks, key=lambda r: dist.get_group_rank(pg, r))
        gid = getattr(pg, "group_name", None) or dist.distributed_c10d._get_process_group_name(pg)
        # Keeping `group` in the value keeps its id() from being reused by another object.
        info = self.groups[key] = (str(gid), tuple(order), group)
        return info

    def forget_groups(self) -> None:
        self.groups.clear()
        if self.ring is not None:
            self.ring.forget()

    def dtype_info(self, tensor) -> tuple[str, int]:
        """(dtype name without ``torch.``, bytes per element), cached per dtype."""
        info = self.dtypes.get(tensor.dtype)
        if info is None:
            info = self.dtypes[tensor.dtype] = (str(tensor.dtype).removeprefix("torch."), tensor.element_size())
        return info

    def begin(self, op, gid, ranks, peer, size, dtype, numel, out_size, is_p2p, cuda) -> list:
        key = (gid, op, peer) if is_p2p else gid
        seq = next(self.seqs[key])
        now = _now()
        start = hook_comm.cuda_event() if cuda else now
        rec = ["c", op, gid, ranks, peer, size, dtype, start, None, "pending", seq, self.step_no, numel,
               out_size, None, now if cuda else None]
        self.pending[id(rec)] = rec
        return rec

    def finish(self, rec: list, state: str, end_ns: int | None = None) -> None:
        """Stamp a record's end (``end_ns`` for wall-clock records, else now or a CUDA event) and queue it."""
        try:
            if rec[7].__class__ is int:
                rec[8] = _now() if end_ns is None else end_ns
            else:
                rec[8] = hook_comm.cuda_event()
            rec[9] = state
            self.pending.pop(id(rec), None)
            if self.active:
                self.buffer.append(rec)
            else:
                self.counts["calls after disable"] += 1
        except Exception:  # noqa: BLE001
            self.internal_error()

    def complete(self, recs: list, state: str, end_ns: int) -> None:
        for rec in recs:
            self.finish(rec, state, end_ns)

    def abandon(self, recs: list) -> None:
        for rec in recs:
            if self.pending.pop(id(rec), None) is not None:
                self.counts["async op never waited"] += 1

    # ----------------------------------------------------------- user marks
    def mark_step(self, explicit: bool = False) -> None:
        """End the current step (step_mark row) and start the next."""
        if explicit:
            self.user_steps = True
        now = _now()
        if self.active:
            self.buffer.append(("s", self.step_no, self.step_start_ns, now))
        self.step_no += 1
        self.step_start_ns = now
        if self.ring is not None:
            self.ring.step = self.step_no
        self.check_writer()

    def batch_meta(self, seq_lens, step: int | None = None) -> None:
        st = self.step_no if step is None else int(step)
        if self.active:
            for i, n in enumerate(seq_lens):
                self.buffer.append(("b", st, i, int(n)))

    def pending_rows(self) -> list[list]:
        """Snapshot of the calls not completed yet (copies: the job may complete them meanwhile)."""
        rows = [list(r) for r in self.pending.copy().values()]
        if self.ring is not None:
            rows.extend(self.ring.pending())
        return rows


def _cuda_possible() -> bool:
    """Whether any tensor of this process can be a CUDA tensor (else the hot path skips the check)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch (unit tests) or a broken CUDA setup
        return False
