"""Parallel groups (DP, PP, TP, EP) of one job from its collective records, and their comparison with flows."""

from rankscope.analysis.strategy.compare import compare_strategies
from rankscope.analysis.strategy.group_names import with_group_names
from rankscope.analysis.strategy.whitebox import infer_whitebox

__all__ = ["compare_strategies", "infer_whitebox", "with_group_names"]
