"""The report's ``placement`` section: where each traffic class's bytes go (in a leaf, across leaves of a
pod through a spine, across pods), which groups and pipelines span pods, and which pipeline links cross.

Shares are of the bytes the flows show on the strategy's own links (a pair that carries several classes,
where EP lies inside a DP ring, has its bytes split evenly between them).
"""

from __future__ import annotations

import polars as pl

from rankscope.analysis.network import proposal as pr
from rankscope.analysis.network.expected import expected_traffic, expert_dp_groups
from rankscope.analysis.network.topology import Topology
from rankscope.analysis.report.strategy import (
    EndpointMove,
    GroupSpan,
    PipelineCrossing,
    Placement,
    PlacementClass,
    PlacementProposal,
)


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


def placement_section(strategy, observed: pl.DataFrame | None, topology: Topology | None,
                      job_flows: pl.DataFrame | None = None, steps: int = 0) -> Placement | None:
    """``observed``: per pair src, dst, observed (bytes per step); None without flows (no section).
    ``job_flows`` (the job's records, is_data and est_bytes where known) and ``steps``: for the proposal
    (:mod:`proposal`); without them there is none."""
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
                     unplaced=sum(1 for x in ends if leaf.get(x) is None),
                     proposal=None if job_flows is None else _proposal(strategy, pairs, topology, job_flows, steps))


def _units(strategy, pairs: pl.DataFrame) -> dict[tuple, tuple]:
    """(src, dst) -> (family, unit): a ring's links are paced by the group (its slowest link), a pipeline link
    by itself."""
    group = {}
    for kind, groups in (("dp", strategy.dp_groups or []), ("ep", strategy.ep_groups or []),
                         ("expert_dp", expert_dp_groups(strategy.dp_groups or [], strategy.ep_groups or []))):
        for i, g in enumerate(groups):
            for x in g:
                group[(kind, str(x))] = (kind, i)
    out = {}
    for a, b, classes in pairs.select("src", "dst", "classes").iter_rows():
        for k in ("dp", "ep", "expert_dp"):
            if k in classes and (k, a) in group:
                out[(a, b)] = ("group", group[(k, a)])
                break
        else:
            out[(a, b)] = ("pipeline", ("link",) + tuple(sorted((a, b))))
    return out


def _crossing(units: dict[tuple, tuple], strategy, pod: dict) -> dict[tuple, bool]:
    """unit -> whether it spans pods under ``pod``."""
    groups = {"dp": strategy.dp_groups or [], "ep": strategy.ep_groups or [],
              "expert_dp": expert_dp_groups(strategy.dp_groups or [], strategy.ep_groups or [])}
    out = {}
    for _, u in units.values():
        if u[0] == "link":
            out[u] = pod.get(u[1]) != pod.get(u[2])
        else:
            out[u] = len({pod.get(str(x)) for x in groups[u[0]][u[1]]}) > 1
    return out


def _proposal(strategy, pairs: pl.DataFrame, topology: Topology, job_flows: pl.DataFrame, steps: int
              ) -> PlacementProposal:
    """The local search's mapping and its replayed step time (:mod:`rankscope.analysis.network.proposal`)."""
    leaf, pod, host = topology.leaf_of(), topology.column("pod"), topology.column("host")
    if not any(v is not None for v in pod.values()):
        return PlacementProposal(evaluated=False, why="the topology has no pods")
    ends = {x for x in pairs["src"].to_list() + pairs["dst"].to_list()}
    units = pr.host_units(topology, ends)
    pod_of_host = {h: pod.get(es[0]) for h, es in units.items()}
    if len(set(pod_of_host.values())) < 2:
        return PlacementProposal(evaluated=False, why="the job's hosts sit in one pod: nothing crosses pods")
    bytes_ = {(a, b): float(x or 0.0) for a, b, x in pairs.select("src", "dst", "observed").iter_rows()}
    found = pr.local_search(units, pod_of_host, bytes_)
    if not found.moves or found.cross_after >= found.cross_before:
        return PlacementProposal(evaluated=False, why="no swap of the job's hosts cuts its cross-pod bytes "
                                                      f"({found.cross_before:.3g} bytes per step today)")
    new_leaf = {**leaf, **{e: leaf.get(t) for e, t in found.moves.items()}}
    new_pod = {**pod, **{e: pod.get(t) for e, t in found.moves.items()}}
    unit_of = _units(strategy, pairs)
    base = dict(method=pr.__doc__.split("\n\n")[0].replace("\n", " "),
                moves=[EndpointMove(endpoint=e, host=host[e], proposed_host=host[t], takes_place_of=t)
                       for e, t in sorted(found.moves.items())],
                hosts_moved=len({host[e] for e in found.moves}), across_pods_bytes=found.cross_before,
                proposed_across_pods_bytes=found.cross_after,
                reduction=1 - found.cross_after / found.cross_before if found.cross_before else None,
                classes=_shares(_class_bytes(pairs), new_leaf, new_pod, True))
    try:
        p = pr.predict(job_flows, unit_of, _crossing(unit_of, strategy, pod), _crossing(unit_of, strategy, new_pod),
                       steps)
    except pr.NoReplay as e:
        return PlacementProposal(evaluated=False, why=f"no replayable graph: {e}", **base)
    gain = 1 - p["step_proposed_ns"] / p["step_now_ns"] if p["step_now_ns"] else None
    return PlacementProposal(evaluated=True, **base, step_ns=p["step_now_ns"], proposed_step_ns=p["step_proposed_ns"],
                             gain=gain, rate_in_pod=p["rate_in_pod"], rate_across_pods=p["rate_across_pods"],
                             transfers_changed=p["transfers_changed"])
