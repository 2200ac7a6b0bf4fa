"""The straggler section: slowdown S, its causes and culprits, from compute, arrivals or flows."""
