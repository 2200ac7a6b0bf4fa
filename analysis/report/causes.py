"""The causes a straggler verdict can name: one registry, from which the verdict names derive.

Each Cause reads its share of the slowdown (what fixing it alone removes) from
the what-if results of one job, and names the finding kind that carries its
culprit. Order is specificity: a slow worker also makes its stage slow, so on a
tie the worker is the finding.
"""

from __future__ import annotations

from collections.abc import Callable

from rankscope.collectors.record_class import record


@record
class Cause:
    name: str
    """the verdict name (report contract)."""
    fn: Callable[[dict], float]
    """what-if results of one job -> the share of its slowdown that fixing this cause alone removes."""
    finding: str
    """the finding kind that names this cause's culprit."""


REGISTRY: tuple[Cause, ...] = (
    Cause("worker", lambda r: r["worker"], "slow_worker"),
    Cause("communication", lambda r: r["communication"], "slow_link"),
    Cause("sequence_imbalance", lambda r: r["sequence_imbalance"], "sequence_imbalance"),
    Cause("stage_imbalance", lambda r: r["stage_imbalance"], "slow_stage"),
)

CAUSES = tuple(c.name for c in REGISTRY)
"""the verdict's causes, most specific first (a worker, a link, the batches, a whole stage)."""
FINDING_OF = {c.name: c.finding for c in REGISTRY}


def cause_shares(results: dict) -> dict[str, float]:
    """Every registered cause's share, from one job's what-if results."""
    return {c.name: float(c.fn(results)) for c in REGISTRY}
