"""One source per rank: a rank recorded by two sources at once (the hook and the profiler of one run) keeps one, so that no call counts twice."""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from rankscope.collectors.job_frames import JobFrames


def one_source_per_rank(df: pl.DataFrame, prefer: pl.DataFrame | None = None) -> tuple[pl.DataFrame, dict]:
    """Rows of one source per rank. Needs rank, source (and group_ranks when present).

    ``prefer`` (rank, source) names the source to keep where that rank has it; otherwise the
    source with the most rows that name their group members, then the most rows, then by name.
    Returns (kept rows, {rank: [dropped sources]}).
    """
    if df.is_empty() or "source" not in df.columns:
        return df, {}
    # a select, not df["source"], which would write a broadcast column's rows into the frame
    nulls, same = df.select(pl.col("source").null_count().alias("n"),
                            (pl.col("source") == pl.col("source").first()).all().alias("same")).row(0)
    if nulls == 0 and same:
        return df, {}  # one source in all: a compare, not a group-by of every row (67 -> 5 ms, AR tiled 16x)
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


def one_source_each(frames: JobFrames, notes: list[str]) -> JobFrames:
    """comm_op and step_mark with one source per rank (see module docstring)."""
    comm, dropped = one_source_per_rank(frames.comm_op)
    comp = frames.compute_op
    pref = None
    if not frames.step_mark.is_empty():  # the preference is read only for step marks
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
