"""Process groups of collectives whose records do not name one (gloo under the PyTorch profiler).

torch's profiler writes ``c10d::allreduce_`` for a gloo collective with its
tensor but no process group, so a rank's TP and DP all-reduces look alike.
Two facts give the group back:

- a rank's calls of one stream (same op, same bytes: one gradient bucket, one
  layer's activation) are issued to one group, in the same order on every
  member, as many times per step on each;
- a collective ends on all its members at about the same time (nobody leaves
  before the last one arrives), while calls of the same shape in another
  group (another DP replica's TP group, say) end when *that* group finishes.

So for each stream of a rank and each group the rank declares it belongs to
(Kineto ``distributedInfo.pg_config``), the other members' streams of the
same key are paired call by call in order, and the group whose members end
closest together (median gap) wins. A stream whose best group is not clearly
closer than the next (``margin``) or whose peers do not have the same calls
stays unlabelled, and the notes say how many.

Without declared memberships (traces from before ``pg_config``, or stripped
of it), :mod:`rankscope.analysis.strategy.groups_from_timing` finds the groups from the
end times alone.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.collectors.record_class import record
from rankscope.collectors.schema import P2P_OPS


@record
class StreamConfig:
    margin: float = 0.5
    """the best group's median end gap must be at most this fraction of the runner-up's."""
    split_ratio: float = 3.0
    """timing clusters: the closest ranks of two groups must drift apart at least this many times more than
    the farthest members of one group do."""
    max_calls: int = 48
    """timing clusters: compare at most this many calls per stream (evenly spread), to bound the cost."""


def stream_end_times(coll: pl.DataFrame) -> dict[tuple, np.ndarray]:
    """(rank, op, size_bytes) -> end times in call order."""
    out = {}
    for (rank, op, size), g in coll.sort("start_ns").group_by("rank", "op", "size_bytes", maintain_order=True):
        out[(int(rank), op, size)] = g["end_ns"].to_numpy().astype(np.float64)
    return out


def _gap(streams: dict, key: tuple, members: list[int]) -> float:
    """Largest, over the other members, median |end gap| of paired calls; inf when a member lacks them."""
    rank, op, size = key
    mine = streams[key]
    worst = 0.0
    for q in members:
        if q == rank:
            continue
        theirs = streams.get((q, op, size))
        if theirs is None or len(theirs) != len(mine) or np.isnan(theirs).any():
            return float("inf")
        worst = max(worst, float(np.median(np.abs(theirs - mine))))
    return worst


def label_groups(comm_op: pl.DataFrame, memberships: dict[int, list[list[int]]],
                 config: StreamConfig | None = None) -> tuple[pl.DataFrame, dict]:
    """Fill ``group_ranks`` of collectives that lack it.

    Needs comm_op columns rank, op, group_ranks, size_bytes, start_ns, end_ns; ``memberships``
    maps a rank to the member lists of the groups it declares (world and singletons are fine).
    Returns (comm_op with group_ranks filled where decided, notes: streams labelled, undecided, and
    per group the median end gap in ns).
    """
    config = config or StreamConfig()
    if comm_op.is_empty() or not memberships:
        return comm_op, {}
    todo = (~pl.col("op").is_in(P2P_OPS)) & pl.col("group_ranks").is_null() & pl.col("end_ns").is_not_null()
    coll = comm_op.filter(todo)
    if coll.is_empty():
        return comm_op, {}
    streams = stream_end_times(coll)
    rows, undecided, gaps = [], [], {}
    for key in streams:
        cands = [sorted(g) for g in memberships.get(key[0], []) if len(g) > 1 and key[0] in g]
        scored = sorted((_gap(streams, key, g), g) for g in cands)
        scored = [s for s in scored if np.isfinite(s[0])]
        if not scored:
            undecided.append(key)
            continue
        if len(scored) > 1 and not scored[0][0] < config.margin * scored[1][0]:
            undecided.append(key)
            continue
        rows.append((key[0], key[1], key[2], scored[0][1]))
        gaps.setdefault(str(scored[0][1]), []).append(scored[0][0])
    notes = {"streams": len(streams), "labelled": len(rows), "undecided": len(undecided),
             "median_end_gap_ns": {g: float(np.median(v)) for g, v in gaps.items()}}
    if not rows:
        return comm_op, notes
    gr_type = comm_op.schema["group_ranks"]
    lab = pl.DataFrame(rows, schema={"rank": comm_op.schema["rank"], "op": pl.Utf8,
                                     "size_bytes": comm_op.schema["size_bytes"], "_g": pl.List(pl.Int64)},
                       orient="row").with_columns(pl.col("_g").cast(gr_type))
    out = comm_op.with_row_index("_i").join(lab, on=["rank", "op", "size_bytes"], how="left")
    out = out.with_columns(_hit=todo & pl.col("_g").is_not_null())
    out = out.with_columns(pl.when("_hit").then(pl.col("_g")).otherwise(pl.col("group_ranks")).alias("group_ranks"))
    return with_member_group_ids(out).sort("_i").drop("_i", "_g", "_hit"), notes


def with_member_group_ids(df: pl.DataFrame) -> pl.DataFrame:
    """Labelled rows without a group id get one named by the members, and their sequence number is
    recounted per group (the source counted the rank's calls over all its groups, so the n-th call
    of one member would otherwise meet the n-th call of another in a different group)."""
    if "group_id" not in df.columns or df.schema["group_id"] != pl.Utf8:
        return df
    df = df.with_columns(_hit=pl.col("_hit") & pl.col("group_id").is_null())
    name = pl.lit("members:") + pl.col("group_ranks").list.eval(pl.element().cast(pl.Utf8)).list.join(",")
    df = df.with_columns(pl.when(pl.col("_hit")).then(name).otherwise(pl.col("group_id")).alias("group_id"))
    if "seq" in df.columns:
        order = df.filter(pl.col("_hit")).sort("start_ns").select(
            "_i", _seq=(pl.col("_i").cum_count().over("rank", "group_id")).cast(df.schema["seq"]))
        df = df.join(order, on="_i", how="left").with_columns(pl.coalesce("_seq", "seq").alias("seq")).drop("_seq")
    return df


def memberships_from(declared: list[dict]) -> dict[int, list[list[int]]]:
    """rank -> declared group member lists, from JobFrames.declared entries with ``groups``."""
    out: dict[int, list[list[int]]] = {}
    for d in declared:
        for g in d.get("groups") or []:
            members = sorted({int(r) for r in g})
            for r in members:
                if members not in out.setdefault(r, []):
                    out[r].append(members)
    return out

