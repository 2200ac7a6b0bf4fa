"""Communication what-if: every transfer at the median of its op type, compute as it was.

Separates a slow network (a slow link, congestion) from slow compute: the
share of the slowdown that goes away when only transfers are made typical,
M_comm = (T - T_comm) / (T - T_ideal), with evidence naming the ranks whose
transfers are slowest relative to their op type's median.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.whatif.graph import WhatIfGraph
from rankscope.analysis.whatif.scenarios import Scenarios, step_times


def comm_whatif(graph: WhatIfGraph, actual: np.ndarray, ideal: np.ndarray, T: float, T_ideal: float,
                top: int = 3) -> dict:
    """Share of the slowdown explained by communication transfer times.

    Needs graph.ops columns rank, optype, comm; ``actual``/``ideal`` per-op
    replay durations. Returns {share, t_fixed, ranks: [{rank, transfer_ratio}], factor}.
    """
    comm = graph.ops["comm"].to_numpy()
    if not comm.any():
        return {"share": 0.0, "t_fixed": T, "ranks": [], "factor": 1.0, "evaluated": False}
    sc = Scenarios(comm.astype(np.int64), np.array([[False, True]]), np.array([True]))
    t_fixed = float(step_times(graph, actual, ideal, sc)[:, 0].mean())
    gap = T - T_ideal
    share = (T - t_fixed) / gap if gap > 0 else 0.0
    # evidence: per rank, median of actual / typical transfer time over its communication ops
    ratio = pl.DataFrame({"rank": graph.ops["rank"], "a": actual, "i": ideal, "comm": comm}).filter(
        pl.col("comm") & (pl.col("i") > 0)).group_by("rank").agg(
        (pl.col("a") / pl.col("i")).median().alias("transfer_ratio")).sort(
        ["transfer_ratio", "rank"], descending=[True, False])  # ties (all 1.0 on a healthy job): lowest rank, every run
    ranks = ratio.head(top).to_dicts()
    factor = float(ranks[0]["transfer_ratio"]) if ranks else 1.0
    return {"share": float(share), "t_fixed": t_fixed, "ranks": ranks, "factor": factor, "evaluated": True}
