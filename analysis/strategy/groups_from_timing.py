"""Process groups of collectives from their end times alone, when no membership is declared.

Kineto traces of gloo jobs from before ``distributedInfo.pg_config`` (or with
it stripped) name no group for a collective. Members of one group leave each
call together, a constant clock offset apart; ranks of two groups drift apart
by their own jitter. So the ranks that share a stream key (op, bytes, calls)
are clustered on that drift, and the answers are checked against a grid: two
dimensions never share a group, and a dimension's group meets another's at
most once. What the drift cannot decide stays unlabelled, with the reason.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.strategy.groups_from_streams import (
    StreamConfig,
    stream_end_times,
    with_member_group_ids,
)
from rankscope.collectors.schema import P2P_OPS


def _drift(rows: np.ndarray) -> np.ndarray:
    """Pairwise drift of ranks' end times: median over calls of |d - median(d)|, d the pair's end gaps.

    A constant clock offset between two hosts cancels (it is the median gap), so ranks on clocks that
    are milliseconds apart still read 0 when they leave every call together.
    """
    n = len(rows)
    out = np.zeros((n, n))
    for i in range(n - 1):
        d = rows[i + 1:] - rows[i]
        d = d - np.median(d, axis=1, keepdims=True)
        out[i, i + 1:] = out[i + 1:, i] = np.median(np.abs(d), axis=1)
    return out


def _resolution_ns(ends: np.ndarray) -> float:
    """The clock's tick as the records show it (1 ns .. 1 ms): drift below it is no evidence."""
    v = ends[np.isfinite(ends)].astype(np.int64)
    tick = 1
    while tick < 1_000_000 and v.size and not np.any(v % (tick * 10)):
        tick *= 10
    return float(tick)


def _cluster(drift: np.ndarray, duration_ns: float, floor_ns: float, ratio: float) -> tuple[list | None, str]:
    """Equal-size groups of ranks (indices) from a drift matrix: (groups, how) or (None, why not).

    Complete linkage: a cut into k groups of one size is kept (how = ``split``) when the next merge is
    ``ratio`` times the largest merge inside the groups. With no such cut the ranks are one group
    (how = ``one``) if they drift apart by less than one call's duration (members of a collective
    cannot: each leaves after the last one arrived), else undecided.
    """
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    n = len(drift)
    if n < 2:
        return None, "one rank"
    z = linkage(squareform(drift, checks=False), "complete")
    h = z[:, 2]
    best, best_score = None, 0.0
    for size in range(2, n // 2 + 1):
        if n % size:
            continue
        k = n // size
        inside = h[n - k - 1]
        score = h[n - k] / max(inside, floor_ns)
        if score <= best_score or inside > duration_ns:
            continue
        labels = fcluster(z, k, "maxclust")
        if len(set(labels)) == k and (np.bincount(labels)[1:] == size).all():
            best, best_score = labels, score
    if best is not None and best_score >= ratio:
        return [list(np.flatnonzero(best == lab)) for lab in np.unique(best)], "split"
    if h[-1] <= max(duration_ns, floor_ns):
        return [list(range(n))], "one"
    return None, f"no split {ratio:g}x clearer than the drift inside (best {best_score:.1f}x)"


def _one_clock_agrees(mat: np.ndarray, ranks: list, groups: list, host_of: dict, duration_ns: float) -> bool:
    """Members that share a host read one clock, so there their end times must meet, not only drift alike:
    two groups running in lockstep a constant phase apart look like one group to the drift alone."""
    for g in groups:
        by_host: dict = {}
        for i in g:
            if host_of.get(ranks[i]) is not None:
                by_host.setdefault(host_of[ranks[i]], []).append(i)
        for idx in by_host.values():
            gaps = np.median(np.abs(mat[idx] - mat[idx[0]]), axis=1)
            if gaps.max() > duration_ns:
                return False
    return True


def _decide(streams: dict, dur_of: dict, floor: float, config: StreamConfig,
            host_of: dict | None = None, overlap_of: dict | None = None,
            named: list[set] | None = None) -> tuple[list, dict]:
    """(rank, op, size, members) per decided stream, and {key: why} for the undecided ones.

    Keys with the same ranks and call count (a stage's gradient buckets) are clustered together: more
    calls, the same groups. A one-group answer that holds two members of a group another key split
    off clearly is a contradiction (a grid's groups of two dimensions share one rank), so undecided;
    so is an answer that holds part of a group the records already name (``named``), see
    :func:`_clashes_named`.
    """
    host_of, overlap_of, named = host_of or {}, overlap_of or {}, named or []
    by_key: dict[tuple, list[int]] = {}
    for (rank, op, size), ends in streams.items():
        by_key.setdefault((op, size, len(ends)), []).append(rank)
    undecided, overlapping = {}, []
    for (op, size, calls), ranks in list(by_key.items()):
        # one group runs its calls one after another: a stream whose calls overlap is on a clock that
        # restarts (relative time per step) or mixes groups, and its ends cannot be paired
        if any(overlap_of.get((r, op, size), 0.0) > 0.1 for r in ranks):
            undecided[f"{op}:{size}:{calls}"] = "calls of one stream overlap in time"
            del by_key[(op, size, calls)]
            # still a stream at its rate over these ranks, with no groups: the grid checks count it
            overlapping.append({"keys": [(op, size)], "calls": calls, "ranks": sorted(ranks), "groups": None,
                                "how": "overlap"})
    by_set: dict[tuple, list[tuple]] = {}
    for (op, size, calls), ranks in by_key.items():
        by_set.setdefault((calls, tuple(sorted(ranks))), []).append((op, size))
    sets = []
    for (calls, ranks), keys in sorted(by_set.items(), key=str):
        cols = np.unique(np.linspace(0, calls - 1, min(calls, config.max_calls)).round().astype(int))
        mat = np.stack([np.concatenate([streams[(r, op, size)][cols] for op, size in keys]) for r in ranks])
        duration = float(np.median([dur_of[(r, op, size)] for r in ranks for op, size in keys]))
        drift = _drift(mat)
        groups, how = _cluster(drift, duration, floor, config.split_ratio)
        if groups is not None and not _one_clock_agrees(mat, list(ranks), groups, host_of, duration):
            groups, how = None, "members on one host's clock end more than a call apart"
        sets.append({"keys": keys, "calls": calls, "ranks": list(ranks), "mat": mat, "drift": drift,
                     "duration": duration, "groups": groups, "how": how})
    sets += overlapping
    changed = True
    while changed:  # each demotion may expose another, until the answers agree with a grid
        lone = [st for st in sets if st["how"] == "one" and _rate_twin_unsplit(st, sets)]
        coarse = [st for st in sets if st["how"] == "split" and _swallows_unsplit(st, sets)]
        echo = [st for st in sets if st["how"] == "split" and _echoes_busier(st, sets)]
        clash = [st for st in sets if st["how"] in ("split", "one")
                 and _clashes_named([[st["ranks"][i] for i in g] for g in st["groups"]], named)]
        for st in clash:
            st["groups"], st["how"] = None, _WHY_CLASH
        for st in lone:
            st["groups"], st["how"] = None, "a stream at another rate over these ranks does not split either"
        for st in coarse:
            st["groups"], st["how"] = None, "a group holds every rank of a stream at another rate with no split"
        for st in echo:
            st["groups"], st["how"] = None, "its groups are those of a busier stream (concurrent, not shared)"
        changed = bool(lone or coarse or echo or clash)
    split = [set(s["ranks"][i] for i in g) for s in sets if s["how"] == "split" for g in s["groups"]]
    rows = []
    for st in sets:
        if st["how"] == "overlap":
            continue
        groups, how, ranks = st["groups"], st["how"], st["ranks"]
        if how == "one" and any(len(h & set(ranks)) >= 2 and h != set(ranks) for h in split):
            groups, how = None, "one group would hold two members of a clearer group"
        if groups is None:
            # the grid may still decide: one member from each group that another key split off clearly
            groups, why = _across(st, split, floor, config.split_ratio)
            if groups is not None and not _one_clock_agrees(st["mat"], ranks, groups, host_of, st["duration"]):
                groups, why = None, "members on one host's clock end more than a call apart"
            if groups is not None and _clashes_named([[ranks[i] for i in g] for g in groups], named):
                groups, why = None, _WHY_CLASH
            if groups is None:
                undecided.update({f"{op}:{size}:{st['calls']}": f"{how}; {why}" for op, size in st["keys"]})
                continue
        rows.extend((ranks[i], op, size, [ranks[k] for k in g]) for op, size in st["keys"]
                    for g in groups for i in g)
    return rows, undecided


_WHY_CLASH = "a group would hold two or more members of a group the records name, and ranks outside it"


def _named_groups(comm_op: pl.DataFrame) -> list[set]:
    """The distinct member sets (two or more ranks) of the collectives whose records already name them:
    declared by the source, or matched to a rank's declared memberships before the end times are read."""
    named = comm_op.lazy().filter(~pl.col("op").is_in(P2P_OPS) & pl.col("group_ranks").is_not_null())
    if "group_id" in comm_op.columns:
        # a row per group and rank before the lists are compared: on a large job they repeat on every call
        has_id = pl.col("group_id").is_not_null()
        named = pl.concat([named.filter(has_id).unique(subset=["group_id", "rank"], keep="any"),
                           named.filter(~has_id)])
    lists = named.select(pl.col("group_ranks").list.sort()).unique().collect()["group_ranks"].to_list()
    return [set(g) for g in lists if len(g) >= 2]


def _clashes_named(groups: list[list], named: list[set]) -> bool:
    """Whether a group found from end times holds two or more members of a group the records name
    without lying inside it.

    Two dimensions' groups meet at most once, and groups of one dimension are equal or apart; a coarser
    group the records name (the world, a stage) may hold a found group whole. A found group that holds
    more than one member of a named group and ranks outside it is the end times merging groups that run
    in lockstep (a stage's DP groups, whose TP partners finish together), not a dimension, however clear
    the split.
    """
    for g in map(set, groups):
        if any(len(g & h) >= 2 and not g <= h for h in named):
            return True
    return False


RATE_GAP = 2.0
"""streams whose call counts differ by more than this factor run at different rates (per step vs per
microbatch and layer); within one dimension, FSDP gathers twice (forward, backward) per scatter."""


def _rate_twin_unsplit(st: dict, sets: list[dict]) -> bool:
    """Whether a stream at another rate over two or more of these ranks found no split either.

    Two dimensions of a grid never share a group, so two rates that both read as one group are not
    both right, and the drift cannot say which one is: that happens when the members' own noise hides
    how far apart the groups run.
    """
    mine = set(st["ranks"])
    for other in sets:
        if other is st or other["how"] == "split" or len(mine & set(other["ranks"])) < 2:
            continue
        if max(other["calls"], st["calls"]) > RATE_GAP * min(other["calls"], st["calls"]):
            return True
    return False


def _swallows_unsplit(st: dict, sets: list[dict]) -> bool:
    """Whether one of these groups holds all ranks of a stream at another rate that found no split.

    That stream is another dimension, so its groups meet each of these groups at most once; inside
    one of them it would have no group of two: this split is too coarse (the stage, say, where the
    members' own noise hid the TP groups), not a dimension's groups.
    """
    groups = [{st["ranks"][i] for i in g} for g in st["groups"]]
    for other in sets:
        if other is st or other["how"] == "split" or len(other["ranks"]) < 2:
            continue
        if max(other["calls"], st["calls"]) <= RATE_GAP * min(other["calls"], st["calls"]):
            continue
        if any(set(other["ranks"]) <= g for g in groups):
            return True
    return False


def _echoes_busier(st: dict, sets: list[dict]) -> bool:
    """Whether every group split off for these ranks is a group that a busier stream split off too.

    Two dimensions of a grid never have the same groups. A TP pair's gradient buckets start together
    and are equally large, so they end close together although each goes to its own DP group; when
    the per-step stream's groups repeat the per-microbatch stream's, that is the likelier reading.
    """
    mine = {tuple(sorted(st["ranks"][i] for i in g)) for g in st["groups"]}
    for other in sets:
        if other is st or other["how"] != "split" or other["calls"] <= RATE_GAP * st["calls"]:
            continue
        theirs = {tuple(sorted(other["ranks"][i] for i in g)) for g in other["groups"]}
        if mine <= theirs:
            return True
    return False


def _across(st: dict, split: list[set], floor_ns: float, ratio: float) -> tuple[list | None, str]:
    """Groups of ranks (indices) that each take one member of every group of a clearer family.

    In a grid, a DP group meets each TP group once. When the groups another key split off clearly
    tile these ranks, each of them in turn is matched to the groups built so far by least summed
    drift (an assignment problem); a match counts when every other assignment drifts ``ratio`` times
    more.
    """
    from scipy.optimize import linear_sum_assignment

    ranks = st["ranks"]
    where = {r: i for i, r in enumerate(ranks)}
    tiles = sorted({tuple(sorted(h)) for h in split if h <= set(ranks)})
    sizes = {len(t) for t in tiles}
    if len(tiles) < 2 or len(sizes) != 1 or sum(len(t) for t in tiles) != len(ranks) or sizes == {1}:
        return None, "no clearer family tiles these ranks"
    groups = [[where[r]] for r in tiles[0]]
    for t in tiles[1:]:
        other = [where[r] for r in t]
        # drift to every member matched so far: all the evidence, not only the first tile's
        cost = np.stack([st["drift"][np.ix_(g, other)].sum(axis=0) for g in groups])
        rows, cols = linear_sum_assignment(cost)
        best = cost[rows, cols].sum()
        second = np.inf
        for a, b in zip(rows, cols):  # the best assignment that avoids one of the chosen pairs
            c = cost.copy()
            c[a, b] = np.inf
            try:
                r2, c2 = linear_sum_assignment(c)
            except ValueError:
                continue
            second = min(second, c[r2, c2].sum())
        if second < ratio * max(best, floor_ns) or (cost[rows, cols] / len(groups[0])).max() > st["duration"]:
            return None, f"members of the clearer groups not matched {ratio:g}x better than otherwise"
        for a, b in zip(rows, cols):
            groups[a].append(other[b])
    return groups, ""


def label_groups_by_timing(comm_op: pl.DataFrame, config: StreamConfig | None = None) -> tuple[pl.DataFrame, dict]:
    """Fill ``group_ranks`` of collectives that lack it, from end times alone (no declared memberships).

    A rank's stream is its calls of one (op, size_bytes); ranks whose streams have the same key and
    call count may be members of one group. Paired call by call, members of one group end together
    (a constant clock offset apart), while ranks of two groups drift apart by their own jitter, so the
    ranks of a key are clustered on that drift (:func:`_cluster`); ranks that share a ``host`` (one
    clock) must also end together. Needs comm_op columns rank, op, group_ranks, size_bytes, start_ns,
    end_ns (host optional). Returns (comm_op with group_ranks filled where decided,
    notes: streams, labelled, undecided and why).
    """
    config = config or StreamConfig()
    todo = (~pl.col("op").is_in(P2P_OPS)) & pl.col("group_ranks").is_null() & pl.col("end_ns").is_not_null()
    if comm_op.is_empty():
        return comm_op, {}
    coll = comm_op.filter(todo)
    if coll.is_empty():
        return comm_op, {}
    # ns since the first call, in int64 before any float: epoch ns as float64 keep only 256 ns steps
    t0 = coll["start_ns"].min()
    streams = stream_end_times(coll.with_columns(pl.col("start_ns") - t0, pl.col("end_ns") - t0))
    dur = (coll.group_by("rank", "op", "size_bytes")
           .agg(d=(pl.col("end_ns") - pl.col("start_ns")).median()))
    dur_of = {(int(r), o, s): float(d) for r, o, s, d in dur.iter_rows()}
    ov = (coll.sort("start_ns").group_by("rank", "op", "size_bytes", maintain_order=True)
          .agg(o=(pl.col("start_ns") < pl.col("end_ns").shift(1)).mean()))
    overlap_of = {(int(r), o, s): float(v or 0.0) for r, o, s, v in ov.iter_rows()}
    floor = _resolution_ns(coll["end_ns"].to_numpy())
    host_of = ({int(r): h for r, h in coll.select("rank", "host").unique("rank").iter_rows()}
               if "host" in coll.columns else {})
    rows, undecided = _decide(streams, dur_of, floor, config, host_of, overlap_of, _named_groups(comm_op))
    notes = {"streams": len(streams), "labelled": len({(r, o, s) for r, o, s, _ in rows}),
             "undecided": len(streams) - len({(r, o, s) for r, o, s, _ in rows}), "undecided_keys": undecided,
             "undecided_calls": sorted({int(k.rsplit(":", 1)[1]) for k in undecided})}
    if not rows:
        return comm_op, notes
    lab = pl.DataFrame(rows, schema={"rank": comm_op.schema["rank"], "op": pl.Utf8,
                                     "size_bytes": comm_op.schema["size_bytes"], "_g": pl.List(pl.Int64)},
                       orient="row").with_columns(pl.col("_g").cast(comm_op.schema["group_ranks"]))
    out = comm_op.with_row_index("_i").join(lab, on=["rank", "op", "size_bytes"], how="left")
    out = out.with_columns(_hit=todo & pl.col("_g").is_not_null())
    out = out.with_columns(pl.when("_hit").then(pl.col("_g")).otherwise(pl.col("group_ranks")).alias("group_ranks"))
    return with_member_group_ids(out).sort("_i").drop("_i", "_g", "_hit"), notes
