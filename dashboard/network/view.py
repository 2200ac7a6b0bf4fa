"""The network view of one job: the pair heatmaps and the placement tables, from a Diagnosis and its tables.

The heatmaps draw the analysis' full pair table (``tables["traffic_pairs"]``, every directed pair, see
analysis/network/matrix.py) on the topology it used (``tables["endpoints"]``) or, without it, the pairs the
report lists (and say so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from rankscope.analysis.report import to_json
from rankscope.dashboard.network.heatmaps import matrix_figures, pair_matrix
from rankscope.dashboard.network.tables import crossings_figure, placement_figure, proposal_figures
from rankscope.dashboard.table_figures import as_frame

if TYPE_CHECKING:
    from rankscope.analysis.report import Diagnosis


def _pair_source(d: Diagnosis, tables: dict) -> tuple[Any, str]:
    full = as_frame(tables.get("traffic_pairs"))
    if full is not None:
        return full, ""
    listed = [to_json(p) for p in d.traffic.pairs]
    return listed, (f"the {len(listed):,} listed pairs of {d.traffic.pairs_total:,} (others blank)"
                    if len(listed) < d.traffic.pairs_total else "")


def has_network(d: Diagnosis) -> bool:
    """The report has an evaluated traffic or placement section."""
    return any(getattr(getattr(d, s, None), "evaluated", False) for s in ("traffic", "placement"))


def network_figures(d: Diagnosis, tables: dict | None = None) -> dict[str, go.Figure]:
    """The network view of one job, keyed by name in page order; {} when neither the traffic nor the
    placement section is evaluated (a white-box job, or a capture without a strategy)."""
    if not has_network(d):
        return {}
    tables = tables or {}
    figs: dict[str, go.Figure] = {}
    traffic = getattr(d, "traffic", None)
    if traffic is not None and traffic.evaluated:
        pairs, note = _pair_source(d, tables)
        m = pair_matrix(pairs, tables.get("endpoints"))
        if m is not None:
            figs.update(matrix_figures(m, traffic.bytes_per, note))
    placement = getattr(d, "placement", None)
    if placement is not None and placement.evaluated:
        figs["placement"] = placement_figure(placement)
        figs["crossings"] = crossings_figure(placement)
        figs.update(proposal_figures(placement))
    return figs
