"""The runner package's names load their module when first read: an embedded run loads no Ray module."""

from __future__ import annotations

import json
import subprocess
import sys

RAY_SIDE = ("rankscope.analysis.runner.on_ray", "rankscope.analysis.runner.ingest_on_ray",
            "rankscope.analysis.runner.capture_split", "rankscope.collectors.ingest.staged", "ray")


def _loaded_after(code: str) -> dict:
    probe = code + f"\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {RAY_SIDE!r}}}))\n"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_plan_and_the_cache_load_without_the_ray_side():
    got = _loaded_after("from rankscope.analysis.runner import ResultCache, analyse_planned, cached_analysis, plan_jobs")
    assert not any(got.values()), got


def test_a_ray_name_loads_its_module_and_every_name_resolves():
    got = _loaded_after("from rankscope.analysis.runner import ray_session")
    assert got["rankscope.analysis.runner.on_ray"] and not got["rankscope.analysis.runner.ingest_on_ray"]
    import rankscope.analysis.runner as runner

    for name in runner.__all__:
        assert getattr(runner, name).__name__ == name
    assert set(runner.__all__) <= set(dir(runner))
