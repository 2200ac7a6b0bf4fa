"""The network view's figures: the pair matrix heatmaps and the placement tables of a flow job."""

from rankscope.dashboard.network.heatmaps import MAX_GROUPS, MAX_SIDE, PairMatrix, matrix_figures, pair_matrix
from rankscope.dashboard.network.tables import crossings_figure, placement_figure, proposal_figures
from rankscope.dashboard.network.view import has_network, network_figures

__all__ = ["MAX_GROUPS", "MAX_SIDE", "PairMatrix", "crossings_figure", "has_network", "matrix_figures",
           "network_figures", "pair_matrix", "placement_figure", "proposal_figures"]
