"""Network view: a job's expected traffic from its strategy, against the traffic its flows show, on a topology."""

from rankscope.analysis.network.expected import expected_traffic
from rankscope.analysis.network.topology import Topology, infer_topology, read_topology
from rankscope.analysis.network.traffic import traffic_findings, traffic_section

__all__ = ["Topology", "expected_traffic", "infer_topology", "read_topology", "traffic_findings", "traffic_section"]
