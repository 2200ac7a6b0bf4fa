"""Hand-built flow records shared by the flows-only diagnosis tests."""

import polars as pl

STEP = 1_000_000_000
COLS = ["src_addr", "dst_addr", "start_ns", "end_ns", "est_bytes", "is_data"]


def frame(rows):
    return pl.DataFrame(rows, schema=COLS, orient="row")
