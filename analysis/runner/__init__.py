"""Many jobs of a store: job plan, result cache, Ray (analysis, ingest). The only analysis code doing I/O.

The names below load their module when first read (PEP 562): an embedded run needs the plan and the cache, not
the Ray modules and the flow decoders the Ray ingest brings (~5 ms of a small trace's start-up)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_MODULE_OF = {
    "ResultCache": "cache", "cached_analysis": "cache", "result_key": "cache", "store_version": "cache",
    "RayIngest": "ingest_on_ray", "ingest_with_ray": "ingest_on_ray",
    "RayMapper": "on_ray", "analyse_with_ray": "on_ray", "plan_with_ray": "on_ray", "ray_session": "on_ray",
    "PlannedJob": "plan", "analyse_planned": "plan", "load_planned": "plan", "plan_jobs": "plan",
    "why_no_jobs": "plan", "with_capture": "plan",
}

__all__ = ["PlannedJob", "RayIngest", "RayMapper", "ResultCache", "analyse_planned", "analyse_with_ray",
           "cached_analysis", "ingest_with_ray", "load_planned", "plan_jobs", "plan_with_ray", "ray_session",
           "result_key", "store_version", "why_no_jobs", "with_capture"]

if TYPE_CHECKING:
    from rankscope.analysis.runner.cache import ResultCache, cached_analysis, result_key, store_version
    from rankscope.analysis.runner.ingest_on_ray import RayIngest, ingest_with_ray
    from rankscope.analysis.runner.on_ray import RayMapper, analyse_with_ray, plan_with_ray, ray_session
    from rankscope.analysis.runner.plan import (
        PlannedJob,
        analyse_planned,
        load_planned,
        plan_jobs,
        why_no_jobs,
        with_capture,
    )


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
