"""Decode the files of one ingest ahead of the write loop, in forked worker processes.

Why processes: the decode (orjson, and the per-event Python around it) holds the
GIL, so threads would not use a second core. Only importers that say
``ingest.parallel_decode = True`` (a pure, per-file ``read`` returning one
ImportBatch: Kineto) are decoded ahead. The parent still validates and writes
every file, in input order and in its own transaction, so the store ends up
exactly as with a serial ingest.

How many: one worker per idle core plus one (1-minute load average, as
``make -l``), and at least one for two or more files. Even one worker pays: the
parent writes file i while it decodes file i+1, and no process holds a decode's
and a write's working sets at once (8 Kineto ranks: 149 MB peak against 177 MB
decoding in the ingesting process, for about the same CPU).
``RANKSCOPE_INGEST_WORKERS`` sets the number; 0 decodes in the ingesting process.

Why fork, and when not: a forked worker starts without re-importing polars and
pyarrow (about 0.3 s and 90 MB each), but a child forked after polars started
its thread pool deadlocks in its first parallel polars call. So workers are
forked before the parent computes anything, only while no Python thread but
this one and no compute pool runs, and each worker first makes one polars call
under a watchdog; otherwise (and where there is no fork or /proc) the parent
decodes every file itself.

Memory: at most ``workers + 1`` decoded files wait for the parent at a time,
and each worker holds one file's decode. Summed over the processes that is more
than a serial ingest holds (the workers share the parent's pages at the fork,
copy-on-write), but no single process peaks higher.

A worker that fails on a file hands back nothing, and the parent decodes that
file itself: errors, rejects and messages are the serial ones.
"""

from __future__ import annotations

import gc
import os
import re
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rankscope.collectors.importers import contract
from rankscope.collectors.ingest import registry

if TYPE_CHECKING:
    from concurrent.futures import Future, ProcessPoolExecutor

WORKERS_ENV = "RANKSCOPE_INGEST_WORKERS"
"""the number of decode workers; 0 decodes in the ingesting process (default: one per idle CPU core, plus
one, and at least one)"""


_POOL_THREADS = re.compile(r"^(polars-\d+|tokio-|rayon)")
"""compute pools that do not survive a fork (jemalloc's and polars' housekeeping threads do)"""
_PROBE_S = 20.0


def _fork_safe() -> bool:
    """No Python thread besides this one, and no compute pool started (names from /proc: Linux)."""
    import threading

    if threading.active_count() != 1:
        return False
    try:
        names = [Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")]
    except OSError:
        return False  # cannot tell: do not fork
    return not any(_POOL_THREADS.match(n) for n in names)


def _probe() -> None:
    """Worker start: one parallel polars call, under a watchdog. Should the parent's pool have started
    after all, the call hangs, the watchdog ends the worker, and the parent decodes every file itself."""
    import threading

    import polars as pl

    done = threading.Event()

    def watch() -> None:
        if not done.wait(_PROBE_S):
            os._exit(70)

    threading.Thread(target=watch, daemon=True).start()
    pl.DataFrame({"a": [1, 2, 3]}).filter(pl.col("a") > 1).height  # noqa: B018 - starts this worker's pool
    done.set()


def _workers(n_files: int) -> int:
    """How many workers: the env's number where set, else one per core that is idle on average over the
    last minute, plus the core this process holds (as ``make -l``; on a busy machine more processes add
    CPU and no wall time), and at least one."""
    want = os.environ.get(WORKERS_ENV, "").strip()
    if want:
        try:
            n = int(want)
        except ValueError:
            n = 1
    else:
        cores = os.cpu_count() or 1
        try:
            idle = cores - os.getloadavg()[0]
        except OSError:
            idle = cores
        # + this process's own core: it mostly waits while workers decode. At least one worker even on a
        # busy machine: decode and write then overlap, and no process holds both working sets
        n = max(1, min(cores, round(idle) + 1))
    return max(0, min(n, n_files, 32))


def _decode(name: str, path: Path, opts: contract.ImportOptions, lim: contract.Limits):
    """In a worker: the file's ImportBatch, or None (the parent then decodes it itself)."""
    try:
        with contract.limits(lim):
            out = registry.importer(name).read(path, opts)
        return out if isinstance(out, contract.ImportBatch) else None
    except Exception:  # noqa: BLE001 - the parent meets the same error on its own decode
        return None


class Ahead:
    """Decoded files by path, in input order; ``take`` returns None for a file not decoded ahead."""

    def __init__(self, pool: ProcessPoolExecutor | None, todo: list[tuple[Path, str]],
                 opts: contract.ImportOptions, lim: contract.Limits, depth: int,
                 skip: Callable[[Path, str], bool] | None = None):
        self._pool, self._todo, self._opts, self._lim, self._depth = pool, deque(todo), opts, lim, depth
        self._skip = skip
        self._running: deque[tuple[Path, Future]] = deque()
        self.submitted = 0
        """files handed to the workers (the pool forks at the first)"""
        self._fill()

    def _fill(self) -> None:
        while self._pool is not None and self._todo and len(self._running) < self._depth:
            path, name = self._todo.popleft()
            # already in the store: the parent skips it without a decode (checked here, as the window
            # reaches the file, not for the whole set up front)
            if self._skip is not None and self._skip(path, name):
                continue
            try:
                fut = self._pool.submit(_decode, name, path, self._opts, self._lim)
            except Exception:  # noqa: BLE001 - a broken pool (a worker died): the rest is decoded serially
                self._pool, self._todo = None, deque()
                return
            self.submitted += 1
            self._running.append((path, fut))

    def take(self, path: Path) -> contract.ImportBatch | None:
        """The file's decode, or None; files decoded ahead of ``path`` that were never taken (skipped as
        already in the store) are dropped."""
        if not any(p == path for p, _ in self._running):
            return None
        while True:
            p, fut = self._running.popleft()
            if p == path:
                break
            fut.cancel()
        try:
            out = fut.result()
        except Exception:  # noqa: BLE001 - a lost worker: the parent decodes the file itself
            out = None
        self._fill()
        return out


@contextmanager
def ahead(files: list[Path], fmt: str, opts: contract.ImportOptions, lim: contract.Limits,
          skip: Callable[[Path, str], bool]) -> Iterator[Ahead]:
    """Start decoding the files whose importer allows it and that ``skip`` (already in the store) does not
    rule out; yields the Ahead to ``take`` them from, in the order of ``files``."""
    todo = []
    for p in files:
        try:
            name = registry.detect(p) if fmt == "auto" else fmt
            if name is not None and getattr(registry.importer(name), "parallel_decode", False):
                todo.append((p, name))
        except Exception:  # noqa: BLE001 - the serial path reports unreadable files and unknown formats
            continue
    n = _workers(len(todo)) if len(todo) > 1 else 0  # one file: nothing to overlap
    if n < 1 or not hasattr(os, "fork") or not _fork_safe():
        yield Ahead(None, [], opts, lim, 0)
        return
    # imported here: they load multiprocessing, which only an ingest that forks needs
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # objects of the parent that the workers' collector would otherwise walk (and so copy, page by page).
    # A process that froze its libraries already (cli/startup.import_frozen) keeps them frozen: unfreezing
    # is all or nothing, and would hand them back to every later full collection of its analysis
    was_frozen = gc.get_freeze_count() > 0
    gc.freeze()
    pool = ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("fork"), initializer=_probe)
    try:
        yield Ahead(pool, todo, opts, lim, depth=n + 1, skip=skip)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if not was_frozen:
            gc.unfreeze()
