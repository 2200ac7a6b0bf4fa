"""Hand-built GEMM compute_op frames shared by the GEMM/regression tests."""

from __future__ import annotations

import polars as pl

KERNEL = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_align8"


def gemm_frame(shapes=((4096, 4096, 4096), (4096, 8192, 4096)), ranks=4, calls=3, dur_ns=200_000,
               slow=None, dtype="bfloat16", kernel=KERNEL, kernel_of=None, jitter=True) -> pl.DataFrame:
    """compute_op rows: every rank runs every shape ``calls`` times.

    ``slow`` maps (rank, shape) or rank -> duration factor; ``kernel_of`` maps (rank, shape) -> kernel name.
    Durations get a few ns of jitter, as from a nanosecond timer (round values would read as a coarse tick).
    """
    slow, kernel_of = slow or {}, kernel_of or {}
    rows, t = [], 0
    for r in range(ranks):
        for shape in shapes:
            f = slow.get((r, shape), slow.get(r, 1.0))
            for c in range(calls):
                d = int(dur_ns * f) + (1 + c if jitter else 0)
                rows.append({"job": "j", "rank": r, "name": kernel_of.get((r, shape), kernel), "category": "gemm",
                             "start_ns": t, "end_ns": t + d, "step": 0, "m": shape[0], "n": shape[1],
                             "k": shape[2], "dtype": dtype})
                t += d + 100
    return pl.DataFrame(rows)
