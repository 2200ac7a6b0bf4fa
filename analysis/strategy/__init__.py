"""Parallel groups (DP, PP, TP, EP) of one job from its collective records, and their comparison with flows."""
