"""Per-(rank, step) interval unions on numpy arrays: :func:`rankscope.analysis.model.timelines.rank_timelines`
for spans that all carry a step label.

The polars form (clip by a join with the step windows, a sort per union, a running max and a group-by) lets go
of ~0.4 GB of intermediate frames on the OSDI'25 AR trace tiled 16x (1.9 M spans), and polars' allocator keeps
freed pages for a while: they lay under the what-if that runs next (or beside it). Here each span is placed in
its window by a search in the windows' packed keys, every span is sorted once by (window, clipped start), and
each union (compute, communication, both) is a pass over that one order: a few arrays of 8 bytes per span,
freed to the system. Every sum is over int64 values: the same numbers as the polars form, bit for bit.
"""

from __future__ import annotations

import numpy as np
import polars as pl

_LIMIT = 2**62
"""packed keys and lifted ends stay below this: no int64 overflow."""


def _ints(df: pl.DataFrame, col: str) -> np.ndarray:
    # numpy's cast, not polars': a polars copy would be one more page of its allocator's to keep
    return df[col].to_numpy().astype(np.int64, copy=False)


def window_of(steps: pl.DataFrame, rank: np.ndarray, step: np.ndarray) -> np.ndarray | None:
    """Per span (``rank``, ``step``) the row of ``steps`` that is its window, -1 for none; None when the
    windows' (rank, step) pairs are not unique or do not pack into one int64 key."""
    w_rank, w_step = _ints(steps, "rank"), _ints(steps, "step")
    r_lo, s_lo = int(w_rank.min()), int(w_step.min())
    s_width = int(w_step.max()) - s_lo + 1
    if (int(w_rank.max()) - r_lo + 1) * s_width >= _LIMIT:
        return None
    w_key = (w_rank - r_lo) * s_width + (w_step - s_lo)
    order = np.argsort(w_key, kind="stable")
    sorted_key = w_key[order]
    if np.any(sorted_key[1:] == sorted_key[:-1]):
        return None
    inside = (rank >= r_lo) & (rank <= int(w_rank.max())) & (step >= s_lo) & (step < s_lo + s_width)
    key = np.where(inside, (rank - r_lo) * s_width + (step - s_lo), -1)
    pos = np.minimum(np.searchsorted(sorted_key, key), sorted_key.size - 1)
    # window rows as int32 (a job has far fewer than 2**31 windows): the sort's largest arrays are per span
    return np.where(inside & (sorted_key[pos] == key), order[pos], -1).astype(np.int32)


def union_by_window(win: np.ndarray, a: np.ndarray, b: np.ndarray, n_windows: int) -> np.ndarray | None:
    """Per window the length of the union of the intervals [a, b) in it, for spans sorted by (window, a); as
    :func:`rankscope.analysis.model.timelines.union_ns` (an interval adds its part beyond the latest end of
    those before it; an empty one adds 0). None when the lifted ends would not fit in int64."""
    out = np.zeros(n_windows, dtype=np.int64)
    if win.size == 0:
        return out
    first = np.empty(win.size, dtype=bool)
    first[0] = True
    np.not_equal(win[1:], win[:-1], out=first[1:])
    lo = min(int(a.min()), int(b.min()))
    span = max(int(a.max()), int(b.max())) - lo + 1
    if (win.size + 1) * span >= _LIMIT:
        return None
    # one running max over all spans: each window's ends are lifted into a band of their own, so a max
    # never crosses a window boundary (the polars form's trick)
    band = np.cumsum(first, dtype=np.int64)
    band *= span
    run = b - lo
    run += band
    np.maximum.accumulate(run, out=run)
    prev = np.empty_like(run)
    prev[0] = 0
    np.subtract(run[:-1], band[1:], out=prev[1:])
    del run, band
    prev += lo
    # a window's first span starts from its own start
    np.copyto(prev, a, where=first)
    np.maximum(prev, a, out=prev)
    add = np.subtract(b, prev, out=prev)
    np.maximum(add, 0, out=add)
    starts = np.flatnonzero(first)
    out[win[starts]] = np.add.reduceat(add, starts)
    return out


def window_unions(steps: pl.DataFrame, comp: pl.DataFrame, comm: pl.DataFrame
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per row of ``steps`` (rank, step, start_ns, end_ns: unique windows) the union length of its compute
    spans, of its communication spans and of both, each span clipped to its step's window (``comp`` and
    ``comm``: rank, start_ns, end_ns, step, no null; communication ends already filled). None where the
    arrays cannot stand in for the polars form: a null, or a key or sum that would not fit in int64."""
    if (steps.is_empty() or steps.height >= 2**31 - 1
            or any(c.null_count() for df in (comp, comm) for c in df.get_columns())):
        return None
    n = steps.height
    w0, w1 = _ints(steps, "start_ns"), _ints(steps, "end_ns")
    wins, starts, ends, kinds = [], [], [], []
    for kind, df in enumerate((comp, comm)):
        if df.is_empty():
            continue
        w = window_of(steps, _ints(df, "rank"), _ints(df, "step"))
        if w is None:
            return None
        start, end = _ints(df, "start_ns"), _ints(df, "end_ns")
        keep = w >= 0
        keep[keep] = start[keep] < w1[w[keep]]
        w, start, end = w[keep], start[keep], end[keep]
        wins.append(w)
        starts.append(np.maximum(start, w0[w]))
        ends.append(np.minimum(end, w1[w]))
        kinds.append(np.full(w.size, kind, dtype=np.int8))
    if not wins:
        return np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    win, a, b, kind = (np.concatenate(x) for x in (wins, starts, ends, kinds))
    del wins, starts, ends, kinds
    order = _by_window_start(win, a)
    # one gather at a time: each unsorted array is freed before the next is sorted
    win = win[order]
    a = a[order]
    b = b[order]
    kind = kind[order]
    del order
    unions = []
    for pick in (kind == 0, kind == 1, None):
        u = (union_by_window(win, a, b, n) if pick is None
             else union_by_window(win[pick], a[pick], b[pick], n))
        if u is None:
            return None
        unions.append(u)
    return unions[0], unions[1], unions[2]


def _by_window_start(win: np.ndarray, a: np.ndarray) -> np.ndarray:
    """The order of spans by (window, clipped start): one int64 key where both pack, else a two-key sort."""
    lo, width = int(a.min()), int(a.max()) - int(a.min()) + 1
    if (int(win.max()) + 1) * width < _LIMIT:
        return np.argsort(win.astype(np.int64) * width + (a - lo), kind="stable")
    return np.lexsort((a, win))
