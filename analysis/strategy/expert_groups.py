"""Expert parallelism from comm_op records (white-box): the groups that run ``all_to_all``.

Mixture-of-Experts layers dispatch tokens to their experts and combine the
results with an ``all_to_all`` among the members of an expert-parallel (EP)
group, in every MoE layer of every microbatch, forward and backward. Whatever
the source (the live hooks, Kineto, the flight recorder, NCCL's own logs), the
importers name that op ``all_to_all``, so the family of disjoint groups that
runs it is the EP family, and its group size is ``ep``.

Megatron carves the EP groups out of data parallelism: each DP group holds
whole EP groups, and the experts' gradients are reduced over the
*expert-data-parallel* groups instead of the whole DP group: one member of
each EP group of one DP group. That family runs once per step, like data
parallelism, and is no parallel dimension of its own; told apart here, it is
neither taken for the DP family nor for the TP family.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.strategy.groups_from_timing import label_groups_by_timing


def expert_families(a2a: list[dict], others: list[dict]) -> tuple[dict | None, dict | None]:
    """(the EP family, the expert-data-parallel family), each None when absent.

    ``a2a``: the families of disjoint same-size groups of the ``all_to_all`` records, ``others``: those
    of the other collectives (dicts with ``size``, ``groups``, ``covered``, ``calls``), as the white-box
    strategy builds them. The EP family is the all_to_all family that covers the most ranks (then the
    busiest); the expert-DP family is one of ``others`` whose every group lies inside one group of a
    larger family holding whole EP groups (the DP family), has one member per EP group at most, and
    whose size times ``ep`` is that DP group's size.
    """
    if not a2a:
        return None, None
    ep = max(a2a, key=lambda f: (f["covered"], f["calls"]))
    ep_of = {m: i for i, g in enumerate(ep["groups"]) for m in g}
    for dense in others:
        if dense["size"] <= ep["size"] or not _holds_whole(dense["groups"], ep["groups"]):
            continue
        dp_of = {m: i for i, g in enumerate(dense["groups"]) for m in g}
        for f in others:
            if f is dense or f["size"] * ep["size"] != dense["size"]:
                continue
            if all(len({dp_of.get(m, -1 - m) for m in g}) == 1 and len({ep_of.get(m, -1 - m) for m in g}) == len(g)
                   for g in f["groups"]):
                return ep, f
    return ep, None


def _holds_whole(outer: list[list], inner: list[list]) -> bool:
    """Whether every group of ``inner`` lies inside one group of ``outer``."""
    of = {m: i for i, g in enumerate(outer) for m in g}
    return all(len({of.get(m, -1 - m) for m in g}) == 1 for g in inner)


def note_expert_dp(family: dict) -> str:
    return (f"expert gradients reduced over {len(family['groups'])} expert-data-parallel group(s) of "
            f"{family['size']} (one member per EP group inside each DP group): not a parallel dimension")


def all_to_all_groups_by_timing(comm_op: pl.DataFrame) -> pl.DataFrame:
    """comm_op with the groups of all_to_all records that name none (Kineto of gloo jobs) found from their
    end times (strategy.groups_from_timing). A token dispatch moves as many bytes as routing sends that
    microbatch, so a rank's all_to_all calls are one stream whatever their sizes; members of one EP group
    still leave each call together. Needs comm_op rank, op, group_ranks, size_bytes, start_ns, end_ns."""
    todo = (pl.col("op") == "all_to_all") & pl.col("group_ranks").is_null() & pl.col("end_ns").is_not_null()
    if comm_op.is_empty() or not comm_op.select(todo.any()).item():
        return comm_op
    rows = comm_op.with_row_index("_row")
    part = rows.filter(todo)
    found, _ = label_groups_by_timing(part.with_columns(pl.lit(0, comm_op.schema["size_bytes"]).alias("size_bytes")))
    if found["group_ranks"].is_null().all():
        found = _by_launch_drift(part)
    groups = found.select("_row", pl.col("group_ranks").alias("_g"), pl.col("group_id").alias("_gid"))
    out = rows.join(groups, on="_row", how="left")
    return out.with_columns(pl.coalesce("_g", "group_ranks").alias("group_ranks"),
                            pl.coalesce("_gid", "group_id").alias("group_id")).drop("_row", "_g", "_gid")


SPLIT_RATIO = 3.0
"""EP groups from launch times are kept only when the drift between groups is this many times the drift
inside them."""


def _by_launch_drift(part: pl.DataFrame) -> pl.DataFrame:
    """``part`` (all_to_all records without a group, with ``_row``) with group_ranks and group_id from the
    drift of the ranks' call times, where the end-time rule cannot: gloo's Kineto records time the call's
    launch on the CPU (the exchange runs on a worker thread), so members of one EP group leave their
    calls milliseconds apart, longer than the recorded call. Paired call by call (ranks with as many
    calls), members of one group still move together step after step, while two EP groups drift apart
    by their own microbatches (the n-th calls of one group's members are one exchange: a collective's
    members issue its calls in one order). A split into equal groups is kept when the drift between
    groups is SPLIT_RATIO times the drift inside; else nothing is labelled."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    out = part.with_columns(pl.lit(None, part.schema["group_ranks"]).alias("group_ranks"),
                            pl.lit(None, pl.Utf8).alias("group_id"))
    per = {int(r): g.sort("start_ns") for (r,), g in part.group_by("rank")}
    counts = {r: g.height for r, g in per.items()}
    labelled: dict[int, list[int]] = {}
    for n_calls in sorted(set(counts.values())):
        ranks = sorted(r for r, c in counts.items() if c == n_calls)
        if len(ranks) < 4 or n_calls < 3:
            continue
        t = np.array([per[r]["start_ns"].to_numpy() for r in ranks], dtype=np.float64)
        t -= t.min()
        d = t[:, None, :] - t[None, :, :]
        drift = np.median(np.abs(d - np.median(d, axis=2, keepdims=True)), axis=2)
        z = linkage(squareform(drift, checks=False), "complete")
        best, best_score = None, 0.0
        for size in (s for s in range(2, len(ranks) // 2 + 1) if len(ranks) % s == 0):
            k = len(ranks) // size
            inside, between = z[len(ranks) - k - 1, 2], z[len(ranks) - k, 2]
            lab = fcluster(z, k, "maxclust")
            score = between / max(inside, 1.0)
            if score > best_score and (np.bincount(lab)[1:] == size).all():
                best, best_score = lab, score
        if best is not None and best_score >= SPLIT_RATIO:
            for lab in np.unique(best):
                members = [ranks[i] for i in np.flatnonzero(best == lab)]
                labelled.update({r: members for r in members})
    if not labelled:
        return out
    g = pl.DataFrame({"rank": list(labelled), "_m": [labelled[r] for r in labelled]},
                     schema={"rank": part.schema["rank"], "_m": part.schema["group_ranks"]})
    return out.join(g, on="rank", how="left").with_columns(
        pl.col("_m").alias("group_ranks"),
        pl.when(pl.col("_m").is_not_null()).then(pl.lit("a2a") + pl.col("_m").list.first().cast(pl.Utf8))
        .alias("group_id")).drop("_m")
