"""Parallel strategy from comm_op records (white-box): exact from group memberships and p2p peers.

The job's own records say which ranks form each process group and who sends
to whom, so nothing is guessed about membership. What is inferred is the role
of each group family:

- pipelines are the connected paths of the send/recv graph
  (:mod:`rankscope.analysis.strategy.pipelines`); the stage order
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
from pyarrow._compute import call_function  # not pyarrow.compute: its import is ~40 ms of a small trace's run

from rankscope.analysis.report.strategy import Strategy, Undecided, WhiteboxDetail
from rankscope.analysis.strategy.call_positions import (
    POSITION_COUNTS,
    position_counts,
    position_role,
    with_pass,
)
from rankscope.analysis.strategy.expert_groups import (
    all_to_all_groups_by_timing,
    expert_families,
    note_expert_dp,
)
from rankscope.analysis.strategy.groups_from_timing import label_groups_by_timing
from rankscope.analysis.strategy.pipelines import P2P_OPS, order_pipelines


def group_families(comm_op: pl.DataFrame, where: pl.Expr | None = None) -> pl.DataFrame:
    """Distinct collective groups with their calls and ops (of the calls ``where`` keeps, default all).

    Needs comm_op columns rank, op, group_ranks, size_bytes. Returns one row per
    distinct member set: members (sorted list), size, calls (records per member that
    recorded calls of it), stream_calls (the same, of its busiest (op, size_bytes): a
    gradient bucket runs once per step, a layer's activation once per microbatch), bytes
    (per such member), ops (sorted list of op names).
    """
    if not _has_member_lists(comm_op):
        return _no_families()
    pass_col = pl.col("_pass") if "_pass" in comm_op.columns else pl.lit(None, dtype=pl.String).alias("_pass")
    # Calls are keyed by their member list's hash, and only each key's first list is gathered: grouping by the
    # lists themselves row-encodes every call's members (75 M values on 16,384 GPUs, several GiB). Two lists
    # whose 64-bit hashes collide would be merged (odds ~k^2/2^65 for k distinct lists: 3e-12 at 10,000).
    coll = comm_op.select("rank", "op", "size_bytes", "microbatch", pass_col, _list=pl.col("group_ranks").hash(),
                          _row=pl.int_range(pl.len(), dtype=pl.UInt32)).filter(
        ~pl.col("op").is_in(P2P_OPS) & comm_op["group_ranks"].is_not_null() & (True if where is None else where))
    if coll.is_empty():
        return _no_families()
    # aggregate per list as recorded, then sort the (few) distinct lists and merge equal member sets
    per_key = (coll.group_by("_list", "op", "size_bytes")
               .agg(pl.len().alias("n"), pl.col("microbatch").is_not_null().sum().alias("n_mb"), *position_counts(),
                    _first=pl.col("_row").min(), _ranks=pl.col("rank").unique()))
    per_key = per_key.with_columns(group_ranks=comm_op["group_ranks"].gather(per_key["_first"])).drop("_list", "_first")
    per_list = (per_key.group_by("group_ranks")
                .agg(pl.col("n").sum(), *[pl.col(c).sum() for c in POSITION_COUNTS], key_n=pl.col("n").max(),
                     bytes=(pl.col("size_bytes").fill_null(0) * pl.col("n")).sum().cast(pl.Float64),
                     n_mb=pl.col("n_mb").sum(), ops=pl.col("op").unique(),
                     _ranks=pl.col("_ranks").list.explode(keep_nulls=False, empty_as_null=False).unique())
                .with_columns(members=pl.col("group_ranks").list.eval(pl.element().cast(pl.Int64)).list.sort()))
    return (per_list.group_by("members")
            .agg(*[pl.col(c).sum().cast(pl.Int64) for c in POSITION_COUNTS],
                 n=pl.col("n").sum(), bytes=pl.col("bytes").sum(), key_n=pl.col("key_n").max(),
                 mb_frac=pl.col("n_mb").sum() / pl.col("n").sum(),
                 ops=pl.col("ops").list.explode(keep_nulls=False, empty_as_null=False).unique().sort(),
                 _seen=pl.col("_ranks").list.explode(keep_nulls=False, empty_as_null=False).n_unique())
            .with_columns(size=pl.col("members").list.len().cast(pl.Int64))
            # per member that recorded the calls: a group whose other members' streams stayed without a group
            # (or whose dumps are missing) still runs at its own rate, not a fraction of it
            .with_columns(calls=pl.col("n") / pl.col("_seen"), bytes=pl.col("bytes") / pl.col("_seen"),
                          stream_calls=pl.col("key_n") / pl.col("_seen"))
            .drop("n", "key_n", "_seen").sort("members"))


def _has_member_lists(comm_op: pl.DataFrame) -> bool:
    """Some record names its group's members: without, there are no group families (OSDI'25 traces), and
    where the calls sit is not read (:func:`with_pass`; :func:`infer_whitebox` on SE: 44 -> 24 ms CPU)."""
    return "group_ranks" in comm_op.columns and comm_op["group_ranks"].null_count() < comm_op.height


def _no_families() -> pl.DataFrame:
    return pl.DataFrame(schema={"members": pl.List(pl.Int64), "size": pl.Int64, "calls": pl.Float64, "mb_frac": pl.Float64,
                                "stream_calls": pl.Float64, "bytes": pl.Float64, "ops": pl.List(pl.Utf8),
                                **{c: pl.Int64 for c in POSITION_COUNTS}})


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
                    "mb_frac": float(np.mean([r["mb_frac"] for r in keep])),
                    "position": position_role({c: sum(r.get(c) or 0 for r in keep) for c in POSITION_COUNTS})})
    # families that cover the most ranks first: a stray group (a barrier subset) is not a dimension
    return sorted(out, key=lambda f: -f["covered"])


def unlabelled_family(comm_op: pl.DataFrame, pipelines: list[list]) -> dict | None:
    """DP groups when collectives carry no group members (e.g. Kineto of gloo jobs).

    A DP group holds one rank per pipeline, all at the same stage, and its
    members issue the same collectives (op, count, bytes). So ranks at one
    stage position are split by that signature. Needs comm_op rank, op,
    group_ranks (null), size_bytes.
    """
    # only the columns read: a filter gathers every column it carries
    coll = comm_op.select("rank", "op", "size_bytes").filter(
        ~pl.col("op").is_in(P2P_OPS) & comm_op["group_ranks"].is_null())
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
            "mb_frac": 0.0, "position": None}


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

    Where the records mark the passes, where its calls sit decides (:func:`position_role`). Else streams
    whose groups stayed undecided are another family: the busier of the two is tensor parallel. Without
    such streams, :func:`per_microbatch` decides.
    """
    if family.get("position"):
        return family["position"]
    if undecided_calls:
        if family["stream_calls"] > max(undecided_calls):
            return "tp"
        if family["stream_calls"] < min(undecided_calls):
            return "dp"
        return None
    return "tp" if per_microbatch(family, comm_op) else "dp"


def infer_whitebox(comm_op: pl.DataFrame, *, timing: bool = True, passes: pl.DataFrame | None = None) -> Strategy:
    """Strategy of one job from its comm_op records.

    ``timing``: collectives without group members may get them from their end times
    (:func:`label_groups_by_timing`); pass False for records on relative time (clocks restart
    every step), where end times cannot be paired. ``passes``: the ranks' forward and backward
    spans (:func:`call_positions.pass_spans`), which place each collective inside a pass or outside:
    where they sit tells tensor from data parallel (:mod:`rankscope.analysis.strategy.call_positions`).

    Needs comm_op columns rank, op, group_ranks, peer, size_bytes, start_ns.
    Returns a Strategy with int-rank endpoints: dp/pp/tp/ep groups (singletons
    for a degree of 1), pipelines ordered first stage to last, and a confidence
    that drops when the groups do not tile the ranks as a grid.
    """
    if comm_op.is_empty():
        return Strategy(confidence=0.0, method="comm_op", evaluated=False, why="no comm_op records")
    ranks = _all_ranks(comm_op)
    pipes = order_pipelines(comm_op, ranks)
    pp_sizes = {len(p) for p in pipes.pipelines}
    notes = [_note_unequal_pipelines(pp_sizes)] if len(pp_sizes) > 1 else []
    comm_op, timed, conf_factor, timing_notes = _groups_from_end_times(
        all_to_all_groups_by_timing(comm_op) if timing else comm_op, timing)
    # the calls' places feed group_families alone, which reads only collectives that name their members
    comm_op = with_pass(comm_op, passes if _has_member_lists(comm_op) else None)
    # all_to_all apart: an EP group may be a DP group too (EP = DP), and its calls run per microbatch
    a2a = pl.col("op") == "all_to_all"
    # filtered inside: a filter here would gather every column, member lists too (2 GiB at 16,384 GPUs)
    fams = _partition_families(group_families(comm_op, ~a2a), pipes.pipelines)
    ep_fam, edp_fam = expert_families(_partition_families(group_families(comm_op, a2a), pipes.pipelines), fams)
    ep_f = [ep_fam] if ep_fam else []
    notes += [note_expert_dp(edp_fam)] if edp_fam else []
    dp_f, tp_f, lone_undecided, role_notes = _dp_and_tp_families([f for f in fams if f is not edp_fam], comm_op,
                                                                 timed.get("undecided_calls") or [])
    notes += timing_notes + role_notes
    if lone_undecided:
        conf_factor = min(conf_factor, 0.3)
    if dp_f is None and tp_f is None and not ep_f and not timed.get("undecided"):
        # (after undecided timed, matching sizes would lump the TP and DP streams it could not tell apart)
        dp_f = unlabelled_family(comm_op, pipes.pipelines)
        if dp_f is not None:
            notes.append(_NOTE_DP_FROM_SIZES)
            conf_factor = 0.8
    dp_groups, dp = _groups_or_singletons(dp_f, ranks)
    tp_groups, tp = _groups_or_singletons(tp_f, ranks)
    if tp_f is None and timed.get("undecided"):
        tp_groups, tp = None, None  # an undecided stream may be the TP one: unknown, not 1
        notes.append(_NOTE_TP_UNKNOWN)
    pp = max(pp_sizes) if pp_sizes else 1
    ep = ep_f[0]["size"] if ep_f else None
    # context-parallel rings are not read from comm_op records: cp stays unknown (None)
    rings: list[list] = []
    cp = len(rings[0]) if rings else None
    product = dp * pp * (tp or 1) * (cp or 1) * (1 if ep is None else 1)
    conf, conf_notes = _confidence(conf_factor, product, len(ranks), pipes.ordered, len(pp_sizes) > 1)
    unknown = [d for d, f in (("dp", dp_f), ("tp", tp_f)) if f is None and timed.get("undecided")]
    undecided = _undecided(unknown, rest_family(fams) if lone_undecided else None)
    if any(u.field == "dp" for u in undecided):
        dp, dp_groups = None, []  # the data-parallel groups are not known: not claimed, never a guessed 1
    if any(u.field == "tp" for u in undecided):
        tp, tp_groups = None, None
    detail = WhiteboxDetail(interleaved=pipes.interleaved, groups_unknown=unknown, cp_groups=rings or None)
    return Strategy(world_size=len(ranks), dp=dp, pp=pp, tp=tp, dp_groups=dp_groups,
                    pp_groups=sorted(pipes.pipelines, key=lambda p: p[0]), confidence=conf,
                    ep=ep, cp=cp, tp_groups=tp_groups, ep_groups=ep_f[0]["groups"] if ep_f else None, method="comm_op", notes=notes + conf_notes,
                    whitebox=detail, undecided=undecided)


def rest_family(fams: list[dict]) -> dict | None:
    """The one family covering the most ranks without an all_to_all (the family whose role may be undecided)."""
    full = max((f["covered"] for f in fams), default=0)
    rest = [f for f in fams if "all_to_all" not in f["ops"] and f["covered"] == full]
    return rest[0] if len(rest) == 1 else None


def _undecided(unknown: list[str], lone: dict | None) -> list[Undecided]:
    """The degrees the collectives leave open: a lone group family that could be either data or tensor
    parallel leaves both open; collective streams without a group may hide the groups of dp or tp."""
    out = []
    if lone is not None:
        why = _why_lone_family(lone["size"])
        out += [Undecided("dp", why, [1, lone["size"]]), Undecided("tp", why, [1, lone["size"]])]
    for field in unknown:
        if all(u.field != field for u in out):
            out.append(Undecided(field, _WHY_STREAMS_WITHOUT_GROUP.format(field=field)))
    return out


def _all_ranks(comm_op: pl.DataFrame) -> list[int]:
    """Every rank the records name (as the recording rank, a p2p peer or a collective group's member), sorted.

    Needs comm_op columns rank, peer, group_ranks.
    """
    ranks = set(comm_op["rank"].drop_nulls().unique().cast(pl.Int64).to_list())
    ranks.update(comm_op["peer"].drop_nulls().unique().cast(pl.Int64).to_list())
    ranks.update(member_ranks(comm_op["group_ranks"]))
    return sorted(ranks)


def member_ranks(group_ranks: pl.Series) -> set[int]:
    """Every rank named in a column of member lists (nulls and empty lists name none).

    Read chunk by chunk as Arrow: the flattened values are a view, not a copy, and no distinct-lists step
    hashes whole lists (on 16,384 GPUs the column holds 170 M values; ``unique()`` on it took 3 GiB)."""
    out: set[int] = set()
    for chunk in group_ranks.get_chunks():
        if chunk.len() and chunk.null_count() < chunk.len():
            flat = call_function("list_flatten", [chunk.to_arrow()])
            out.update(int(r) for r in call_function("unique", [flat]).to_pylist() if r is not None)
    return out


def _groups_from_end_times(comm_op: pl.DataFrame, timing: bool) -> tuple[pl.DataFrame, dict, float, list[str]]:
    """Groups for the collectives whose records name none, from their end times (where ``timing`` allows).

    Returns comm_op (with the groups timing found), the verdict of :func:`label_groups_by_timing` ({} when
    there is no timing evidence either way), the confidence factor it leaves (1.0; 0.9 with groups found
    from end times alone; 0.6 with streams left without a group, where a dimension's groups may be
    missing) and its notes.
    """
    if not timing or not comm_op.select((~pl.col("op").is_in(P2P_OPS) & pl.col("group_ranks").is_null()).any()).item():
        return comm_op, {}, 1.0, []
    comm_op, timed = label_groups_by_timing(comm_op)
    if not timed.get("labelled") and all(v.startswith("calls of one stream overlap")
                                         for v in timed.get("undecided_keys", {}).values()):
        # as on relative time: no timing evidence either way
        return comm_op, {}, 1.0, [_NOTE_END_TIMES_UNUSABLE]
    factor, notes = 1.0, []
    if timed.get("labelled"):
        notes.append(_note_groups_from_end_times(timed))
        factor = 0.9
    if timed.get("undecided"):
        factor = 0.6
        notes.append(_note_streams_without_group(timed))
    return comm_op, timed, factor, notes


def _dp_and_tp_families(fams: list[dict], comm_op: pl.DataFrame,
                        undecided_calls: list[int]) -> tuple[dict | None, dict | None, bool, list[str]]:
    """The data- and tensor-parallel families among those that cover the most ranks and run no ``all_to_all``.

    Sorted from once per step to once per microbatch (where the calls sit, share of calls in microbatches,
    calls of the busiest stream, calls, then the larger size first), the first is dp and the last tp; a lone family's role is
    :func:`lone_role`'s. Returns (dp family, tp family, True when a lone family's role is undecided and
    neither is reported, notes).
    """
    full = max((f["covered"] for f in fams), default=0)
    # where the calls sit (outside every forward: dp; reducing inside forwards: tp) outranks how often
    rest = sorted((f for f in fams if "all_to_all" not in f["ops"] and f["covered"] == full),
                  key=lambda f: (_POSITION_ORDER[f.get("position")], round(f["mb_frac"]), f["stream_calls"],
                                 f["calls"], -f["size"]))
    dp_f = rest[0] if rest else None
    tp_f = rest[-1] if len(rest) >= 2 else None
    role = lone_role(rest[0], comm_op, undecided_calls) if len(rest) == 1 else None
    undecided, notes = False, []
    if role == "tp":
        dp_f, tp_f = None, rest[0]  # the only family runs inside microbatches: tensor parallel, dp = 1
    elif role is None and len(rest) == 1:
        dp_f, undecided = None, True
        notes.append(_NOTE_LONE_FAMILY_UNDECIDED)
    if len(rest) > 2:
        notes.append(_note_many_families(len(rest)))
    return dp_f, tp_f, undecided, notes


def _groups_or_singletons(family: dict | None, ranks: list[int]) -> tuple[list[list], int]:
    """A family's groups plus a singleton for each rank outside them, and its degree; all singletons and 1
    without a family."""
    if family is None:
        return [[r] for r in ranks], 1
    covered = {m for g in family["groups"] for m in g}
    return family["groups"] + [[r] for r in ranks if r not in covered], family["size"]


def _confidence(factor: float, product: int, world: int, ordered: bool, unequal: bool) -> tuple[float, list[str]]:
    """The strategy's confidence from the grouping's ``factor``, and the notes that explain each drop.

    Halved when the degrees' product is not the number of ranks; times 0.7 when a pipeline's stage order is
    not confirmed, and again when the pipelines are of unequal length.
    """
    conf, notes = factor, []
    if product != world:
        conf *= 0.5
        notes.append(_note_product_mismatch(product, world))
    if not ordered:
        conf *= 0.7
        notes.append(_NOTE_ORDER_UNCONFIRMED)
    if unequal:
        conf *= 0.7
    return conf, notes


_POSITION_ORDER = {"dp": 0, None: 1, "tp": 2}

# The notes' sentences (golden reports compare them byte for byte).

_NOTE_END_TIMES_UNUSABLE = "end times not usable for process groups (calls of a stream overlap in time)"
_NOTE_LONE_FAMILY_UNDECIDED = ("the only group family found could be tensor or data parallel: its groups are not "
                               "reported")
_NOTE_DP_FROM_SIZES = ("no process-group members in the records: DP groups from matching collective "
                       "sizes at the same pipeline stage")
_NOTE_TP_UNKNOWN = "tp unknown: collective streams without a group"
_NOTE_ORDER_UNCONFIRMED = "pipeline stage order not confirmed by first-message direction"
_WHY_STREAMS_WITHOUT_GROUP = ("collective streams were left without a group (their end times do not tell their "
                              "members): the {field} groups may be among them")


def _why_lone_family(size: int) -> str:
    return (f"the only group family (groups of {size}) runs neither clearly once per step nor once per microbatch: "
            f"it may be the data-parallel or the tensor-parallel groups, so neither degree is claimed")


def _note_unequal_pipelines(sizes: set[int]) -> str:
    return f"pipelines of unequal length {sorted(sizes)}"


def _note_groups_from_end_times(timed: dict) -> str:
    return (f"process groups of {timed['labelled']} of {timed['streams']} collective stream(s) "
            "found from end times alone (no group ids in the records)")


def _note_streams_without_group(timed: dict) -> str:
    """Names the first four streams left without a group, each with why."""
    return (f"{timed['undecided']} collective stream(s) left without a group: "
            + "; ".join(f"{k} ({v})" for k, v in list(timed["undecided_keys"].items())[:4]))


def _note_many_families(n: int) -> str:
    return f"{n} collective group families; kept the least and most frequent as dp and tp"


PRODUCT_NOTE_START = "dp*pp*tp*cp = "


def _note_product_mismatch(product: int, world: int) -> str:
    return f"{PRODUCT_NOTE_START}{product} but {world} ranks"
