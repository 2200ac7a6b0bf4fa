"""The full pair table behind the ``traffic`` section, before it is trimmed to the listed pairs.

The report lists the pairs that are not ok and the costliest ok ones (``Traffic.listed``); a pair-matrix
view of the whole job (the dashboard's heatmaps) needs every pair. :func:`pair_table` returns them from
:func:`rankscope.analysis.network.traffic.pair_frame`, the frame the section trims, so each listed pair is
the same row here.
"""

from __future__ import annotations

import polars as pl

from rankscope.analysis.network.expected import expected_traffic
from rankscope.analysis.network.topology import Topology, infer_topology
from rankscope.analysis.network.traffic import pair_frame

COLUMNS = ("src", "dst", "classes", "expected", "observed", "ratio", "kind", "within_error", "rate", "peer_rate",
           "rel_error", "model_error", "cost_ns", "exporters")
"""the columns of :func:`pair_table`, as the section's ``TrafficPair`` names them."""


def pair_table(strategy, job_flows: pl.DataFrame | None, steps: int,
               topology: Topology | None = None) -> tuple[pl.DataFrame, Topology] | None:
    """(every pair, the topology used) of a flow job; None where the traffic section is absent or not
    evaluated (no flow records, or a strategy that implies no traffic).

    ``job_flows``: the job's records with ``est_bytes`` and ``is_data`` (``JobModel.flows.inference.job_flows``);
    ``steps``: the job's step count (0: bytes per capture). Returns one row per directed pair, columns
    :data:`COLUMNS` (expected, observed and cost in bytes / ns per step, as the section has them), ordered as the
    section orders its pairs (not ok first, then by ``cost_ns``); unexpected pairs below the listing floor
    (set-up chatter) are left out, as the section leaves them out.
    """
    if job_flows is None or job_flows.is_empty() or not strategy.evaluated or not expected_traffic(strategy):
        return None
    data = job_flows.filter(pl.col("is_data"))
    topo = topology or infer_topology(data)
    j = pair_frame(strategy, job_flows, steps, topo)
    return j.with_columns(pl.col("classes").fill_null([]), pl.col("exporters").fill_null([])).select(COLUMNS), topo
