"""The straggler section: slowdown S, its causes and culprits, from compute, arrivals or flows."""

from rankscope.analysis.stragglers.config import StragglerConfig
from rankscope.analysis.stragglers.findings import findings_of
from rankscope.analysis.stragglers.section import analyze_stragglers, straggler_section

__all__ = ["StragglerConfig", "analyze_stragglers", "findings_of", "straggler_section"]
