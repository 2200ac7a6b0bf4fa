"""The straggler section's options and its verdict rule.

Verdict: ``none`` when S < none_below; otherwise the cause with the largest share, ``mixed`` when no cause
explains at least half of the slowdown. A cause also needs its own evidence (a link slow in every step, a
stage slower in every step), else it is set aside with why (:func:`evidenced_verdict`).
"""

from __future__ import annotations

from dataclasses import field

from rankscope.analysis.report.causes import CAUSES
from rankscope.analysis.whatif.metrics import MetricsConfig
from rankscope.analysis.whatif.sequence import SequenceConfig
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.record_class import record


@record
class StragglerConfig:
    none_below: float = 1.05
    """verdict ``none`` when S is below this."""
    explain_at_least: float = 0.5
    """a cause must explain this share of the slowdown, else the verdict is ``mixed``."""
    tie_margin: float = 0.1
    """shares this close to the largest are a tie, broken towards the more specific cause."""
    top_workers: int = 5
    """how many workers by S_w the report lists."""
    slow_worker_at: float = 1.2
    """a GPU whose compute is at least this times its stage peers' is a finding."""
    slow_link_at: float = 1.5
    """a rank whose transfers run at least this times their op type's typical is a finding."""
    slow_stage_at: float = 1.2
    """a stage whose forward/backward compute is at least this times the other stages' is a finding."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    sequence: SequenceConfig = field(default_factory=SequenceConfig)

    def __post_init__(self):
        if not self.none_below >= 1.0:
            raise ConfigError(f"none_below={self.none_below!r}; expected a slowdown >= 1.0")
        if not 0 < self.explain_at_least <= 1:
            raise ConfigError(f"explain_at_least={self.explain_at_least!r}; expected a share in (0, 1]")
        if not 0 <= self.tie_margin < 1:
            raise ConfigError(f"tie_margin={self.tie_margin!r}; expected a share in [0, 1)")
        if self.top_workers < 1:
            raise ConfigError(f"top_workers={self.top_workers!r}; expected a positive count")
        if not isinstance(self.metrics, MetricsConfig) or not isinstance(self.sequence, SequenceConfig):
            raise ConfigError("StragglerConfig: metrics and sequence must be MetricsConfig and SequenceConfig")


def verdict(S: float, shares: dict[str, float], config: StragglerConfig) -> str:
    """none / the cause with the largest share / mixed (pure; see module docstring).

    Shares are capped at 1; causes within ``tie_margin`` of the largest count as tied, and the most
    specific of them wins (CAUSES order): one slow worker also makes its whole stage slow, so
    fixing the stage explains it as well as fixing the worker, but the worker is the finding.
    """
    if not S >= config.none_below:
        return "none"
    # a share above 1 overshoots (the replay is not additive): it explains all, not more than all
    capped = {c: min(shares.get(c, 0.0), 1.0) for c in CAUSES}
    best = max(capped.values())
    if best < config.explain_at_least:
        return "mixed"
    return next(c for c in CAUSES if capped[c] >= best - config.tie_margin)


def evidenced_verdict(S: float, shares: dict[str, float], config: StragglerConfig,
                      lacking: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The verdict, where a cause also needs its own evidence: (verdict, {cause set aside: why}).

    A what-if share says how much fixing a cause would remove; on a busy host it also removes noise
    that no culprit explains (descheduled transfers scattered over ranks and steps; passes that run
    longer in some steps). ``lacking`` names the causes whose evidence is missing, with why; such a
    cause cannot be the verdict, which then comes from the other causes, and the section says so."""
    shares = dict(shares)
    aside: dict[str, str] = {}
    v = verdict(S, shares, config)
    while v in lacking and v not in aside:
        aside[v] = f"{v} explains {min(shares[v], 1.0):.0%} of the slowdown, but " + lacking[v]
        shares[v] = 0.0
        v = verdict(S, shares, config)
    return v, aside
