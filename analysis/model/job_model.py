"""The one job model: what every section of a diagnosis reads, built once per job.

:func:`build_job_model` takes one job's records and returns a :class:`JobModel`:

- ``strategy``: white-box from comm_op (exact), when the job has comm_op;
- ``layout``: one row per rank with stage, dp_rank, tp_rank and pipeline.
  Record columns win where they exist (``stage`` of compute_op/comm_op,
  ``dp_rank``, ``tp_rank``); the rest comes from the inferred strategy: the
  position in the rank's pp group is its stage, the pp group's index its
  pipeline, the position in its dp (tp) group its dp (tp) rank. ``source``
  says which;
- ``frames``: the *completed* frames, on the recorded clocks. Where the raw
  records had nulls, compute_op gets stage (from the layout), step (from the
  rank's step windows) and microbatch, and comm_op gets step and microbatch.
  Microbatch ids come from span order: in both 1F1B and GPipe a rank runs
  the forwards of a step's microbatches in order and their backwards in the
  same order, so the k-th forward (backward) span of a (rank, step) is
  microbatch k when the rank has as many forwards as backwards; kernels take
  the id of the forward/backward span that encloses them; the k-th send
  (recv) to (from) one peer in a step carries microbatch k. Both only when
  the schedule is not interleaved (:func:`regular_pipeline`); otherwise
  stage and microbatch stay unknown and ``notes`` says why (a virtual stage
  is not the rank's pipeline position);
- ``aligned_comm``, ``aligned_compute``, ``aligned_step_mark``: the records
  on one clock (``rank_offsets``), with the completed labels (relative-time
  traces are left as recorded: every step has its own origin, so there is
  no clock to fit);
- ``rank_steps`` and ``steps``: the one step definition of :mod:`steps`.

A rank recorded by two sources at once (the live hook and the profiler of
the same run) would count each call twice, and the replay would see each
collective wait on its own copy (a cycle). So comm_op and step_mark keep one
source per rank (:func:`one_source_per_rank`): comm_op the source that names
its process groups most often (the hook does, gloo Kineto does not), then the
one with the most records; step_mark the source of the rank's compute
records (their step labels come from the same marks), else comm_op's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from rankscope.analysis.model.clocks import ClockConfig, apply_rank_offsets, rank_clock_offsets
from rankscope.analysis.model.steps import job_steps, rank_step_windows
from rankscope.analysis.report.diagnosis import Strategy
from rankscope.analysis.strategy.groups_from_streams import label_groups, memberships_from
from rankscope.analysis.strategy.whitebox import infer_whitebox
from rankscope.collectors.job_frames import JobFrames

LAYOUT_SCHEMA = {"rank": pl.Int64, "stage": pl.Int64, "dp_rank": pl.Int64, "tp_rank": pl.Int64,
                 "pipeline": pl.Int64, "source": pl.Utf8}
P2P = ("send", "recv")
PASS_CATEGORIES = ("forward", "backward")
COARSE = ("forward", "backward", "optimizer", "loss", "gc", "dataloader")
"""whole-pass categories: never given a microbatch from an enclosing span."""


@dataclass
class JobModel:
    """One job as every analysis sees it (see module docstring)."""

    frames: JobFrames
    """completed frames on the recorded clocks (what the what-if replays)."""
    aligned_comm: pl.DataFrame
    aligned_compute: pl.DataFrame
    aligned_step_mark: pl.DataFrame
    rank_offsets: pl.DataFrame
    strategy: Strategy | None
    """None when the job has no comm_op (the caller infers it from flows, if any)."""
    layout: pl.DataFrame
    """rank, stage, dp_rank, tp_rank, pipeline (Int64, null where unknown), source."""
    rank_steps: pl.DataFrame
    """rank, step, start_ns, end_ns on the aligned clock."""
    steps: pl.DataFrame
    """the job's steps (:data:`rankscope.analysis.model.steps.STEP_SCHEMA`)."""
    steps_source: str
    filled: dict
    """how many nulls the model filled, per frame and column."""
    notes: list[str]
    """what the model could not fill, and why."""

    def layout_columns(self) -> pl.DataFrame:
        """The layout in the straggler contract's columns: rank, stage, dp_rank, tp_rank, pipeline."""
        return self.layout.select("rank", "stage", "dp_rank", "tp_rank", "pipeline")


def build_job_model(frames: JobFrames, clock: ClockConfig | None = None) -> JobModel:
    """Build the model of one job. Needs any subset of comm_op, compute_op, step_mark (JobFrames)."""
    notes: list[str] = []
    frames = _one_source_each(frames, notes)
    frames = _groups_from_streams(frames, notes)
    strategy = (infer_whitebox(frames.comm_op, timing=not frames.relative_time)
                if not frames.comm_op.is_empty() else None)
    layout = rank_layout(frames, strategy)
    # steps from the records as given (labels and marks), on the aligned clock
    offsets = (rank_clock_offsets(frames.comm_op, clock) if not frames.relative_time
               else rank_clock_offsets(frames.comm_op.head(0), clock))
    mark = apply_rank_offsets(frames.step_mark, offsets)
    comm_a = apply_rank_offsets(frames.comm_op, offsets)
    comp_a = apply_rank_offsets(frames.compute_op, offsets)
    windows = rank_step_windows(mark, comm_a, comp_a)
    source = "step_mark" if not frames.step_mark.is_empty() else "step column"
    # on relative time every window of a rank starts at 0: only a record's own label can place it in a step
    step_windows = windows if not frames.relative_time else windows.head(0)
    comp = _stepped(frames.compute_op, comp_a, step_windows)
    comm = _stepped(frames.comm_op, comm_a, step_windows)
    regular, why = regular_pipeline(comm, comp, strategy)
    if not regular:
        notes.append(f"stage and microbatch not filled from the layout and span order: {why}")
    comp = complete_compute(comp, layout if regular else layout.head(0), regular)
    comm = complete_comm(comm, comp, regular)
    filled = _filled({"compute_op": (frames.compute_op, comp), "comm_op": (frames.comm_op, comm)})
    done = replace(frames, compute_op=comp, comm_op=comm)
    return JobModel(frames=done, aligned_comm=_with_labels(comm_a, comm), aligned_compute=_with_labels(comp_a, comp),
                    aligned_step_mark=mark, rank_offsets=offsets, strategy=strategy, layout=layout,
                    rank_steps=windows, steps=job_steps(windows, frames.relative_time), steps_source=source,
                    filled=filled, notes=notes)


def one_source_per_rank(df: pl.DataFrame, prefer: pl.DataFrame | None = None) -> tuple[pl.DataFrame, dict]:
    """Rows of one source per rank. Needs rank, source (and group_ranks when present).

    ``prefer`` (rank, source) names the source to keep where that rank has it; otherwise the
    source with the most rows that name their group members, then the most rows, then by name.
    Returns (kept rows, {rank: [dropped sources]}).
    """
    if df.is_empty() or "source" not in df.columns:
        return df, {}
    # only the columns read: an eager group_by carries every column of the frame (1.4 GB at 4,096 GPUs)
    per = df.select("rank", "source", *(["group_ranks"] if "group_ranks" in df.columns else [])).group_by(
        "rank", "source").agg(
        n=pl.len(), named=(pl.col("group_ranks").is_not_null().sum() if "group_ranks" in df.columns
                           else pl.lit(0)))
    if per.group_by("rank").len()["len"].max() <= 1:
        return df, {}
    if prefer is not None and not prefer.is_empty():
        pref = prefer.select(pl.col("rank").cast(per.schema["rank"]), "source").unique("rank")
        per = per.join(pref.with_columns(_p=pl.lit(1)), on=["rank", "source"], how="left")
    else:
        per = per.with_columns(_p=pl.lit(None, dtype=pl.Int32))
    per = per.with_columns(pl.col("_p").fill_null(0)).sort(
        ["rank", "_p", "named", "n", "source"], descending=[False, True, True, True, False])
    keep = per.unique("rank", keep="first", maintain_order=True).select("rank", "source")
    dropped = {int(r): sorted(set(g["source"].to_list())) for (r,), g in
               per.join(keep, on=["rank", "source"], how="anti").group_by("rank")}
    return df.join(keep, on=["rank", "source"], how="semi"), dropped


def _one_source_each(frames: JobFrames, notes: list[str]) -> JobFrames:
    """comm_op and step_mark with one source per rank (see module docstring)."""
    comm, dropped = one_source_per_rank(frames.comm_op)
    comp = frames.compute_op
    pref = (comp.select("rank", "source").unique() if not comp.is_empty() and "source" in comp.columns
            else comm.select("rank", "source").unique() if "source" in comm.columns else None)
    mark, dropped_marks = one_source_per_rank(frames.step_mark, pref)
    if not dropped and not dropped_marks:
        return frames
    for what, d in (("comm_op", dropped), ("step_mark", dropped_marks)):
        if d:
            srcs = sorted({s for v in d.values() for s in v})
            notes.append(f"{what}: {len(d)} rank(s) recorded by several sources; kept one each, "
                         f"left out {', '.join(srcs)}")
    return replace(frames, comm_op=comm, step_mark=mark)


def _groups_from_streams(frames: JobFrames, notes: list[str]) -> JobFrames:
    """Collectives without a group get one from their stream and the declared memberships."""
    members = memberships_from(frames.declared)
    if not members:
        return frames
    comm, res = label_groups(frames.comm_op, members)
    if res.get("labelled"):
        notes.append(f"process groups of {res['labelled']} of {res['streams']} collective stream(s) matched "
                     f"from declared memberships by end times ({res['undecided']} undecided)")
    elif res.get("streams"):
        notes.append(f"{res['streams']} collective stream(s) without a group; none matched a declared group")
    return replace(frames, comm_op=comm) if res.get("labelled") else frames


def _with_labels(aligned: pl.DataFrame, completed: pl.DataFrame) -> pl.DataFrame:
    """The aligned frame with the completed frame's labels (same rows, same order)."""
    if aligned.is_empty():
        return completed
    cols = [c for c in ("step", "microbatch", "stage") if c in completed.columns]
    return aligned.with_columns([completed[c] for c in cols])


def _rank_col(frames: JobFrames, col: str) -> pl.DataFrame:
    """rank -> the smallest non-null value of ``col`` in compute_op, else in comm_op."""
    parts = [f.select("rank", col).filter(pl.col(col).is_not_null()).group_by(pl.col("rank").cast(pl.Int64))
             .agg(pl.col(col).cast(pl.Int64).min()).with_columns(pl.lit(i).alias("_pref"))
             for i, f in enumerate((frames.compute_op, frames.comm_op)) if not f.is_empty() and col in f.columns]
    parts = [p for p in parts if not p.is_empty()]
    if not parts:
        return pl.DataFrame(schema={"rank": pl.Int64, col: pl.Int64})
    return pl.concat(parts).sort("_pref").unique("rank", keep="first").drop("_pref")


def _position(groups: list[list] | None, col: str, index_col: str | None = None) -> pl.DataFrame:
    """rank -> its position in its group (and the group's index) from a strategy's group lists."""
    rows = [(int(r), i, g) for g, members in enumerate(groups or []) for i, r in enumerate(members)
            if isinstance(r, (int,)) or (isinstance(r, str) and r.isdigit())]
    schema = {"rank": pl.Int64, col: pl.Int64, **({index_col: pl.Int64} if index_col else {})}
    if not rows:
        return pl.DataFrame(schema=schema)
    df = pl.DataFrame([r[:2] + ((r[2],) if index_col else ()) for r in rows], schema=schema, orient="row")
    return df.unique("rank", keep="first")


def rank_layout(frames: JobFrames, strategy: Strategy | None) -> pl.DataFrame:
    """Per-rank layout (``LAYOUT_SCHEMA``): record columns first, then the strategy's groups."""
    ranks = sorted({int(r) for f in (frames.compute_op, frames.comm_op, frames.step_mark)
                    if not f.is_empty() for r in f["rank"].drop_nulls().unique().to_list()})
    if not ranks:
        return pl.DataFrame(schema=LAYOUT_SCHEMA)
    out = pl.DataFrame({"rank": ranks}, schema={"rank": pl.Int64})
    rec = {c: _rank_col(frames, c) for c in ("stage", "dp_rank", "tp_rank", "pipeline")}
    s = strategy
    inf = {"stage": _position(s.pp_groups if s else None, "stage", "pipeline"),
           "dp_rank": _position(s.dp_groups if s else None, "dp_rank"),
           "tp_rank": _position(s.tp_groups if s else None, "tp_rank")}
    from_rec, from_strat = [], []
    for col in ("stage", "dp_rank", "tp_rank"):
        out = out.join(rec[col], on="rank", how="left")
        got = inf[col].select("rank", pl.col(col).alias("_inf"))
        out = out.join(got, on="rank", how="left")
        if out[col].null_count() < out.height:
            from_rec.append(col)
        if (out[col].is_null() & out["_inf"].is_not_null()).any():
            from_strat.append(col)
        out = out.with_columns(pl.coalesce(col, "_inf").alias(col)).drop("_inf")
    pipe = inf["stage"].select("rank", pl.col("pipeline").alias("_inf"))
    out = out.join(rec["pipeline"], on="rank", how="left").join(pipe, on="rank", how="left")
    if (out["pipeline"].is_null() & out["_inf"].is_not_null()).any():
        from_strat.append("pipeline")
    out = out.with_columns(pl.coalesce("pipeline", "_inf").alias("pipeline")).drop("_inf")
    why = "; ".join(p for p in (f"records: {', '.join(from_rec)}" if from_rec else "",
                                f"strategy: {', '.join(from_strat)}" if from_strat else "") if p) or "unknown"
    return out.with_columns(pl.lit(why).alias("source")).select(list(LAYOUT_SCHEMA)).sort("rank")


def _filled(pairs: dict) -> dict:
    """Nulls filled per frame and label column (a column the records lacked counts every row)."""
    out: dict = {}
    for kind, (before, after) in pairs.items():
        for col in ("step", "stage", "microbatch"):
            if before.is_empty() or col not in after.columns:
                continue
            n = (before[col].null_count() if col in before.columns else before.height) - after[col].null_count()
            if n:
                out.setdefault(kind, {})[col] = int(n)
    return out


def _step_from_windows(df: pl.DataFrame, aligned: pl.DataFrame, windows: pl.DataFrame) -> pl.Series:
    """Step of each row: its own label, else the rank's step window that holds its (aligned) start."""
    if windows.is_empty() or df["step"].null_count() == 0:
        return df["step"]
    w = windows.filter(pl.col("start_ns").is_not_null()).select(
        "rank", w_step="step", w0="start_ns", w1="end_ns").sort("w0")
    a = aligned.select(pl.col("rank").cast(pl.Int64), "start_ns").with_row_index("_i").sort("start_ns")
    j = a.join_asof(w, left_on="start_ns", right_on="w0", by="rank", strategy="backward", check_sortedness=False)
    j = j.with_columns(pl.when(pl.col("start_ns") < pl.col("w1")).then(pl.col("w_step"))).sort("_i")
    return df["step"].fill_null(j["w_step"].cast(df["step"].dtype))


def _stepped(df: pl.DataFrame, aligned: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """The frame with its label columns present and step filled from the rank's step windows."""
    if df.is_empty():
        return df
    df = _ensure(df, ("step", "stage", "microbatch"))
    aligned = aligned if aligned.height == df.height else df
    return df.with_columns(_step_from_windows(df, aligned, windows).alias("step"))


def regular_pipeline(comm: pl.DataFrame, comp: pl.DataFrame, strategy: Strategy | None) -> tuple[bool, str]:
    """Whether span order gives microbatch ids: a non-interleaved schedule (1F1B, GPipe).

    There, in each step, a rank sends to (receives from) each pipeline peer
    once per microbatch, as often as it runs forwards. Interleaved schedules
    break this where the pipeline wraps around (the last rank sends
    activations to the first), so their ids (and virtual stages) stay unknown.
    """
    if strategy is not None and strategy.extra.get("interleaved"):
        return False, "the strategy is an interleaved pipeline"
    if comm.is_empty() or comp.is_empty() or "category" not in comp.columns or "peer" not in comm.columns:
        return True, ""
    comp, comm = comp.select("rank", "step", "category"), comm.select("rank", "step", "op", "peer")  # no copies
    nf = (comp.filter((pl.col("category") == "forward") & pl.col("step").is_not_null())
          .group_by(pl.col("rank").cast(pl.Int64), pl.col("step").cast(pl.Int64)).agg(_nf=pl.len()))
    p2p = (comm.filter(pl.col("op").is_in(P2P) & pl.col("step").is_not_null() & pl.col("peer").is_not_null())
           .group_by(pl.col("rank").cast(pl.Int64), pl.col("step").cast(pl.Int64), "op", "peer").agg(_n=pl.len()))
    if p2p.is_empty() or nf.is_empty():
        return True, ""
    j = p2p.join(nf, on=["rank", "step"], how="left")
    bad = j.filter(pl.col("_nf").is_null() | (pl.col("_n") != pl.col("_nf")))
    if bad.height:
        r = bad.row(0, named=True)
        return False, (f"rank {r['rank']} step {r['step']}: {r['_n']} {r['op']} with peer {r['peer']} but "
                       f"{r['_nf'] or 0} forward spans (an interleaved or irregular schedule)")
    return True, ""


def complete_compute(comp: pl.DataFrame, layout: pl.DataFrame, by_order: bool) -> pl.DataFrame:
    """compute_op (steps filled) with stage from the layout and microbatch from span order where null."""
    if comp.is_empty():
        return comp
    out = comp
    if not layout.is_empty() and layout["stage"].null_count() < layout.height:
        st = layout.select(pl.col("rank").cast(out.schema["rank"]), pl.col("stage").alias("_st"))
        if st["rank"].is_duplicated().any():
            out = out.join(st, on="rank", how="left", maintain_order="left").with_columns(
                pl.col("stage").fill_null(pl.col("_st").cast(out.schema["stage"]))).drop("_st")
        else:
            # one layout row per rank: join the rank column alone (a join gathers every column it carries)
            st_of = out.select("rank").join(st, on="rank", how="left", maintain_order="left")["_st"]
            out = out.with_columns(pl.col("stage").fill_null(st_of.cast(out.schema["stage"])))
    return _microbatch_by_order(out) if by_order else out


def complete_comm(comm: pl.DataFrame, comp: pl.DataFrame, by_order: bool) -> pl.DataFrame:
    """comm_op (steps filled) with the microbatch of p2p transfers from their order where null."""
    if comm.is_empty() or not by_order or not {"op", "peer"} <= set(comm.columns):
        return comm
    if comm["microbatch"].null_count() == 0 or comp.is_empty() or "category" not in comp.columns:
        return comm
    # only the key columns travel through the join (the member lists would be copied otherwise)
    c = comm.select("rank", "step", "op", "peer", "start_ns").with_row_index("_i")
    p2p = (c.filter(pl.col("op").is_in(P2P) & pl.col("step").is_not_null() & pl.col("peer").is_not_null())
           .sort("start_ns").with_columns(_k=pl.col("_i").cum_count().over("rank", "step", "op", "peer") - 1))
    mb = (c.select("_i").join(p2p.select("_i", _mb=pl.col("_k").cast(comm.schema["microbatch"])), on="_i",
                              how="left").sort("_i")["_mb"])
    return comm.with_columns(pl.coalesce(pl.col("microbatch"), mb).alias("microbatch"))


def _ensure(df: pl.DataFrame, cols: tuple[str, ...]) -> pl.DataFrame:
    """Add the label columns a frame lacks (all null), so every consumer finds them."""
    return df.with_columns([pl.lit(None, dtype=pl.Int64).alias(c) for c in cols if c not in df.columns])


def _microbatch_by_order(comp: pl.DataFrame) -> pl.DataFrame:
    if comp["microbatch"].null_count() == 0 or "category" not in comp.columns:
        return comp
    dt = comp.schema["microbatch"]
    # the labels are worked out on the columns they need; the frame takes the result as one column
    full = comp
    comp = comp.select("rank", "step", "category", "start_ns", "end_ns", "microbatch")
    c = comp.with_row_index("_i")
    passes = c.filter(pl.col("category").is_in(PASS_CATEGORIES) & pl.col("step").is_not_null())
    if passes.is_empty():
        return full
    passes = passes.sort("start_ns").with_columns(
        _k=pl.col("_i").cum_count().over("rank", "step", "category") - 1,
        _nf=(pl.col("category") == "forward").sum().over("rank", "step"),
        _nb=(pl.col("category") == "backward").sum().over("rank", "step"))
    # only when every microbatch has one forward and one backward span on the rank (not recompute, not kernels)
    passes = passes.filter(pl.col("_nf") == pl.col("_nb"))
    mb = passes.select("_i", "rank", "step", "start_ns", "end_ns", _mb=pl.col("_k").cast(dt))
    c = c.join(mb.select("_i", "_mb"), on="_i", how="left")
    # kernels take the id of the forward/backward span of the same step that encloses them
    enc = mb.select("rank", "step", e0="start_ns", e1="end_ns", _emb="_mb").sort("e0")
    rest = c.filter(pl.col("_mb").is_null() & pl.col("microbatch").is_null() & pl.col("step").is_not_null()
                    & ~pl.col("category").is_in(COARSE)).select("_i", "rank", "step", "start_ns", "end_ns")
    if not rest.is_empty() and not enc.is_empty():
        j = rest.sort("start_ns").join_asof(enc, left_on="start_ns", right_on="e0", by=["rank", "step"],
                                            strategy="backward", check_sortedness=False)
        j = j.filter(pl.col("end_ns") <= pl.col("e1")).select("_i", "_emb")
        c = c.join(j, on="_i", how="left")
    else:
        c = c.with_columns(pl.lit(None, dtype=dt).alias("_emb"))
    mb = c.sort("_i").select(pl.coalesce("microbatch", "_mb", "_emb").alias("microbatch"))["microbatch"]
    return full.with_columns(mb)
