"""The Diagnosis: everything rankscope concluded about one job, one object for CLI, dashboard and notebooks.

It serialises to the report contract ``shared/contracts/report.schema.json``
(required keys are always present; sections add keys freely). Each section is
filled by its analysis (strategy and steps: issue 7; stragglers: issue 8;
regressions and hangs: issue 9); a section that could not be computed keeps
its defaults and says so with ``evaluated: false``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from rankscope.collectors.job_frames import JobFrames  # noqa: F401  (re-exported)

VERDICTS = ("none", "worker", "stage_imbalance", "sequence_imbalance", "communication", "mixed")


@dataclass
class Strategy:
    world_size: int = 0
    dp: int = 1
    pp: int = 1
    tp: int | None = None
    dp_groups: list[list] = field(default_factory=list)
    pp_groups: list[list] = field(default_factory=list)
    confidence: float = 0.0
    ep: int | None = None
    cp: int | None = None
    tp_groups: list[list] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Steps:
    count: int = 0
    median_ns: float = 0.0
    boundaries_ns: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Stragglers:
    slowdown: float = 1.0
    verdict: str = "none"
    by_cause: dict[str, float] = field(default_factory=dict)
    top_workers: list[dict] = field(default_factory=list)
    waste_fraction: float = 0.0
    by_optype: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Diagnosis:
    job: str
    sources: list[str] = field(default_factory=list)
    strategy: Strategy = field(default_factory=Strategy)
    steps: Steps = field(default_factory=Steps)
    stragglers: Stragglers = field(default_factory=Stragglers)
    regressions: list[dict] = field(default_factory=list)
    hangs: list[dict] = field(default_factory=list)
    data_quality: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The report JSON object: each section's ``extra`` keys are merged into the section."""
        d = {}
        # _fields_plain, not dataclasses.asdict: asdict deep-copies every leaf, and jsonable below copies
        # the containers again (a 4,096-rank report has ~170k objects)
        for key, value in _fields_plain(self).items():
            if isinstance(value, dict) and "extra" in value:
                extra = value.pop("extra")
                value.update(extra)
            d[key] = value
        top_extra = d.pop("extra")
        d.update(top_extra)
        return jsonable(d)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def _fields_plain(x):
    """Dataclasses to dicts of their fields, recursively through dicts, lists and tuples (as ``asdict``,
    without copying the leaves; tuples become lists, which jsonable does anyway)."""
    if is_dataclass(x) and not isinstance(x, type):
        return {f.name: _fields_plain(getattr(x, f.name)) for f in fields(x)}
    if isinstance(x, dict):
        return {k: _fields_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_fields_plain(v) for v in x]
    return x


def jsonable(x):
    """Plain JSON types: numpy scalars to Python, NaN/inf to None."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


_jsonable = jsonable  # the old private name, for callers not yet moved
