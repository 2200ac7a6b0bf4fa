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
from rankscope.analysis.runner.capture_split import Partition, analyse_capture_job, plan_jobs_split
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


def _measured(fn: Callable, *args):
    """``fn(*args)`` with the worker process's peak resident memory (bytes) and pid: with one task per
    worker (``max_calls=1``) the peak is the task's own, else the most any task of that worker took."""
    out = fn(*args)
    return out, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, os.getpid()


def _measured_first(fn: Callable, *args) -> tuple:
    """:func:`_measured` for ``fn`` returning a tuple: (its first item measured, then its other items),
    each a return object of its own (``num_returns``)."""
    out = fn(*args)
    return ((out[0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, os.getpid()), *out[1:])


class RayMapper:
    """The capture split's mapper on Ray: one task per argument tuple (all submitted at the first result
    asked for), results yielded in order.

    Arguments other than the partition (the options, the rails plan) go to the object store once per
    call, not once per task. ``peaks`` collects (function, argument label, peak RSS bytes, pid) per task."""

    def __init__(self, max_calls: int = 0):
        self.max_calls = max_calls
        self.peaks: list[tuple[str, str, int, int]] = []
        self.rounds: list[tuple[str, int, float]] = []
        """(function, tasks, wall seconds from submitting the first to receiving the last) per call."""

    def __call__(self, fn: Callable, args: list[tuple]) -> Iterator:
        ray = _ray()
        task = ray.remote(max_calls=self.max_calls)(_measured)
        t0 = time.perf_counter()
        refs = _submit(task, fn, args)
        for a, r in zip(args, refs, strict=True):
            res, peak, pid = ray.get(r)
            self.peaks.append((fn.__name__, _label(a[0]), peak, pid))
            yield res
        self.rounds.append((fn.__name__, len(args), time.perf_counter() - t0))

    def split(self, fn: Callable, args: list[tuple], num_returns: int) -> Iterator[tuple[object, list]]:
        """As a call, for ``fn`` returning a tuple of ``num_returns`` items: yields (its first item, object
        refs of the others); those stay in the object store until tasks of a later call take them as
        arguments (runner.capture_split: a partition's burst buckets never reach the driver)."""
        ray = _ray()
        task = ray.remote(max_calls=self.max_calls, num_returns=num_returns)(_measured_first)
        t0 = time.perf_counter()
        refs = _submit(task, fn, args)
        for a, r in zip(args, refs, strict=True):
            res, peak, pid = ray.get(r[0])
            self.peaks.append((fn.__name__, _label(a[0]), peak, pid))
            yield res, list(r[1:])
        self.rounds.append((fn.__name__, len(args), time.perf_counter() - t0))


def _submit(task, fn: Callable, args: list[tuple]) -> list:
    """``task.remote(fn, *a)`` for each ``a``. Arguments other than the partition and numbers (the options,
    the rails plan) go to the object store once, not once per task; object refs go as they are (Ray
    gives the task their values)."""
    ray = _ray()
    shared: dict[int, object] = {}

    def ref(x):
        if isinstance(x, (Partition, int, ray.ObjectRef)):  # small, or in the store already: inline
            return x
        if id(x) not in shared:
            shared[id(x)] = ray.put(x)
        return shared[id(x)]

    return [task.remote(fn, *[ref(x) for x in a]) for a in args]


def _label(x) -> str:
    path = getattr(x, "path", None)
    return f"{os.path.basename(path)}@{x.offset}" if path else str(getattr(x, "name", x))


def plan_with_ray(store_root: str, job: str | None = None, flow_job: str | None = None,
                  flow: FlowConfig | None = None, mapper: RayMapper | None = None) -> list[PlannedJob]:
    """runner.plan.plan_jobs with each flow capture's job recognition split into Ray tasks (needs an open
    :func:`ray_session`)."""
    return plan_jobs_split(Store(store_root), job, flow_job, flow or FlowConfig(), mapper or RayMapper())


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
        refs = [task.remote(_analyse_one, store_root, p, cfg) for p in plan]
        for planned, ref in zip(plan, refs, strict=True):
            (d, tables), peak, pid = ray.get(ref)
            m.peaks.append(("_analyse_one", planned.name, peak, pid))
            yield planned, d, tables
