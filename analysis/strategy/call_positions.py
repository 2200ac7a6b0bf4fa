"""Where a collective sits in the step tells its role: tensor-parallel calls run inside every forward and
backward pass, the data-parallel reduction runs once after the last backward.

Megatron's TP all-reduces (or, with sequence parallelism, all-gathers and reduce-scatters) are part of each
layer's forward and backward; DP reduces the gradients after the last backward of the step (overlapped
reductions start inside the last backward, never in a forward). One profiled step holds both, so a single
step is enough to tell them apart, where the records mark the passes (compute_op spans of category
``forward``/``backward``: torch.profiler ``record_function`` ranges, hook spans). FSDP's parameter
all-gathers also run in forward, but it reduces nothing there: a family is TP only when it reduces inside
a forward and calls inside a backward.
"""

from __future__ import annotations

import polars as pl

PASSES = ("forward", "backward")
REDUCTIONS = ("all_reduce", "reduce_scatter")

POSITION_COUNTS = ("n_fwd_reduce", "n_fwd", "n_bwd", "n_placed")
"""per-family call counts :func:`position_counts` aggregates and :func:`position_role` reads"""


def pass_spans(compute_op: pl.DataFrame) -> pl.DataFrame:
    """The forward and backward spans of each rank: rank, start_ns, end_ns, category.

    Needs compute_op columns rank, category, start_ns, end_ns (an empty frame without them)."""
    cols = ("rank", "category", "start_ns", "end_ns")
    if compute_op.is_empty() or not all(c in compute_op.columns for c in cols):
        return pl.DataFrame(schema={"rank": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "category": pl.String})
    # selected before filtered: an eager filter copies every column it carries (compute_op's ~20)
    return (compute_op.select(pl.col("rank").cast(pl.Int64), pl.col("start_ns").cast(pl.Int64),
                              pl.col("end_ns").cast(pl.Int64), pl.col("category").cast(pl.String))
            .filter(pl.col("category").is_in(PASSES) & pl.col("start_ns").is_not_null()
                    & pl.col("end_ns").is_not_null()))


def with_pass(comm_op: pl.DataFrame, spans: pl.DataFrame | None) -> pl.DataFrame:
    """comm_op with ``_pass``: ``forward``/``backward`` for a call that starts inside such a span of its
    rank, ``outside`` for a call of a rank with spans that starts in none, null for a rank without spans.

    Needs comm_op rank, start_ns; ``spans`` as :func:`pass_spans` returns."""
    if spans is None or spans.is_empty() or comm_op.is_empty():
        return comm_op.with_columns(pl.lit(None, dtype=pl.String).alias("_pass"))
    left = comm_op.select(pl.col("rank").cast(pl.Int64), pl.col("start_ns").cast(pl.Int64)).with_row_index("_i")
    right = spans.sort("start_ns").rename({"start_ns": "_s", "end_ns": "_e", "category": "_cat"})
    placed = (left.filter(pl.col("start_ns").is_not_null()).sort("start_ns")
              .join_asof(right, left_on="start_ns", right_on="_s", by="rank", strategy="backward",
                         check_sortedness=False)
              .select("_i", pl.when(pl.col("start_ns") <= pl.col("_e")).then(pl.col("_cat"))
                      .otherwise(pl.lit("outside")).alias("_pass")))
    has_spans = spans["rank"].unique().implode()
    # back in row order: when every call has a start, ``placed`` holds every row and a sort on the row index
    # is that order (the join on it, then the sort, were half of this function at 1,024 workers)
    back = (left.select("rank", placed.sort("_i")["_pass"]) if placed.height == left.height
            else left.join(placed, on="_i", how="left").sort("_i"))
    out = back.select(pl.when(pl.col("rank").is_in(has_spans)).then(pl.col("_pass")).alias("_pass"))
    return comm_op.with_columns(out["_pass"])


def position_counts() -> list[pl.Expr]:
    """Aggregations of a family's calls by where they sit (see :data:`POSITION_COUNTS`), over ``_pass``."""
    fwd = pl.col("_pass") == "forward"
    return [(fwd & pl.col("op").is_in(REDUCTIONS)).sum().alias("n_fwd_reduce"), fwd.sum().alias("n_fwd"),
            (pl.col("_pass") == "backward").sum().alias("n_bwd"), pl.col("_pass").is_not_null().sum().alias("n_placed")]


def position_role(counts: dict) -> str | None:
    """``tp``, ``dp`` or None (the records do not place the calls, or they sit both ways) for a family.

    TP: it reduces inside a forward and calls inside a backward. DP: none of its placed calls sits inside a
    forward (gradient reductions after, or overlapped with, the last backward)."""
    if not counts.get("n_placed"):
        return None
    if counts["n_fwd_reduce"] > 0 and counts["n_bwd"] > 0:
        return "tp"
    if counts["n_fwd"] == 0:
        return "dp"
    return None
