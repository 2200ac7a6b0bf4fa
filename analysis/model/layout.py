"""The one layout of a job: each rank's stage, dp rank, tp rank and pipeline, from its records' columns, else from its white-box strategy's groups."""

from __future__ import annotations

import polars as pl

from rankscope.analysis.report.strategy import Strategy
from rankscope.collectors.job_frames import JobFrames

LAYOUT_SCHEMA = {"rank": pl.Int64, "stage": pl.Int64, "dp_rank": pl.Int64, "tp_rank": pl.Int64,
                 "pipeline": pl.Int64, "source": pl.Utf8}


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
