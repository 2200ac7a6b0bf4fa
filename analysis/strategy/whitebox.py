"""Parallel strategy from comm_op records (white-box): exact from group memberships and p2p peers.

The job's own records say which ranks form each process group and who sends
to whom, so nothing is guessed about membership. What is inferred is the role
of each group family:

- pipelines are the connected paths of the send/recv graph; the stage order
  comes from the first p2p op of each rank on each edge (the first message on
  a pipeline edge is always a forward activation, so the rank whose first op
  towards its peer is a ``send`` is upstream), read on that rank's own clock;
- a collective group family (disjoint groups of one size that each meet every
  pipeline at most once) is expert-parallel when it runs ``all_to_all``;
  among the rest, the family whose calls belong to microbatches (when the
  records say so), else the one with the most calls per group, is
  tensor-parallel (Megatron's TP runs collectives in every layer of every
  microbatch); the other is data-parallel (gradient buckets once per step,
  plain or ZeRO).

Collectives whose records name no group (Kineto of gloo jobs) get their
groups from end times first (:mod:`rankscope.analysis.strategy.groups_from_timing`);
there the family whose busiest stream runs at least once per microbatch is
tensor-parallel. What timing leaves undecided is reported unknown, not guessed.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import polars as pl

from rankscope.analysis.report.strategy import Strategy, WhiteboxDetail
from rankscope.analysis.strategy.groups_from_timing import label_groups_by_timing

P2P_OPS = ("send", "recv")


def _components(nodes: list, edges: list[tuple]) -> list[list]:
    """Connected components, each sorted, ordered by smallest member.

    A union-find over the edges: the answer does not depend on component labels, and scipy.sparse
    cost ~0.13 s to import, a tenth of a small trace's analysis.
    """
    idx = {n: i for i, n in enumerate(nodes)}
    if not edges:
        return [[n] for n in nodes]
    parent = list(range(len(nodes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for u, v in edges:
        ru, rv = root(idx[u]), root(idx[v])
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    comps = defaultdict(list)
    for i, n in enumerate(nodes):
        comps[root(i)].append(n)
    return sorted((sorted(c) for c in comps.values()), key=lambda c: c[0])


def order_path(members: list, upstream_votes: dict[tuple, float]) -> tuple[list, bool]:
    """Order one pipeline's members from first stage to last.

    ``upstream_votes[(a, b)] > 0`` says a is upstream of b (antisymmetric).
    Returns (ordered members, True when the edges form a simple path that the
    votes orient consistently).
    """
    if len(members) == 1:
        return list(members), True
    adj = defaultdict(set)
    for (a, b) in upstream_votes:
        if a in adj or a in members:
            adj[a].add(b)
            adj[b].add(a)
    ends = [m for m in members if len(adj[m]) == 1]
    is_path = len(ends) == 2 and all(len(adj[m]) <= 2 for m in members)
    if not is_path:
        # not a path: order by net upstream score (sources first) as best effort
        score = {m: sum(np.sign(upstream_votes.get((m, o), 0.0)) for o in adj[m]) for m in members}
        return sorted(members, key=lambda m: (-score[m], m)), False
    # walk from the end that is upstream of its only neighbour
    start = None
    for e in ends:
        (nb,) = adj[e]
        if upstream_votes.get((e, nb), 0.0) > 0:
            start = e if start is None else start
    consistent = start is not None
    start = start if start is not None else min(ends)
    order, prev = [start], None
    while len(order) < len(members):
        cur = order[-1]
        nxt = [n for n in adj[cur] if n != prev and n not in order]
        if not nxt:
            break
        prev = cur
        order.append(nxt[0])
        consistent &= upstream_votes.get((cur, nxt[0]), 0.0) > 0
    return order, consistent


def p2p_votes(comm_op: pl.DataFrame) -> dict[tuple, float]:
    """Per rank pair, whether the first rank is upstream: +1/-1 per side whose first op on the edge says so.

    Needs comm_op columns rank, op, peer, start_ns. Each side is read on its own clock only.
    """
    # only the columns read: a filter and sort gather every column they carry (member lists included)
    p2p = comm_op.select("rank", "peer", "op", "start_ns").filter(
        pl.col("op").is_in(P2P_OPS) & pl.col("peer").is_not_null())
    if p2p.is_empty():
        return {}
    first = (p2p.sort("start_ns").group_by(["rank", "peer"], maintain_order=True)
             .agg(pl.col("op").first()))
    votes: dict[tuple, float] = defaultdict(float)
    for r, p, op in first.iter_rows():
        s = 1.0 if op == "send" else -1.0
        votes[(r, p)] += s
        votes[(p, r)] -= s
    return dict(votes)


def first_p2p_is_send(comm_op: pl.DataFrame) -> dict[int, bool]:
    """Per rank, whether its first p2p op of the job is a send (only the first stage starts that way)."""
    p2p = comm_op.select("rank", "peer", "op", "start_ns").filter(
        pl.col("op").is_in(P2P_OPS) & pl.col("peer").is_not_null())
    if p2p.is_empty():
        return {}
    first = p2p.sort("start_ns").group_by("rank", maintain_order=True).agg(pl.col("op").first())
    return {int(r): op == "send" for r, op in first.iter_rows()}


def order_cycle(members: list, votes: dict[tuple, float], first_send: dict) -> tuple[list, bool]:
    """Order a cyclic (interleaved) pipeline: follow the upstream votes from the rank that sends first."""
    starts = [m for m in members if first_send.get(m)]
    start = min(starts) if starts else min(members)
    order = [start]
    while len(order) < len(members):
        nxt = [b for (a, b), v in votes.items() if a == order[-1] and v > 0 and b not in order]
        if not nxt:
            break
        order.append(min(nxt))
    ok = len(starts) == 1 and len(order) == len(members)
    return (order if len(order) == len(members) else sorted(members)), ok


def group_families(comm_op: pl.DataFrame) -> pl.DataFrame:
    """Distinct collective groups with their calls and ops.

    Needs comm_op columns rank, op, group_ranks, size_bytes. Returns one row per
    distinct member set: members (sorted list), size, calls (records per member),
    stream_calls (records per member of its busiest (op, size_bytes): a gradient bucket
    runs once per step, a layer's activation once per microbatch), bytes (per member),
    ops (sorted list of op names).
    """
    coll = comm_op.select("op", "group_ranks", "size_bytes", "microbatch").filter(
        ~pl.col("op").is_in(P2P_OPS) & pl.col("group_ranks").is_not_null())
    if coll.is_empty():
        return pl.DataFrame(schema={"members": pl.List(pl.Int64), "size": pl.Int64, "calls": pl.Float64, "mb_frac": pl.Float64,
                                    "stream_calls": pl.Float64, "bytes": pl.Float64, "ops": pl.List(pl.Utf8)})
    # aggregate per list as recorded, then sort the (few) distinct lists and merge equal member sets
    per_key = (coll.group_by("group_ranks", "op", "size_bytes")
               .agg(n=pl.len(), n_mb=pl.col("microbatch").is_not_null().sum()))
    per_list = (per_key.group_by("group_ranks")
                .agg(pl.col("n").sum(), key_n=pl.col("n").max(),
                     bytes=(pl.col("size_bytes").fill_null(0) * pl.col("n")).sum().cast(pl.Float64),
                     n_mb=pl.col("n_mb").sum(), ops=pl.col("op").unique())
                .with_columns(members=pl.col("group_ranks").list.eval(pl.element().cast(pl.Int64)).list.sort()))
    return (per_list.group_by("members")
            .agg(n=pl.col("n").sum(), bytes=pl.col("bytes").sum(), key_n=pl.col("key_n").max(),
                 mb_frac=pl.col("n_mb").sum() / pl.col("n").sum(),
                 ops=pl.col("ops").list.explode(keep_nulls=False, empty_as_null=False).unique().sort())
            .with_columns(size=pl.col("members").list.len().cast(pl.Int64))
            .with_columns(calls=pl.col("n") / pl.col("size"), bytes=pl.col("bytes") / pl.col("size"),
                          stream_calls=pl.col("key_n") / pl.col("size"))
            .drop("n", "key_n").sort("members"))


def _partition_families(groups: pl.DataFrame, pipelines: list[list]) -> list[dict]:
    """Families of disjoint same-size groups that meet each pipeline at most once."""
    stage_of = {m: i for i, p in enumerate(pipelines) for m in p}
    rows = []
    for row in groups.iter_rows(named=True):
        mem = row["members"]
        if row["size"] < 2:
            continue
        pipes = [stage_of.get(m, -1 - m) for m in mem]
        if len(set(pipes)) < len(pipes):
            continue  # spans two stages of one pipeline: a world/control group, not a parallel dimension
        rows.append(row)
    # greedy, busiest first: a group joins the first family of its size that it does not overlap and
    # whose call rate is within a factor of 3; two dimensions of one size (tp=dp=2) thus stay apart
    fams: list[dict] = []
    for r in sorted(rows, key=lambda r: (-r["calls"], r["members"])):
        for f in fams:
            if (f["size"] == r["size"] and f["seen"].isdisjoint(r["members"])
                    and r["calls"] * 3 >= f["rows"][0]["calls"]):
                f["rows"].append(r)
                f["seen"].update(r["members"])
                break
        else:
            fams.append({"size": r["size"], "rows": [r], "seen": set(r["members"])})
    out = []
    for f in fams:
        keep = f["rows"]
        out.append({"size": f["size"], "groups": sorted(list(r["members"]) for r in keep),
                    "ops": sorted({o for r in keep for o in r["ops"]}),
                    "calls": float(np.median([r["calls"] for r in keep])),
                    "stream_calls": float(np.median([r["stream_calls"] for r in keep])),
                    "bytes": float(np.median([r["bytes"] for r in keep])), "covered": len(f["seen"]),
                    "mb_frac": float(np.mean([r["mb_frac"] for r in keep]))})
    # families that cover the most ranks first: a stray group (a barrier subset) is not a dimension
    return sorted(out, key=lambda f: -f["covered"])


def unlabelled_family(comm_op: pl.DataFrame, pipelines: list[list]) -> dict | None:
    """DP groups when collectives carry no group members (e.g. Kineto of gloo jobs).

    A DP group holds one rank per pipeline, all at the same stage, and its
    members issue the same collectives (op, count, bytes). So ranks at one
    stage position are split by that signature. Needs comm_op rank, op,
    group_ranks (null), size_bytes.
    """
    coll = comm_op.filter(~pl.col("op").is_in(P2P_OPS) & pl.col("group_ranks").is_null())
    if coll.is_empty():
        return None
    sig = (coll.group_by(["rank", "op"]).agg(n=pl.len(), b=pl.col("size_bytes").fill_null(0).sum())
           .sort(["rank", "op"]).group_by("rank", maintain_order=True)
           .agg(key=pl.concat_str(["op", "n", "b"], separator=":").str.join(",")))
    sig_of = dict(zip(sig["rank"].cast(pl.Int64).to_list(), sig["key"].to_list()))
    depth = max(len(p) for p in pipelines)
    groups = []
    for s in range(depth):
        by: dict[str, list] = defaultdict(list)
        for p in pipelines:
            if len(p) > s and p[s] in sig_of:
                by[sig_of[p[s]]].append(p[s])
        groups.extend(sorted(g) for g in by.values())
    sizes = {len(g) for g in groups}
    if not groups or len(sizes) != 1 or sizes == {1}:
        return None
    return {"size": sizes.pop(), "groups": sorted(groups), "ops": sorted(set(coll["op"].to_list())),
            "calls": 0.0, "stream_calls": 0.0, "bytes": 0.0, "covered": sum(len(g) for g in groups),
            "mb_frac": 0.0}


def per_microbatch(family: dict, comm_op: pl.DataFrame) -> bool:
    """Whether a collective family runs once per microbatch or more (tensor parallel), not once per step.

    From the microbatch labels where the records have any; else (Kineto) from the pipeline: a stage
    sends one activation per microbatch to its next stage, so a family whose busiest stream makes at
    least as many calls as a rank's sends to one peer runs per microbatch, while a gradient bucket runs
    once per step. Without labels and without a pipeline there is no yardstick: False (data parallel).
    """
    if "microbatch" in comm_op.columns and comm_op["microbatch"].drop_nulls().len():
        return family["mb_frac"] > 0.5
    sends = comm_op.filter((pl.col("op") == "send") & pl.col("peer").is_not_null()).group_by("rank", "peer").len()
    if sends.is_empty():
        return False
    return family["stream_calls"] >= float(sends["len"].median())


def lone_role(family: dict, comm_op: pl.DataFrame, undecided_calls: list[int]) -> str | None:
    """``tp`` or ``dp`` for the only group family found, None when the evidence cannot say.

    Streams whose groups stayed undecided are another family: the busier of the two is tensor
    parallel. Without such streams, :func:`per_microbatch` decides.
    """
    if undecided_calls:
        if family["stream_calls"] > max(undecided_calls):
            return "tp"
        if family["stream_calls"] < min(undecided_calls):
            return "dp"
        return None
    return "tp" if per_microbatch(family, comm_op) else "dp"


def infer_whitebox(comm_op: pl.DataFrame, *, timing: bool = True) -> Strategy:
    """Strategy of one job from its comm_op records.

    ``timing``: collectives without group members may get them from their end times
    (:func:`label_groups_by_timing`); pass False for records on relative time (clocks restart
    every step), where end times cannot be paired.

    Needs comm_op columns rank, op, group_ranks, peer, size_bytes, start_ns.
    Returns a Strategy with int-rank endpoints: dp/pp/tp/ep groups (singletons
    for a degree of 1), pipelines ordered first stage to last, and a confidence
    that drops when the groups do not tile the ranks as a grid.
    """
    if comm_op.is_empty():
        return Strategy(confidence=0.0, method="comm_op", evaluated=False, why="no comm_op records")
    ranks = set(comm_op["rank"].drop_nulls().cast(pl.Int64).to_list())
    ranks.update(comm_op["peer"].drop_nulls().cast(pl.Int64).to_list())
    gr = comm_op["group_ranks"].drop_nulls()
    if len(gr):
        # distinct lists first: exploding every op's member list is ~100 M values on 4,096 GPUs
        ranks.update(gr.unique().explode().drop_nulls().cast(pl.Int64).unique().to_list())
    ranks = sorted(ranks)
    world = len(ranks)
    notes: list[str] = []

    conf_factor = 1.0
    votes = p2p_votes(comm_op)
    first_send = first_p2p_is_send(comm_op)
    interleaved = False
    edges = sorted({tuple(sorted(k)) for k in votes})
    comps = _components(ranks, edges)
    # each component's votes and edge count, split in one pass (not one scan of all votes per component)
    comp_of = {r: i for i, c in enumerate(comps) for r in c}
    comp_votes: list[dict] = [{} for _ in comps]
    for k, v in votes.items():
        if k[0] in comp_of:
            comp_votes[comp_of[k[0]]][k] = v
    comp_edges = [0] * len(comps)
    for e in edges:
        if e[0] in comp_of:
            comp_edges[comp_of[e[0]]] += 1
    pipelines, rings, ordered_ok = [], [], True
    for ci, c in enumerate(comps):
        order, ok = order_path(c, comp_votes[ci])
        nedges = comp_edges[ci]
        if len(c) > 2 and nedges >= len(c):
            # a p2p cycle: an interleaved pipeline (the last stage feeds the first stage's next chunk)
            order, ok = order_cycle(c, comp_votes[ci], first_send)
            pipelines.append(order)
            ordered_ok &= ok
            interleaved = True
            continue
        pipelines.append(order)
        ordered_ok &= ok
    pp_sizes = {len(p) for p in pipelines}
    if len(pp_sizes) > 1:
        notes.append(f"pipelines of unequal length {sorted(pp_sizes)}")
    pp = max(pp_sizes) if pp_sizes else 1

    timed = {}
    if timing and comm_op.select((~pl.col("op").is_in(P2P_OPS) & pl.col("group_ranks").is_null()).any()).item():
        comm_op, timed = label_groups_by_timing(comm_op)
        if not timed.get("labelled") and all(v.startswith("calls of one stream overlap")
                                             for v in timed.get("undecided_keys", {}).values()):
            notes.append("end times not usable for process groups (calls of a stream overlap in time)")
            timed = {}  # as on relative time: no timing evidence either way
        if timed.get("labelled"):
            notes.append(f"process groups of {timed['labelled']} of {timed['streams']} collective stream(s) "
                         "found from end times alone (no group ids in the records)")
            conf_factor = 0.9
        if timed.get("undecided"):
            conf_factor = 0.6  # a dimension's groups may be missing
            notes.append(f"{timed['undecided']} collective stream(s) left without a group: "
                         + "; ".join(f"{k} ({v})" for k, v in list(timed["undecided_keys"].items())[:4]))
    fams = _partition_families(group_families(comm_op), pipelines)
    ep_f = [f for f in fams if "all_to_all" in f["ops"]]
    full = max((f["covered"] for f in fams), default=0)
    rest = sorted((f for f in fams if "all_to_all" not in f["ops"] and f["covered"] == full),
                  key=lambda f: (round(f["mb_frac"]), f["stream_calls"], f["calls"], -f["size"]))
    dp_f = rest[0] if rest else None
    tp_f = rest[-1] if len(rest) >= 2 else None
    role = lone_role(rest[0], comm_op, timed.get("undecided_calls") or []) if len(rest) == 1 else None
    if role == "tp":
        dp_f, tp_f = None, rest[0]  # the only family runs inside microbatches: tensor parallel, dp = 1
    elif role is None and len(rest) == 1:
        dp_f = None
        conf_factor = min(conf_factor, 0.3)
        notes.append("the only group family found could be tensor or data parallel: its groups are not reported")
    if len(rest) > 2:
        notes.append(f"{len(rest)} collective group families; kept the least and most frequent as dp and tp")

    def groups_or_singletons(f):
        if f is None:
            return [[r] for r in ranks], 1
        covered = {m for g in f["groups"] for m in g}
        return f["groups"] + [[r] for r in ranks if r not in covered], f["size"]

    if dp_f is None and tp_f is None and not ep_f and not timed.get("undecided"):
        # (after undecided timed, matching sizes would lump the TP and DP streams it could not tell apart)
        dp_f = unlabelled_family(comm_op, pipelines)
        if dp_f is not None:
            notes.append("no process-group members in the records: DP groups from matching collective "
                         "sizes at the same pipeline stage")
            conf_factor = 0.8
    dp_groups, dp = groups_or_singletons(dp_f)
    tp_groups, tp = groups_or_singletons(tp_f)
    if tp_f is None and timed.get("undecided"):
        tp_groups, tp = None, None  # an undecided stream may be the TP one: unknown, not 1
        notes.append("tp unknown: collective streams without a group")
    ep = ep_f[0]["size"] if ep_f else None
    cp = len(rings[0]) if rings else None
    product = dp * pp * (tp or 1) * (cp or 1) * (1 if ep is None else 1)
    conf = conf_factor
    if product != world:
        conf *= 0.5
        notes.append(f"dp*pp*tp*cp = {product} but {world} ranks")
    if not ordered_ok:
        conf *= 0.7
        notes.append("pipeline stage order not confirmed by first-message direction")
    if len(pp_sizes) > 1:
        conf *= 0.7
    unknown = [d for d, f in (("dp", dp_f), ("tp", tp_f)) if f is None and timed.get("undecided")]
    detail = WhiteboxDetail(interleaved=interleaved, groups_unknown=unknown,
                            ep_groups=ep_f[0]["groups"] if ep_f else None, cp_groups=rings or None)
    return Strategy(world_size=world, dp=dp, pp=pp, tp=tp, dp_groups=dp_groups,
                    pp_groups=sorted(pipelines, key=lambda p: p[0]), confidence=conf,
                    ep=ep, cp=cp, tp_groups=tp_groups, method="comm_op", notes=notes, whitebox=detail)
