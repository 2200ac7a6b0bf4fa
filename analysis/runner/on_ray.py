"""Analyse many jobs of a store on a Ray cluster: the same analysis as the embedded engine, one task per job.

The embedded engine (a loop in the calling process) stays the default; this
engine ships each planned job to a Ray worker, which reads the job's records
from the store itself (the store must be on a path every node sees, a shared
file system in a real cluster) and returns the Diagnosis and its tables. The
analysis code is the same function, so both engines give the same report for
the same inputs.

Not done here yet: splitting ONE large flow capture into per-window,
per-exporter partitions whose pair aggregates are merged; a capture's jobs
are analysed in parallel, each in one task.
"""

from __future__ import annotations

from collections.abc import Iterator

from rankscope.analysis.runner.plan import PlannedJob, analyse_planned
from rankscope.collectors.errors import RankscopeError
from rankscope.collectors.store import Store


class RayEngineError(RankscopeError):
    """Ray is missing or the cluster cannot be reached."""


def _analyse_one(store_root: str, planned: PlannedJob, config):
    return analyse_planned(Store(store_root), planned, config)


def analyse_with_ray(store_root: str, plan: list[PlannedJob], config=None, address: str | None = None,
                     num_cpus: int | None = None) -> Iterator[tuple[PlannedJob, object, dict]]:
    """(planned job, Diagnosis, tables) per job, in plan order, analysed as Ray tasks.

    ``address`` names an existing cluster (``ray://host:10001`` or ``host:6379``); without it a
    local cluster is started on 127.0.0.1 for this call and stopped afterwards.
    """
    try:
        import ray
    except ImportError as e:
        raise RayEngineError("--engine ray needs the ray package: pip install 'rankscope[ray]'") from e
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
        task = ray.remote(_analyse_one)
        refs = [task.remote(store_root, p, config) for p in plan]
        for planned, ref in zip(plan, refs, strict=True):
            d, tables = ray.get(ref)
            yield planned, d, tables
    finally:
        if started:
            ray.shutdown()
