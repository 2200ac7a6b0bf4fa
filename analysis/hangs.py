"""Hang section of the report: collectives some rank never joined.

Inputs are comm_op rows from hang dumps (the hook's watchdog, the NCCL/gloo
flight recorder): ops still ``pending`` (null ``end_ns``) when the dump was
written, plus the ``completed`` ones before them. Per process group and
sequence number with a pending op, the section says which member ranks never
arrived, which arrived with a different op, size or dtype, and the last op
every rank completed; the stuck collective that started first is named first.

A member rank with no record of any kind in the whole job is missing *input*
(its trace was not supplied, as with 2 sampled ranks of a 128-rank job), not
a rank missing from the collective: it is listed in ``missing_input`` and never
by itself makes a hang. Only a pending op (a rank that waited) or a member
that has records elsewhere but stopped short in this group is evidence.

Sources number sequences their own way (the hook per group from 0, the flight
recorder per process group from 1), so each source is analysed on its own and
its findings carry ``source``.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from rankscope.analysis.model.job_model import JobModel
from rankscope.analysis.model.sort_key import sort_by_columns
from rankscope.analysis.report.hangs import Hang
from rankscope.collectors.job_frames import JobFrames
from rankscope.collectors.schema import P2P_OPS

_STATE_ORDER = {"completed": 2, "failed": 1, "pending": 0}
_UNEVEN_SIZES = frozenset({"all_to_all"})
"""ops whose ranks legitimately pass different sizes"""
_COLUMNS = ("rank", "op", "group_id", "group_ranks", "peer", "size_bytes", "dtype", "start_ns", "end_ns", "state",
            "seq", "step", "source")


def stuck_collectives(frames: JobFrames) -> list[Hang]:
    """Stuck collectives of one job, first stuck first.

    Needs comm_op columns ``rank, op, group_id, group_ranks, peer, size_bytes, dtype, start_ns, end_ns,
    state, seq, step, source``. Returns one Hang per (source, group, seq) where an op never completed
    (``evidence`` ``pending``: pending or failed in the dump) or where some members stopped short of the
    others (``lagging``: dumps that mark every op done, like gloo's flight recorder): ``group``
    (group id), ``group_ranks``, ``seq``, ``op``, ``size_bytes``, ``dtype``, ``step``, ``missing`` (member
    ranks with no record at that seq), ``mismatched`` ([{rank, op, size_bytes, dtype}]), ``pending_ranks``,
    ``arrived``, ``last_seq`` ({rank: last seq it reached in the group}), ``last_completed`` ({rank: {op,
    group, seq, step}}), ``first_divergent_seq`` (first seq whose members disagree on the step, when
    steps are known), ``root_cause`` (some missing rank waits nowhere else, or a rank arrived mismatched),
    ``started_ns``, ``first`` (the first stuck collective of its source: roots first, then the earliest
    step, then the earliest start), ``missing_input`` (members with no record of any kind in the job)
    and ``source``. Reads ``rank`` of compute_op, step_mark and batch_meta too, to tell a rank that
    stopped from a rank whose trace is absent.
    """
    df, members = _prepare(frames.comm_op)
    if df.height == 0:
        return []
    present = _ranks_with_records(frames)
    out: list[Hang] = []
    sources = sorted(df["source"].unique().to_list(), key=lambda s: (s != "hook", s))
    for source in sources:
        # one source (the common case): every row is its, so no filtered copy of the whole frame
        part = df if len(sources) == 1 else df.filter(pl.col("source") == source)
        out.extend(_source_hangs(part, members, source, present))
    return out


def _ranks_with_records(frames: JobFrames) -> set[int]:
    """Ranks that have at least one record of any rank-keyed kind in the job, or a source file of their own
    (an empty dump: the rank had no unfinished call; its input is there)."""
    ranks: set[int] = set(frames.source_ranks)
    for f in (frames.comm_op, frames.compute_op, frames.step_mark, frames.batch_meta):
        if f.height and "rank" in f.columns:
            ranks.update(int(r) for r in f["rank"].drop_nulls().unique().to_list())
    return ranks


def _prepare(comm: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(ops, members): one row per (source, rank, group key, seq, op) with its ``_gkey``, in input order
    (in state order, most advanced first, when a rank was dumped twice: see the end); and the member
    ranks of each group key (``_gkey``, ``members``)."""
    empty = pl.DataFrame(schema={"_gkey": pl.Categorical, "members": pl.List(pl.Int32)})
    if comm.height == 0 or "seq" not in comm.columns:
        return comm.head(0), empty
    # only the columns the section reads: the de-duplication below copies every column it carries
    ops = comm.select([c for c in _COLUMNS if c in comm.columns])
    if ops["seq"].null_count():  # a filter copies every column it keeps (1.5 GiB at 16,384 GPUs): only when needed
        ops = ops.filter(pl.col("seq").is_not_null())
    if "group_ranks" not in comm.columns:
        ops = ops.with_columns(pl.lit(None, dtype=pl.List(pl.Int32)).alias("group_ranks"))
    is_p2p = pl.col("op").is_in(list(P2P_OPS)) & pl.col("peer").is_not_null()
    src = pl.when(pl.col("op") == "send").then(pl.col("rank")).otherwise(pl.col("peer"))
    dst = pl.when(pl.col("op") == "send").then(pl.col("peer")).otherwise(pl.col("rank"))
    # Collectives are keyed by their sorted member list, which every rank and source spells the same
    # way; group ids differ between sources. Point-to-point ops are keyed by direction, so the n-th
    # send of a to b meets the n-th recv of b from a.
    # Keys are spelled once per distinct member list or (sender, receiver), and the members are kept
    # per key, not per op: on millions of ops the per-op lists and strings were most of a big job's
    # time and memory. The key columns are narrow (joins gather every column they carry), and the
    # input, filtered, is mostly a view of comm_op.
    # Member lists are matched by their hash (a u64 per op): joining or de-duplicating on the lists
    # themselves row-encodes every op's members (170 M values on 16,384 GPUs; more than 4 GiB).
    keys = ops.select(is_p2p.alias("_p2p"), src.alias("_src"), dst.alias("_dst"),
                      pl.col("group_ranks").hash().alias("_lh"), "group_id")
    firsts = keys.lazy().with_row_index("_row").filter(~pl.col("_p2p")).group_by("_lh").agg(
        pl.col("_row").first()).collect()
    lists = firsts.select("_lh", ops["group_ranks"].gather(firsts["_row"])).lazy().with_columns(
        pl.col("group_ranks").list.sort().alias("_m")).with_columns(
        pl.when(pl.col("_m").list.len() > 0)
        .then(pl.lit("ranks ") + pl.col("_m").cast(pl.List(pl.String)).list.join(",")).cast(pl.Categorical)
        .alias("_mtxt")).collect()
    pairs = keys.lazy().filter(pl.col("_p2p")).select("_src", "_dst").unique().with_columns(
        (pl.lit("p2p ") + pl.col("_src").cast(pl.String) + pl.lit("->") + pl.col("_dst").cast(pl.String))
        .cast(pl.Categorical).alias("_ptxt")).collect()
    gkey = keys.lazy() \
        .join(lists.lazy().select("_lh", "_mtxt"), on="_lh", how="left", maintain_order="left") \
        .join(pairs.lazy(), on=["_src", "_dst"], how="left", maintain_order="left") \
        .select(pl.when(pl.col("_p2p")).then(pl.col("_ptxt")).when(pl.col("_mtxt").is_not_null())
                .then(pl.col("_mtxt")).otherwise((pl.lit("id ") + pl.col("group_id").fill_null("?"))
                                                 .cast(pl.Categorical)).alias("_gkey")) \
        .collect().to_series()
    del keys
    # nulls filled only where there are some: the fill builds a whole new string column (~0.3 GiB at 16,384 GPUs)
    fills = ([pl.col("source").fill_null("?")] if ops["source"].null_count() else []) + (
        [pl.col("state").fill_null(pl.when(pl.col("end_ns").is_null()).then(pl.lit("pending"))
                                   .otherwise(pl.lit("completed")))] if ops["state"].null_count() else [])
    df = ops.drop("group_ranks").with_columns(*fills, gkey).with_columns(
        pl.col("state").replace_strict(_STATE_ORDER, default=0, return_dtype=pl.Int8).alias("_state_rank"))
    del ops, gkey
    members = pl.concat([
        lists.filter(pl.col("_mtxt").is_not_null()).select(
            pl.col("_mtxt").alias("_gkey"), pl.col("_m").list.unique().list.sort().cast(pl.List(pl.Int32))
            .alias("members")),
        pairs.select(pl.col("_ptxt").alias("_gkey"), pl.concat_list(["_src", "_dst"]).list.unique().list.sort()
                     .cast(pl.List(pl.Int32)).alias("members"))]).unique("_gkey", keep="first")
    # With every op completed no duplicate can change where the job is stuck (nothing is pending, and the
    # last seq and first start per group are the same over the duplicates), so the de-duplication waits for
    # a stuck point (:func:`_source_hangs`): a whole run's trace (OSDI'25 AR tiled 16x: 1.1 M collectives,
    # seq numbers repeating per step) then skips it (0.12 s and a sort's copy beside the replays).
    if df["_state_rank"].min() < _STATE_ORDER["completed"]:
        df = _deduplicated(df)
    return df, members


_KEY = ["source", "rank", "_gkey", "seq", "op"]
"""One op of one rank: a rank dumped twice (two writers of one source) has two rows of it."""


def _deduplicated(df: pl.DataFrame) -> pl.DataFrame:
    """A rank dumped by two writers of one source keeps its most advanced state per op. The common case
    has no such duplicate (the check costs a third of the ordered de-duplication), and its rows stay
    unsorted: most jobs have no stuck point, and the sort is the section's largest copy."""
    # hashes first (a u64 per row; the rows' own keys took 2 GiB at 16,384 GPUs), a hash tie then checked exactly
    if df.select(pl.struct(_KEY).hash().is_duplicated().any()).item():
        return _most_advanced(df, _KEY)
    return df


def _most_advanced(df: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """``_state_order(df).unique(key, keep="first", maintain_order=True)``, or ``df`` itself (unsorted) when
    no two rows share the key exactly.

    Ordered and de-duplicated on the key and order columns alone, the rows then gathered once: the exact
    check is the de-duplication itself (OSDI'25 SE, 58k ops of which 1.2k distinct: 14 -> 10.5 ms CPU)."""
    narrow = df.select(*key, "_state_rank", "start_ns").with_row_index("_row")
    rows = _state_order(narrow).unique(key, keep="first", maintain_order=True)["_row"]
    return df if rows.len() == df.height else df[rows]


def _state_order(df: pl.DataFrame) -> pl.DataFrame:
    """Most advanced state first, then by start (stable: rows that tie keep their order)."""
    # on one packed int64 where the columns allow: the two-column sort was a third of the section at 1,024 workers
    return sort_by_columns(df, ["_state_rank", "start_ns"], [True, False], maintain_order=True)


def _source_hangs(df: pl.DataFrame, key_members: pl.DataFrame, source: str, present: set[int]) -> list[Hang]:
    members = df.group_by("_gkey").agg(pl.col("rank").unique().sort().alias("seen")).join(
        key_members, on="_gkey", how="left")
    members = members.with_columns(
        pl.when(pl.col("members").list.len() > 0).then(pl.col("members"))
        .otherwise(pl.col("seen").cast(pl.List(pl.Int32))).alias("members"))
    last_seq = df.group_by(["_gkey", "rank"]).agg(pl.col("seq").max())
    # A member without any input cannot lag: nothing says it stopped, only that its trace is absent.
    known = members.with_columns(pl.col("members").list.eval(
        pl.element().filter(pl.element().is_in(sorted(present)))))
    stuck = pl.concat([_pending_points(df), _lagging_points(df, known, last_seq)]).with_columns(
        pl.col("_gkey").cast(pl.String)).sort(["_t", "seq", "_gkey"])
    if stuck.height == 0:
        return []
    if df["_state_rank"].min() == _STATE_ORDER["completed"]:
        df = _deduplicated(df)  # left for a stuck point by _prepare: what is reported counts each op once
    # what is reported of a stuck point reads the ops in state order (the first group id seen, the
    # majority's op, the last completed op of each rank)
    df = _state_order(df)
    members = members.join(df.group_by("_gkey").agg(pl.col("group_id").drop_nulls().first()), on="_gkey",
                           how="left")
    last_done = _last_completed(df)
    steps_known = df["step"].is_not_null().any() if "step" in df.columns else False
    # Split once by group: a hang on a big job leaves a stuck point on thousands of rank pairs.
    by_group = df.partition_by("_gkey", as_dict=True)
    groups = {r["_gkey"]: r for r in members.iter_rows(named=True)}
    seqs = {}
    for g, r, sq in last_seq.iter_rows():
        seqs.setdefault(g, {})[str(r)] = int(sq)
    waiting = set(df.filter(pl.col("state") != "completed")["rank"].to_list())
    first_wait = _first_waits(df)
    points = []
    for gkey, seq, t, evidence in stuck.iter_rows():
        rows = by_group[(gkey,)].filter(pl.col("seq") == seq)
        reached = seqs.get(gkey, {})
        arrived = sorted(set(rows["rank"].to_list()))
        # A member with a record past this seq went through it: a dump of unfinished calls only (NVRx,
        # torch's active-entries dumps) leaves out what it completed. Missing is a member that never got here.
        passed = [r for r in groups[gkey]["members"] if r not in arrived and reached.get(str(r), -1) > seq]
        missing = [r for r in groups[gkey]["members"] if r not in arrived and r not in passed]
        if gkey.startswith("p2p ") and _unpaired(by_group[(gkey,)]):
            passed, missing = [], []  # a send and its recv carry unrelated numbers: nobody is known missing
        points.append((gkey, int(seq), t, evidence, rows, arrived, passed, missing))
    missing_at = {(p[0], p[1]): p[7] for p in points}
    waits_at: dict[tuple[str, int], list[int]] = {}
    for r, w in sorted(first_wait.items()):
        waits_at.setdefault(w, []).append(r)
    out = []
    for gkey, seq, t, evidence, rows, arrived, passed, missing in points:
        gdf, grp = by_group[(gkey,)], groups[gkey]
        is_p2p = gkey.startswith("p2p ")
        ref = _majority(rows, is_p2p)
        mismatched = _mismatched(rows, ref, is_p2p)
        here = waits_at.get((gkey, seq), [])
        if evidence == "pending":
            # Ranks wait here first (their oldest unfinished call; the later ones queue behind it) for a
            # member that waits nowhere, or whose own first wait lacks nobody: the chain of waits ends here.
            root = bool(mismatched) or bool(here) and any(
                r in present and (r not in first_wait or not missing_at.get(first_wait[r])) for r in missing)
        else:
            # A rank with no input at all is not known to wait nowhere: it cannot be the root by absence.
            root = bool(mismatched) or any(r not in waiting and r in present for r in missing)
        out.append(Hang(
            group=grp["group_id"] if grp["group_id"] is not None else gkey,
            group_key=gkey, group_ranks=grp["members"], seq=seq,
            op=ref["op"], size_bytes=ref["size_bytes"], dtype=ref["dtype"], step=ref["step"],
            missing=missing, mismatched=mismatched,
            pending_ranks=sorted(set(rows.filter(pl.col("state") != "completed")["rank"].to_list())),
            evidence=evidence, arrived=arrived, passed=passed, waiting=here, last_seq=seqs.get(gkey, {}),
            last_completed={str(r): last_done.get(r) for r in grp["members"]},
            first_divergent_seq=_first_divergence(gdf) if steps_known else None,
            root_cause=root, started_ns=t, first=False, source=source,
            missing_input=[r for r in grp["members"] if r not in present]))
    # Roots first, then program order: the earliest step (a rank that finished its step early already
    # waits in the next one before the stuck collective of the previous step starts), then start time.
    out.sort(key=lambda h: (not h.root_cause, h.step if h.step is not None else 1 << 62,
                            h.started_ns if h.started_ns is not None else 1 << 62, h.seq))
    if out:
        out[0] = replace(out[0], first=True)
    return out


def _mismatched(rows: pl.DataFrame, ref: dict, is_p2p: bool) -> list[dict]:
    """Arrived ranks whose op, size or dtype differs from the majority's. A p2p pair's ops differ by nature,
    and so do an all_to_all's sizes (each rank sends what its tokens need: MoE dispatch is uneven)."""
    out = []
    uneven = ref["op"] in _UNEVEN_SIZES
    for r in rows.iter_rows(named=True):
        diff = {c: r[c] for c in ("op", "size_bytes", "dtype")
                if not (is_p2p and c == "op") and not (uneven and c == "size_bytes")
                and r[c] is not None and ref[c] is not None and r[c] != ref[c]}
        if diff:
            out.append({"rank": r["rank"], "op": r["op"], "size_bytes": r["size_bytes"], "dtype": r["dtype"],
                        "differs_in": sorted(diff)})
    return out


def _unpaired(gdf: pl.DataFrame) -> bool:
    """Whether the two ends of a p2p direction number their calls apart: both wait, at no seq in common.
    With paired numbers (the hook's, per direction) a pending send and its pending recv carry one seq. The
    flight recorder's p2p_seq_id counts every send and recv of a rank in its group, whatever the peer, so
    rank 8's 13694th and rank 12's 11978th can be one transfer. Then seqs cannot say who never arrived."""
    per = gdf.filter(pl.col("state") != "completed").group_by("rank").agg(pl.col("seq").unique())
    if per.height < 2:
        return False
    seqs = [set(v) for v in per["seq"].to_list()]
    return not set.intersection(*seqs)


def _first_waits(df: pl.DataFrame) -> dict[int, tuple[str, int]]:
    """rank -> (group key, seq) of its oldest unfinished call: where it waits. Its later unfinished calls
    queue behind that one (one stream, or the data they need), so they say nothing of their own."""
    open_ = df.filter(pl.col("state") != "completed")
    if open_.height == 0:
        return {}
    first = open_.select("rank", pl.col("_gkey").cast(pl.String), "seq", "start_ns").sort(
        ["rank", "start_ns", "seq"], nulls_last=True).unique("rank", keep="first")
    return {int(r): (g, int(q)) for r, g, q, _ in first.iter_rows()}


def _pending_points(df: pl.DataFrame) -> pl.DataFrame:
    """(group, seq) where some rank's op never completed: pending in a dump, or failed (timed out)."""
    return (df.filter(pl.col("state") != "completed").group_by(["_gkey", "seq"])
            .agg(pl.col("start_ns").min().alias("_t"))
            .with_columns(pl.lit("pending").alias("evidence")).select("_gkey", "seq", "_t", "evidence"))


def _lagging_points(df: pl.DataFrame, members: pl.DataFrame, last_seq: pl.DataFrame) -> pl.DataFrame:
    """Collective groups with no unfinished op where members stopped at different seqs.

    Dumps written at a timeout or at exit (the gloo flight recorder marks every op it saw as done) show
    a hang only this way: the ranks that never joined stop one seq short. The stuck seq is the first
    one the laggards never reached.
    """
    unfinished = df.filter(pl.col("state") != "completed")["_gkey"].unique()
    none = pl.DataFrame(schema={"_gkey": pl.Categorical, "seq": pl.Int64, "_t": pl.Int64, "evidence": pl.String})
    per = (last_seq.filter(~pl.col("_gkey").cast(pl.String).str.starts_with("p2p ")
                           & ~pl.col("_gkey").is_in(unfinished.implode()))
           .join(members.select("_gkey", "members"), on="_gkey"))
    if per.height == 0:
        return none
    g = per.group_by("_gkey").agg(pl.col("seq").min().alias("_lo"), pl.col("seq").max().alias("_hi"),
                                  pl.col("rank").n_unique().alias("_n"),
                                  pl.col("members").first().list.len().alias("_m"))
    # A member with no record at all in the group lags too (it never joined the first call).
    g = g.filter((pl.col("_lo") < pl.col("_hi")) | (pl.col("_n") < pl.col("_m")))
    if g.height == 0:
        return none
    df = df.filter(pl.col("_gkey").is_in(g["_gkey"].implode()))
    first = df.group_by("_gkey").agg(pl.col("seq").min().alias("_first"))
    g = g.join(first, on="_gkey").with_columns(
        pl.when(pl.col("_n") < pl.col("_m")).then(pl.col("_first")).otherwise(pl.col("_lo") + 1).alias("seq"))
    t = df.group_by(["_gkey", "seq"]).agg(pl.col("start_ns").min().alias("_t"))
    return (g.join(t, on=["_gkey", "seq"], how="left").with_columns(pl.lit("lagging").alias("evidence"))
            .select("_gkey", "seq", "_t", "evidence"))


def _majority(rows: pl.DataFrame, is_p2p: bool) -> dict:
    """The op/size/dtype most arrived ranks agree on (a tie, as with two ranks, goes to the smaller value)."""
    ref = {}
    for c in ("op", "size_bytes", "dtype", "step"):
        vals = rows[c].drop_nulls()
        ref[c] = vals.mode().sort()[0] if len(vals) else None
    if is_p2p:
        ref["op"] = "send/recv"
    return ref


def _last_completed(df: pl.DataFrame) -> dict[int, dict]:
    done = df.filter(pl.col("state") == "completed")
    if done.height == 0:
        return {}
    # Flight recorder entries of gloo have zero times, so order by seq as well.
    last = done.select("rank", "op", "group_id", "_gkey", "seq", "step", "end_ns", "start_ns").sort(
        ["end_ns", "start_ns", "seq"]).group_by("rank").agg(pl.all().last())
    return {r["rank"]: {"op": r["op"], "group": r["group_id"] if r["group_id"] is not None else r["_gkey"],
                        "seq": r["seq"], "step": r["step"]} for r in last.iter_rows(named=True)}


def _first_divergence(g: pl.DataFrame) -> int | None:
    """First seq of a group at which members recorded different steps (the call one rank skipped)."""
    per = g.filter(pl.col("step").is_not_null()).group_by("seq").agg(pl.col("step").n_unique().alias("n"))
    bad = per.filter(pl.col("n") > 1)
    return int(bad["seq"].min()) if bad.height else None


def hang_section(model: JobModel) -> list[Hang]:
    """The report's hangs: the stuck collectives of the job model's completed records."""
    return stuck_collectives(model.frames)
