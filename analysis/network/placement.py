"""The report's ``placement`` section: where each traffic class's bytes go (in a leaf, across leaves of a
pod through a spine, across pods), which groups and pipelines span pods, and which pipeline links cross.

Shares are of the bytes the flows show on the strategy's own links (a pair that carries several classes,
where EP lies inside a DP ring, has its bytes split evenly between them).
"""

from __future__ import annotations

import polars as pl

from rankscope.analysis.network.expected import expected_traffic
from rankscope.analysis.network.topology import Topology
from rankscope.analysis.report.strategy import GroupSpan, PipelineCrossing, Placement, PlacementClass


def _class_bytes(pairs: pl.DataFrame) -> pl.DataFrame:
    """One row per (pair, class) with the class's share of the pair's observed bytes."""
    ex = pairs.filter(pl.col("classes").is_not_null()).explode("classes")
    return ex.with_columns((pl.col("observed").fill_null(0) / pl.col("classes_n")).alias("b"))


def _shares(rows: pl.DataFrame, leaf: dict, pod: dict, has_pods: bool) -> list[PlacementClass]:
    out = []
    for name in sorted(rows["classes"].unique().to_list()):
        c = rows.filter(pl.col("classes") == name)
        total = float(c["b"].sum())
        tally = {"leaf": 0.0, "spine": 0.0, "pod": 0.0}
        for a, b, x in c.select("src", "dst", "b").iter_rows():
            if has_pods and pod.get(a) != pod.get(b):
                tally["pod"] += x
            elif leaf.get(a) == leaf.get(b):
                tally["leaf"] += x
            else:
                tally["spine"] += x
        share = {k: (v / total if total > 0 else None) for k, v in tally.items()}
        out.append(PlacementClass(name=name, bytes_per_step=total, in_leaf=share["leaf"],
                                  across_leaves=share["spine"], across_pods=share["pod"] if has_pods else None))
    return out


def _spans(strategy, pod: dict) -> list[GroupSpan]:
    out = []
    for kind, groups in (("dp", strategy.dp_groups), ("ep", strategy.ep_groups or []),
                         ("pipeline", strategy.pp_groups)):
        for i, g in enumerate(groups):
            pods = sorted({pod[str(x)] for x in g if pod.get(str(x)) is not None})
            if len(g) > 1 and len(pods) > 1:
                out.append(GroupSpan(kind=kind, index=i, pods=pods))
    return out


def _crossings(strategy, pod: dict) -> list[PipelineCrossing]:
    out = []
    for i, p in enumerate(strategy.pp_groups if strategy.stage_order_known else []):
        for s, (a, b) in enumerate(zip(map(str, p), map(str, p[1:]))):
            if pod.get(a) is not None and pod.get(b) is not None and pod[a] != pod[b]:
                out.append(PipelineCrossing(pipeline=i, stage=s, src=a, dst=b, src_pod=pod[a], dst_pod=pod[b]))
    return out


def placement_section(strategy, observed: pl.DataFrame | None, topology: Topology | None) -> Placement | None:
    """``observed``: per pair src, dst, observed (bytes per step); None without flows (no section)."""
    if observed is None:
        return None
    exp = expected_traffic(strategy)
    if not exp:
        return Placement(evaluated=False, why="the strategy implies no traffic between endpoints")
    if topology is None or not topology.rows:
        return Placement(evaluated=False, why="no topology")
    leaf, pod = topology.leaf_of(), topology.column("pod")
    has_pods = any(v is not None for v in pod.values())
    ends = {x for pair in exp for x in pair}
    pairs = pl.DataFrame([{"src": a, "dst": b, "classes": sorted(c), "classes_n": len(c)} for (a, b), c in exp.items()],
                         schema={"src": pl.Utf8, "dst": pl.Utf8, "classes": pl.List(pl.Utf8), "classes_n": pl.Int64})
    pairs = pairs.join(observed.select("src", "dst", "observed"), on=["src", "dst"], how="left")
    return Placement(evaluated=True, topology=topology.source,
                     classes=_shares(_class_bytes(pairs), leaf, pod, has_pods),
                     groups_across_pods=_spans(strategy, pod) if has_pods else [],
                     pipeline_links_across_pods=_crossings(strategy, pod) if has_pods else [],
                     unplaced=sum(1 for x in ends if leaf.get(x) is None))
