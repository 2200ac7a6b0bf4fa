"""Hand-built flow records and edges shared by the flows-only tests."""

import polars as pl

STEP = 1_000_000_000
COLS = ["src_addr", "dst_addr", "start_ns", "end_ns", "est_bytes", "is_data"]


def frame(rows):
    return pl.DataFrame(rows, schema=COLS, orient="row")


def directed_edges(rows):
    """Edges from (a, b, bytes a->b, bytes b->a, first_ab, first_ba) with the payload columns peeling reads."""
    e = pl.DataFrame(rows, schema=["a", "b", "data_ab", "data_ba", "first_ab", "first_ba"], orient="row")
    return e.with_columns(bytes=pl.col("data_ab") + pl.col("data_ba"), bytes_ab="data_ab", bytes_ba="data_ba",
                          data_symmetry=pl.min_horizontal("data_ab", "data_ba")
                          / pl.max_horizontal("data_ab", "data_ba"))


def endpoints(e):
    return set(e["a"].to_list()) | set(e["b"].to_list())
