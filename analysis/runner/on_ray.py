"""Analyse a store on a Ray cluster: the same analysis as the embedded engine, split into Ray tasks.

The embedded engine (a loop in the calling process) stays the default. This engine:

- plans the store's jobs with each flow capture's job recognition split into tasks
  (runner.capture_split: one task per partition of the capture reduces it to partial features, the
  driver merges them and recognises the jobs, a second round of tasks bins the rails' activity when
  rails may be copies of one job), so no process ever holds a whole capture;
- analyses each planned job in a task of its own, which reads only that job's records from the store
  (a training job's, or a recognised job's flows among its endpoints).

Workers read the store themselves: it must be on a path every node sees (a shared file system in a
real cluster). The analysis code is the same functions, so both engines give the same reports for the
same inputs (tests/integration/test_ray_capture_split.py holds them to it).
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Callable, Iterator

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.runner.capture_split import (
    PARTITION_ROWS,
    Partition,
    analyse_capture_job,
    plan_jobs_split,
)
from rankscope.analysis.runner.plan import PlannedJob, analyse_planned
from rankscope.collectors.errors import RankscopeError
from rankscope.collectors.store import Store


class RayEngineError(RankscopeError):
    """Ray is missing or the cluster cannot be reached."""


def _ray():
    try:
        import ray
    except ImportError as e:
        raise RayEngineError("--engine ray needs the ray package: pip install 'rankscope[ray]'") from e
    return ray


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[None]:
    """A Ray connection for the block: the one already open, else ``address`` (``ray://host:10001`` or
    ``host:6379``), else a local cluster on 127.0.0.1 started for the block and stopped after it."""
    ray = _ray()
    started = not ray.is_initialized()
    if started:
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                         _node_ip_address="127.0.0.1")
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise RayEngineError(f"cannot reach the Ray cluster at {address or 'a new local one'}: {e}") from e
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _reset_peak() -> None:
    """Start the process's peak resident memory afresh where the kernel allows it (Linux: ``clear_refs``
    5), so that a reused worker's figure is its task's, not the most of every task it ran before."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")


def object_store_bytes() -> int:
    """Bytes of shared memory the process has mapped and touched (Linux ``RssShmem``; 0 where unknown): on
    a Ray worker or driver, pages of the node's object store, which its RSS counts though they are the
    store's (one per node, sized by Ray), not the process's own."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * 1024
    return 0


def _measured(first: bool, fn: Callable, *args) -> tuple:
    """``fn(*args)`` measured: (its result, the worker's peak resident memory in bytes while it ran, pid,
    object store bytes the worker had mapped when it started), or with ``first``, for ``fn`` returning a
    tuple, that measured tuple of its first item followed by its other items (each a return object of its
    own, ``num_returns``). The peak counts what the worker still held from earlier tasks (allocator caches,
    object store pages, :func:`object_store_bytes`) but no earlier task's own peak (:func:`_reset_peak`;
    without it, the most any task of that worker took until then, unless ``max_calls=1``)."""
    _reset_peak()
    shared = object_store_bytes()
    out = fn(*args)
    m = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, os.getpid(), shared
    return ((out[0], *m), *out[1:]) if first else (out, *m)


class RayMapper:
    """The capture split's mapper on Ray: one task per argument tuple (all submitted at the first result
    asked for), results yielded in order.

    Arguments other than the partition (the options, the rails plan) go to the object store once per
    call, not once per task. ``peaks`` collects (function, argument label, peak RSS bytes, pid) per task
    (:func:`_measured`)."""

    def __init__(self, max_calls: int = 0):
        self.max_calls = max_calls
        self.peaks: list[tuple[str, str, int, int]] = []
        self.shared: list[int] = []
        """per task, in the order of ``peaks``: object store bytes its worker had mapped when it started,
        counted in its peak but not its own (peak minus these: the task's, if the worker only maps more)."""
        self.rounds: list[tuple[str, int, float]] = []
        """(function, tasks, wall seconds from submitting the first to receiving the last) per call."""

    def __call__(self, fn: Callable, args: list[tuple]) -> Iterator:
        ray = _ray()
        task = ray.remote(max_calls=self.max_calls)(_measured)
        t0 = time.perf_counter()
        refs = _submit(task, False, fn, args)
        for a, r in zip(args, refs, strict=True):
            res, peak, pid, shared = ray.get(r)
            self._record(fn.__name__, _label(a[0]), peak, pid, shared)
            yield res
        self.rounds.append((fn.__name__, len(args), time.perf_counter() - t0))

    def _record(self, fn: str, label: str, peak: int, pid: int, shared: int) -> None:
        self.peaks.append((fn, label, peak, pid))
        self.shared.append(shared)

    def split(self, fn: Callable, args: list[tuple], num_returns: int) -> Iterator[tuple[object, list]]:
        """As a call, for ``fn`` returning a tuple of ``num_returns`` items: yields (its first item, object
        refs of the others); those stay in the object store until tasks of a later call take them as
        arguments (runner.capture_split: a partition's burst buckets never reach the driver)."""
        ray = _ray()
        task = ray.remote(max_calls=self.max_calls, num_returns=num_returns)(_measured)
        t0 = time.perf_counter()
        refs = _submit(task, True, fn, args)
        for a, r in zip(args, refs, strict=True):
            res, peak, pid, shared = ray.get(r[0])
            self._record(fn.__name__, _label(a[0]), peak, pid, shared)
            yield res, list(r[1:])
        self.rounds.append((fn.__name__, len(args), time.perf_counter() - t0))


def _submit(task, first: bool, fn: Callable, args: list[tuple]) -> list:
    """``task.remote(first, fn, *a)`` for each ``a`` (:func:`_measured`). Arguments other than the partition
    and numbers (the options, the rails plan) go to the object store once, not once per task; object refs
    go as they are (Ray gives the task their values)."""
    ray = _ray()
    shared: dict[int, object] = {}

    def ref(x):
        if isinstance(x, (Partition, int, ray.ObjectRef)):  # small, or in the store already: inline
            return x
        if id(x) not in shared:
            shared[id(x)] = ray.put(x)
        return shared[id(x)]

    return [task.remote(first, fn, *[ref(x) for x in a]) for a in args]


def _label(x) -> str:
    path = getattr(x, "path", None)
    return f"{os.path.basename(path)}@{x.offset}" if path else str(getattr(x, "name", x))


def plan_with_ray(store_root: str, job: str | None = None, flow_job: str | None = None,
                  flow: FlowConfig | None = None, mapper: RayMapper | None = None,
                  partition_rows: int | None = None) -> list[PlannedJob]:
    """runner.plan.plan_jobs with each flow capture's job recognition split into Ray tasks (needs an open
    :func:`ray_session`), one per partition of at most ``partition_rows`` records (default
    runner.capture_split.PARTITION_ROWS)."""
    return plan_jobs_split(Store(store_root), job, flow_job, flow or FlowConfig(), mapper or RayMapper(),
                           partition_rows or PARTITION_ROWS)


def _analyse_one(store_root: str, planned: PlannedJob, config):
    store = Store(store_root)
    if planned.kind == "capture":
        return analyse_capture_job(store, planned, config)
    return analyse_planned(store, planned, config)


def analyse_with_ray(store_root: str, plan: list[PlannedJob], config=None, address: str | None = None,
                     num_cpus: int | None = None, mapper: RayMapper | None = None
                     ) -> Iterator[tuple[PlannedJob, object, dict]]:
    """(planned job, Diagnosis, tables) per job, in plan order, analysed as Ray tasks.

    ``address`` names an existing cluster; without it (and without an open :func:`ray_session`) a
    local cluster is started on 127.0.0.1 for this call and stopped afterwards. ``mapper``: its
    ``max_calls`` and ``peaks`` are used for the per-job tasks too."""
    with ray_session(address, num_cpus):
        ray = _ray()
        m = mapper or RayMapper()
        task = ray.remote(max_calls=m.max_calls)(_measured)
        cfg = ray.put(config)
        refs = [task.remote(False, _analyse_one, store_root, p, cfg) for p in plan]
        for planned, ref in zip(plan, refs, strict=True):
            (d, tables), peak, pid, shared = ray.get(ref)
            m._record("_analyse_one", planned.name, peak, pid, shared)
            yield planned, d, tables
