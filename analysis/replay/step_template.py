"""One step's dependency structure, shared by every step of a job: replay all steps as columns.

A what-if replays the whole job ~100 times. Its graph is the same every step
on most jobs (the same ranks run the same schedule), yet the replay plan was
built over all steps (9 M ops at 4,096 GPUs x 20 steps: 8 s), and each replay
walked every step's waves one after another. When the steps are copies of one
another, one step's plan serves all of them: the replay runs every wave once
on a (nodes x steps) matrix. The plan shrinks by the number of steps, and the
replay reads each index once for all steps (5x faster at 512 GPUs).

"Copies" is checked, not assumed: each step's ops are put in a canonical order
(rank, stream, start within the stream: the order the graph's stream edges
follow), and the steps must then have the same number of ops, the same ranks,
the same edges and the same sync groups, position by position. Any difference
(a step with an extra op, a schedule that changes, a group across steps) and
the caller replays the whole graph as before. The arithmetic per step is the
same max/add sequence either way, so the step times are bit-identical.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.collectors.record_class import record


@record
class StepTemplate:
    """Every step's ops in one canonical order: ``op_of[s, j]`` is the op at position ``j`` of step ``s``."""

    op_of: np.ndarray
    """(n_steps, ops per step) op ids."""
    src: np.ndarray
    dst: np.ndarray
    """the edges of one step, in positions (the same for every step)."""
    group: np.ndarray
    """sync group per position (-1: alone), numbered per step."""

    @property
    def n_steps(self) -> int:
        return self.op_of.shape[0]

    @property
    def n_ops(self) -> int:
        return self.op_of.shape[1]


def step_template(ops: pl.DataFrame, src: np.ndarray, dst: np.ndarray, group: np.ndarray,
                  step_index: np.ndarray, order: np.ndarray | None = None) -> StepTemplate | None:
    """The steps' shared structure, or None when the steps differ (see the module doc).

    ``ops`` needs rank, stream, start_ns in op-id order; ``step_index`` is 0..K-1 per op, in any op order
    (the OSDI'25 graph lists its ops by (dp rank, step), not by step). ``order``: a position order the
    caller knows already ((steps, ops per step) op ids, e.g. the OSDI'25 graph's own per-instance
    template), used instead of the canonical sort when it holds every op once with row s in step s; the
    checks below are the same either way.
    """
    n = ops.height
    if n == 0 or src.size == 0:
        return None
    si = np.asarray(step_index)
    if si.size != n or si.min() < 0:
        return None
    n_steps = int(si.max()) + 1
    counts = np.bincount(si, minlength=n_steps)
    if n_steps < 2 or np.any(counts != counts[0]):
        return None
    n_loc = int(counts[0])
    op_of = _given_order(order, si, n_steps, n_loc)
    if op_of is None:
        # canonical order within each step: (rank, stream, start), ties kept in op order
        keyed = ops.select("rank", pl.col("stream").cast(pl.Categorical).to_physical().alias("sc"), "start_ns") \
            .with_columns(pl.Series("si", si), pl.int_range(pl.len(), dtype=pl.Int64).alias("i"))
        op_of = keyed.sort("si", "rank", "sc", "start_ns", maintain_order=True)["i"].to_numpy().reshape(n_steps, n_loc)
        del keyed
    rank = ops["rank"].to_numpy()[op_of]
    if np.any(rank != rank[:1]):
        return None
    pos = np.empty(n, dtype=np.int64)
    pos[op_of] = np.arange(n_loc, dtype=np.int64)[None, :]
    # edges: within a step, and the same (position, position) set in every step
    e_step = si[src]
    if np.any(e_step != si[dst]):
        return None
    e_counts = np.bincount(e_step, minlength=n_steps)
    if np.any(e_counts != e_counts[0]):
        return None
    n_e = int(e_counts[0])
    key = (e_step.astype(np.int64) * n_loc + pos[src]) * n_loc + pos[dst]
    key.sort()
    key = key.reshape(n_steps, n_e) - (np.arange(n_steps, dtype=np.int64) * n_loc * n_loc)[:, None]
    if np.any(key != key[:1]):
        return None
    t_src, t_dst = key[0] // n_loc, key[0] % n_loc
    del key
    # sync groups: the same partition of positions in every step, no group across steps
    g_pos = _group_positions(group, si, pos)
    if g_pos is None:
        return None
    g_loc = g_pos[op_of]
    if np.any(g_loc != g_loc[:1]):
        return None
    it = np.int32 if n < 2**31 - 1 else np.int64
    return StepTemplate(op_of.astype(it), t_src.astype(it), t_dst.astype(it), _renumber(g_loc[0]))


def _given_order(order: np.ndarray | None, si: np.ndarray, n_steps: int, n_loc: int) -> np.ndarray | None:
    """``order`` as (steps, ops per step) op ids when it lists every op once and row s holds step s's ops;
    else None (the caller sorts)."""
    if order is None or order.size != si.size:
        return None
    op_of = np.asarray(order, dtype=np.int64).reshape(n_steps, n_loc) if order.size == n_steps * n_loc else None
    if op_of is None or np.any(np.bincount(op_of.ravel(), minlength=si.size) != 1):
        return None
    if np.any(si[op_of] != np.arange(n_steps)[:, None]):
        return None
    return op_of


def _group_positions(group: np.ndarray, si: np.ndarray, pos: np.ndarray) -> np.ndarray | None:
    """Per op, the lowest position among its sync group's members (-1: alone); None when a group
    spans steps."""
    synced = group >= 0
    if not synced.any():
        return np.full(group.size, -1, dtype=np.int64)
    # scatters over the dense group ids: a polars group-by of 1.1 M synced ops took 7x longer
    g, s, p = group[synced], si[synced], pos[synced]
    big = np.iinfo(np.int64).max
    s0, s1, p0 = (np.full(int(g.max()) + 1, v, dtype=np.int64) for v in (big, -1, big))
    np.minimum.at(s0, g, s)
    np.maximum.at(s1, g, s)
    np.minimum.at(p0, g, p)
    if np.any(s0 != s1, where=s1 >= 0):
        return None
    out = np.full(group.size, -1, dtype=np.int64)
    out[synced] = p0[g]
    return out


def _renumber(g_low: np.ndarray) -> np.ndarray:
    """Groups named by their lowest position -> 0..k-1 (-1 stays)."""
    out = np.full(g_low.size, -1, dtype=np.int64)
    m = g_low >= 0
    if m.any():
        _, out[m] = np.unique(g_low[m], return_inverse=True)
    return out
