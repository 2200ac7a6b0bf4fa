"""Replay one dependency graph under many duration sets at once (the what-if scenarios).

:func:`rankscope.analysis.replay.replay` recomputes the graph's structure
(sync groups, CSR of edges, waves) on every call; a what-if analysis replays
the same graph 40-100 times with other durations only. Here the structure is
computed once (:func:`plan_replay`) and :func:`replay_many` runs every wave
on a (ops x scenarios) matrix, so the index work is shared by all scenarios
and numpy's per-call overhead is paid once per wave, not once per wave and
scenario. The arithmetic is the same max/add sequence as ``replay``'s, so the
results are bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankscope.analysis.replay import CycleError, _gather


@dataclass(frozen=True)
class Wave:
    """One wave, in the plan's wave-ordered numbering: its super-nodes and member ops are contiguous."""

    lo: int
    hi: int
    """super-nodes lo:hi are computed in this wave."""
    op_lo: int
    op_hi: int
    """their member ops are op_lo:op_hi, grouped by super-node."""
    seg: np.ndarray
    """start of each super-node's members within op_lo:op_hi (for maximum.reduceat)."""
    tgt: np.ndarray
    """distinct ops with an in-edge from this wave."""
    edge_src: np.ndarray
    """source super-node of each such edge, grouped by target."""
    tgt_seg: np.ndarray
    """start of each target's edges in ``edge_src``."""


@dataclass(frozen=True)
class ReplayPlan:
    """The structure of a dependency graph, independent of durations.

    Ops and super-nodes are renumbered in wave order so that each wave reads
    and writes contiguous slices: the replay is bound by memory access, and
    scattered gathers over millions of ops were most of its time.
    """

    n: int
    n_super: int
    op_order: np.ndarray
    """original op id of each wave-ordered op."""
    super_of_op: np.ndarray
    """wave-ordered super-node of each *original* op (to map results back)."""
    m_seg: np.ndarray
    """start of each super-node's members among the wave-ordered ops."""
    roots: np.ndarray
    """wave-ordered ops without predecessors (released at 0)."""
    waves: tuple[Wave, ...]

    @property
    def nbytes(self) -> int:
        arrays = [self.op_order, self.super_of_op, self.m_seg, self.roots]
        for w in self.waves:
            arrays += [w.seg, w.tgt, w.edge_src, w.tgt_seg]
        return sum(a.nbytes for a in arrays)


def _idx(a: np.ndarray, n: int) -> np.ndarray:
    # int32 indices halve the plan's memory on big jobs (4,096 GPUs: ~10 M nodes)
    return a.astype(np.int32 if n < 2**31 - 1 else np.int64, copy=False)


def plan_replay(n: int, src: np.ndarray, dst: np.ndarray, sync_group: np.ndarray | None = None,
                block: np.ndarray | None = None) -> ReplayPlan:
    """Waves of a graph of ``n`` ops with edges ``src -> dst`` and sync groups (-1: alone), as ``replay``.

    ``block`` (optional, per op, e.g. the step): independent components, replayed one after another
    for memory locality; ignored when an edge or a sync group joins two blocks.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if sync_group is None:
        node = np.arange(n)
    else:
        g = np.asarray(sync_group, dtype=np.int64)
        key = np.where(g < 0, -(np.arange(n) + 1), g)
        _, node = np.unique(key, return_inverse=True)
        node = node.reshape(-1)
    n_super = int(node.max()) + 1 if n else 0
    ssrc, sdst = node[src], node[dst]
    if np.any(ssrc == sdst):
        raise CycleError(f"{int(np.sum(ssrc == sdst))} dependency edges lie inside one sync group")
    order = np.argsort(ssrc, kind="stable")
    e_src, e_dst_op = ssrc[order], dst[order]
    e_dst = node[e_dst_op]
    offsets = np.zeros(n_super + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(np.bincount(ssrc, minlength=n_super))
    indeg = np.bincount(sdst, minlength=n_super)
    has_pred = np.zeros(n, dtype=bool)
    has_pred[dst] = True
    members = np.argsort(node, kind="stable")
    m_off = np.zeros(n_super + 1, dtype=np.int64)
    m_off[1:] = np.cumsum(np.bincount(node, minlength=n_super))

    # first pass: the wave of every super-node
    wave_of = np.empty(n_super, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    stamp = np.empty(n_super, dtype=np.int64)
    processed = wave_no = 0
    while frontier.size:
        processed += frontier.size
        wave_of[frontier] = wave_no
        wave_no += 1
        eidx = _gather(offsets, frontier)
        if eidx.size == 0:
            break
        tgt = e_dst[eidx]
        np.subtract.at(indeg, tgt, 1)
        cand = tgt[indeg[tgt] == 0]
        pos = np.arange(cand.size)
        stamp[cand] = pos
        frontier = cand[stamp[cand] == pos]
    if processed != n_super:
        raise CycleError(f"{n_super - processed} of {n_super} op groups are on a dependency cycle")

    # renumber super-nodes by (block, wave) and ops with them: each block's waves touch one small,
    # contiguous, cache-resident range instead of the whole job's arrays
    s_block = np.zeros(n_super, dtype=np.int64)
    if block is not None:
        b = np.asarray(block, dtype=np.int64)
        s_block[node] = b
        if np.any(s_block[node] != b) or np.any(b[src] != b[dst]):
            s_block[:] = 0  # blocks that share groups or edges are no independent components
    super_order = np.lexsort((wave_of, s_block))
    new_super = np.empty(n_super, dtype=np.int64)
    new_super[super_order] = np.arange(n_super)
    op_order = members[_gather(m_off, super_order)] if n_super else np.zeros(0, np.int64)
    new_op = np.empty(n, dtype=np.int64)
    new_op[op_order] = np.arange(n)
    m_counts = m_off[super_order + 1] - m_off[super_order]
    op_start = np.r_[0, np.cumsum(m_counts)] if n_super else np.zeros(1, np.int64)
    key = s_block[super_order] * (wave_no + 1) + wave_of[super_order]
    cuts = np.r_[np.flatnonzero(np.r_[True, key[1:] != key[:-1]]), n_super] if n_super else np.zeros(1, np.int64)
    waves = []
    for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        frontier = super_order[lo:hi]
        seg = op_start[lo:hi] - op_start[lo]
        eidx = _gather(offsets, frontier)
        tgt_ops = new_op[e_dst_op[eidx]]
        by_tgt = np.argsort(tgt_ops, kind="stable")
        tgt_sorted = tgt_ops[by_tgt]
        first = np.flatnonzero(np.r_[True, tgt_sorted[1:] != tgt_sorted[:-1]]) if tgt_sorted.size else \
            np.zeros(0, dtype=np.int64)
        waves.append(Wave(lo, hi, int(op_start[lo]), int(op_start[hi]), _idx(seg, n),
                          _idx(tgt_sorted[first], n), _idx(new_super[e_src[eidx][by_tgt]], n), _idx(first, n)))
    m_seg = op_start[:-1]
    return ReplayPlan(n, n_super, _idx(op_order, n), _idx(new_super[node], n), _idx(m_seg, n),
                      _idx(new_op[np.flatnonzero(~has_pred)], n), tuple(waves))


def replay_waves(plan: ReplayPlan, duration: np.ndarray, launch_delay: np.ndarray | None = None) -> np.ndarray:
    """End time of every super-node, ``duration`` and ``launch_delay`` already in the plan's op order.

    1-D (n,) or 2-D (n, K) durations; the result has the matching shape (n_super[, K]). Roots start at 0.
    """
    dur = np.asarray(duration, dtype=np.float64)
    shape = (plan.n_super,) + dur.shape[1:]
    if plan.n == 0:
        return np.zeros(shape)
    s_dur = np.maximum.reduceat(dur, plan.m_seg, axis=0)
    delay = launch_delay
    if delay is not None and dur.ndim == 2:
        delay = delay[:, None]
    pred_end = np.full(dur.shape, -np.inf)
    pred_end[plan.roots] = 0.0
    s_end = np.empty(shape)
    for w in plan.waves:
        ready = pred_end[w.op_lo:w.op_hi]
        if delay is not None:
            ready = ready + delay[w.op_lo:w.op_hi]
        s_end[w.lo:w.hi] = np.maximum.reduceat(ready, w.seg, axis=0) + s_dur[w.lo:w.hi]
        if w.tgt.size:
            upd = np.maximum.reduceat(s_end[w.edge_src], w.tgt_seg, axis=0)
            pred_end[w.tgt] = np.maximum(pred_end[w.tgt], upd)
    return s_end


def replay_many(plan: ReplayPlan, duration: np.ndarray, launch_delay: np.ndarray | None = None) -> np.ndarray:
    """End time of every op (n, K) for K duration sets ``duration`` (n, K); roots are released at 0.

    ``launch_delay`` (n,) is the same in every scenario. Equal to ``replay(...).end`` column by column.
    """
    dur = np.asarray(duration, dtype=np.float64)
    delay = None if launch_delay is None else np.asarray(launch_delay, dtype=np.float64)[plan.op_order]
    return replay_waves(plan, dur[plan.op_order], delay)[plan.super_of_op]
