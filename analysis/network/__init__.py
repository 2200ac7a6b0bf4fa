"""Network view: a job's expected traffic from its strategy, against the traffic its flows show, on a topology."""

from rankscope.analysis.network.declared import declared_strategy, declared_traffic
from rankscope.analysis.network.expected import expected_traffic
from rankscope.analysis.network.matrix import pair_table
from rankscope.analysis.network.placement import placement_section
from rankscope.analysis.network.topology import Topology, infer_topology, read_topology
from rankscope.analysis.network.traffic import traffic_findings, traffic_section
from rankscope.analysis.network.view import network_view

__all__ = ["Topology", "declared_strategy", "declared_traffic", "expected_traffic", "infer_topology", "network_view", "pair_table", "placement_section", "read_topology",
           "traffic_findings", "traffic_section"]
