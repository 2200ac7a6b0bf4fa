"""The network view of one flow job: its traffic and placement sections from one topology and one pair table."""

from __future__ import annotations

import polars as pl

from rankscope.analysis.network.observed import observed_pairs
from rankscope.analysis.network.placement import placement_section
from rankscope.analysis.network.topology import Topology, infer_topology, payload_records
from rankscope.analysis.network.traffic import traffic_section


def network_view(strategy, job_flows: pl.DataFrame | None, steps: int, topology: Topology | None = None):
    """(traffic, placement, the topology used) of a flow job; (None, None, None) without flow records. Without
    a topology file the leaves come from the exporters (no pods: placement says what crosses leaves only)."""
    if job_flows is None or job_flows.is_empty():
        return None, None, None
    topo = topology or infer_topology(payload_records(job_flows))
    traffic = traffic_section(strategy, job_flows, steps, topo)
    return traffic, placement_section(strategy, observed_pairs(job_flows, max(steps, 1)), topo, job_flows, steps), topo
