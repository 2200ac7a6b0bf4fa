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
    groups = found.select("_row", pl.col("group_ranks").alias("_g"), pl.col("group_id").alias("_gid"))
    out = rows.join(groups, on="_row", how="left")
    return out.with_columns(pl.coalesce("_g", "group_ranks").alias("group_ranks"),
                            pl.coalesce("_gid", "group_id").alias("group_id")).drop("_row", "_g", "_gid")
