"""One job's strategy and steps from its switch flow records alone (black-box)."""

from rankscope.analysis.strategy.flows.infer import FlowInference, infer_flows

__all__ = ["FlowInference", "infer_flows"]
