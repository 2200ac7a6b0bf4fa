"""Compare the white-box strategy (ranks) with the black-box one (addresses) of one job.

The endpoint_map turns each address into the rank behind it; then the DP
groups are compared as sets and the pipelines as ordered lists. Every
mismatch is reported: the flows may miss groups that never leave a host, and
the comm_op records may miss ranks whose traces are absent.
"""

from __future__ import annotations

import polars as pl

from rankscope.analysis.report.strategy import Comparison, Strategy


def compare_strategies(white: Strategy, black: Strategy, endpoint_map: pl.DataFrame) -> Comparison:
    """Disagreements between the two strategies.

    Needs endpoint_map columns address, rank. Returns the Comparison: whether they agree, the degrees
    side by side, the DP groups and pipelines found by only one side (as ranks), and unmapped addresses.
    """
    if endpoint_map is None or endpoint_map.is_empty() or "rank" not in endpoint_map.columns:
        return Comparison(evaluated=False, why="no endpoint_map to relate addresses to ranks")
    if not black.evaluated or not black.dp_groups:
        return Comparison(evaluated=False, why="flows gave no strategy")
    m = endpoint_map.filter(pl.col("rank").is_not_null()).unique("address", keep="first")
    rank_of = dict(zip(m["address"].to_list(), m["rank"].cast(pl.Int64).to_list()))
    unmapped = sorted({a for g in black.dp_groups + black.pp_groups for a in g if a not in rank_of})

    def as_ranks(groups):
        return [[rank_of[a] for a in g if a in rank_of] for g in groups]

    b_dp = {frozenset(g) for g in as_ranks(black.dp_groups) if g}
    w_dp = {frozenset(int(x) for x in g) for g in white.dp_groups}
    b_pp = {tuple(g) for g in as_ranks(black.pp_groups) if g}
    w_pp = {tuple(int(x) for x in g) for g in white.pp_groups}
    degrees = {k: {"white": getattr(white, k), "black": getattr(black, k)} for k in ("dp", "pp", "tp")}
    only = {"dp_groups_only_comm_op": sorted(sorted(g) for g in w_dp - b_dp),
            "dp_groups_only_flows": sorted(sorted(g) for g in b_dp - w_dp),
            "pipelines_only_comm_op": sorted(list(g) for g in w_pp - b_pp),
            "pipelines_only_flows": sorted(list(g) for g in b_pp - w_pp)}
    agree = (all(v["white"] == v["black"] for k, v in degrees.items() if k != "tp")
             and not any(only.values()))
    return Comparison(evaluated=True, degrees=degrees, unmapped_addresses=unmapped, agree=agree, **only)
