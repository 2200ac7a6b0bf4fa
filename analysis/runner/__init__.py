"""Many jobs of a store: job plan, result cache, Ray (analysis, ingest). The only analysis code doing I/O."""

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

__all__ = ["PlannedJob", "RayIngest", "RayMapper", "ResultCache", "analyse_planned", "analyse_with_ray",
           "cached_analysis", "ingest_with_ray", "load_planned", "plan_jobs", "plan_with_ray", "ray_session",
           "result_key", "store_version", "why_no_jobs", "with_capture"]
