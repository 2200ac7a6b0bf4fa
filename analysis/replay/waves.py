"""Replay one dependency graph under many duration sets at once (the what-if scenarios).

:func:`rankscope.analysis.replay.engine.replay` recomputes the graph's structure
(sync groups, CSR of edges, waves) on every call; a what-if analysis replays
the same graph 40-100 times with other durations only. Here the structure is
computed once (:func:`plan_replay`) and :func:`replay_many` runs every wave
on a (ops x scenarios) matrix, so the index work is shared by all scenarios
and numpy's per-call overhead is paid once per wave, not once per wave and
scenario. The arithmetic is the same max/add sequence as ``replay``'s, so the
results are bit-identical.
"""

from __future__ import annotations

import numpy as np

from rankscope.analysis.replay.engine import CycleError, csr_gather
from rankscope.collectors.record_class import record


@record
class Wave:
    """One wave, in the plan's wave-ordered numbering: its super-nodes and member ops are contiguous.

    Within a wave, super-nodes are ordered by member count and edge targets by in-edge count (and
    whether this is the first wave to reach them), so every reduction is a 2-D ``max(axis=1)`` over a
    run of equal-sized segments: numpy's ``reduceat`` costs ~10 ns per segment, and most segments
    here have one member.
    """

    lo: int
    hi: int
    """super-nodes lo:hi are computed in this wave."""
    op_lo: int
    op_hi: int
    """their member ops are op_lo:op_hi, grouped by super-node."""
    node_runs: tuple
    """(s_lo, s_hi, o_lo, o_hi, size): super-nodes s_lo:s_hi have ``size`` members each, ops o_lo:o_hi."""
    tgt: np.ndarray
    """distinct ops with an in-edge from this wave, in run order."""
    edge_src: np.ndarray
    """source super-node of each such edge, grouped by target in ``tgt`` order."""
    edge_runs: tuple
    """(targets, sources, count, fresh): views into tgt/edge_src; each target has ``count`` edges here;
    ``fresh``: no earlier wave reaches these targets (their predecessor end is still -inf)."""


@record
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
            arrays += [w.tgt, w.edge_src]
        return sum(a.nbytes for a in arrays)


_ZERO = np.zeros(1, np.int64)


def _run_bounds(change: np.ndarray, size: int) -> np.ndarray:
    """Where runs begin (``change[i]``: element i+1 differs from element i), then ``size``.

    np.concatenate, not np.r_: this runs a few times per wave, thousands of waves per plan, and np.r_'s
    Python-level parsing was a third of a 117k-op job's planning time."""
    return np.concatenate((_ZERO, np.flatnonzero(change) + 1, np.array([size], np.int64)))


def _edge_runs(tgt_ops: np.ndarray, e_from: np.ndarray, reached: np.ndarray, n: int):
    """One wave's edges ordered by (fresh, in-edge count, target): runs of equal count reshape to 2-D.

    ``reached`` (per op) marks the targets of earlier waves; this wave's targets are added to it."""
    if tgt_ops.size == 0:
        z = _idx(np.zeros(0, np.int64), n)
        return z, z, ()
    uniq, inv, cnt = np.unique(tgt_ops, return_inverse=True, return_counts=True)
    fresh = ~reached[uniq]
    reached[uniq] = True
    e_cnt, e_fresh = cnt[inv], fresh[inv]
    order = np.lexsort((tgt_ops, e_cnt, ~e_fresh))
    src_sorted = _idx(e_from[order], n)
    t_order = np.lexsort((uniq, cnt, ~fresh))
    tgt = _idx(uniq[t_order], n)
    t_cnt, t_fresh = cnt[t_order], fresh[t_order]
    cut = _run_bounds((t_cnt[1:] != t_cnt[:-1]) | (t_fresh[1:] != t_fresh[:-1]), tgt.size)
    e_at = np.concatenate((_ZERO, np.cumsum(t_cnt)))
    runs = tuple((tgt[a:b], src_sorted[e_at[a]:e_at[b]], int(t_cnt[a]), bool(t_fresh[a]))
                 for a, b in zip(cut[:-1].tolist(), cut[1:].tolist(), strict=True))
    return tgt, src_sorted, runs


def _super_nodes(g: np.ndarray) -> np.ndarray:
    """Super-node of each op: ops of one sync group (>= 0) share one, every other op (-1) has its own.

    Numbered as ``np.unique(where(g < 0, -(i + 1), g), return_inverse=True)`` would (lone ops first, the
    last op lowest; then groups by id), in linear time instead of a sort of every op.
    """
    lone = g < 0
    n_lone = int(lone.sum())
    node = np.empty(g.size, dtype=np.int64)
    node[lone] = n_lone - np.cumsum(lone)[lone]
    if n_lone < g.size:
        gs = g[~lone]
        present = np.bincount(gs) > 0
        node[~lone] = n_lone + (np.cumsum(present) - 1)[gs]
    return node


def _crosses(block: np.ndarray, src: np.ndarray, dst: np.ndarray, chunk: int = 1 << 22) -> bool:
    """Whether an edge joins two blocks; in chunks, so no edge-sized temporaries."""
    return any(np.any(block[src[i:i + chunk]] != block[dst[i:i + chunk]]) for i in range(0, src.size, chunk))


def _idx(a: np.ndarray, n: int) -> np.ndarray:
    # int32 indices halve the plan's memory on big jobs (4,096 GPUs: ~10 M nodes)
    return a.astype(np.int32 if n < 2**31 - 1 else np.int64, copy=False)


def _index_arrays(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, type]:
    """``src``, ``dst`` as integer arrays, and the working index type of a plan of ``n`` ops.

    Integer indices stay as given (an int32 edge list stays int32: no int64 copy of 16 M edges); the
    working indices are int32 where they fit: the plan of a big job (4,096 GPUs: 9 M ops, 16 M edges)
    is built from a dozen edge-sized arrays, and their width sets the analysis' peak memory."""
    src, dst = np.asarray(src), np.asarray(dst)
    if src.dtype.kind not in "iu" or dst.dtype.kind not in "iu":
        src, dst = src.astype(np.int64), dst.astype(np.int64)
    return src, dst, np.int32 if max(n, src.size) < 2**31 - 1 else np.int64


def _offsets(counts: np.ndarray) -> np.ndarray:
    """CSR offsets (int64, one more than ``counts``) of segments of ``counts`` entries each."""
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(counts)
    return offsets


def _super_edge_csr(node: np.ndarray, src: np.ndarray, dst: np.ndarray, n_super: int, it: type
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The edges between super-nodes (``node``: per op) grouped by source super-node (CSR).

    Returns (in-degree per super-node, offsets per source super-node, target op of each edge in CSR
    order, as ``it``). Raises CycleError for an edge inside one sync group (a self-wait)."""
    ssrc, sdst = node[src], node[dst]
    if np.any(ssrc == sdst):
        raise CycleError(f"{int(np.sum(ssrc == sdst))} dependency edges lie inside one sync group")
    indeg = np.bincount(sdst, minlength=n_super)
    del sdst
    offsets = _offsets(np.bincount(ssrc, minlength=n_super))
    # the source of edge e is implied by offsets
    e_dst_op = dst[np.argsort(ssrc, kind="stable")].astype(it)
    return indeg, offsets, e_dst_op


def _wave_numbers(offsets: np.ndarray, e_dst: np.ndarray, indeg: np.ndarray) -> tuple[np.ndarray, int]:
    """The wave of every super-node (Kahn's algorithm, one numpy step per wave) and the number of waves.

    ``offsets``/``e_dst``: the CSR of super-node edges; ``indeg`` (per super-node) is used up. Raises
    CycleError when some super-nodes are on a cycle."""
    n_super = indeg.size
    wave_of = np.empty(n_super, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    stamp = np.empty(n_super, dtype=np.int64)
    processed = wave_no = 0
    while frontier.size:
        processed += frontier.size
        wave_of[frontier] = wave_no
        wave_no += 1
        eidx = csr_gather(offsets, frontier)
        if eidx.size == 0:
            break
        tgt = e_dst[eidx]
        np.subtract.at(indeg, tgt, 1)
        cand = tgt[indeg[tgt] == 0]
        pos = np.arange(cand.size)
        stamp[cand] = pos
        frontier = cand[stamp[cand] == pos]
    del stamp
    if processed != n_super:
        raise CycleError(f"{n_super - processed} of {n_super} op groups are on a dependency cycle")
    return wave_of, wave_no


BLOCK_OPS = 1 << 20
"""ops per block of independent components at least (see :func:`_super_blocks`)."""


def _super_blocks(block: np.ndarray | None, node: np.ndarray, src: np.ndarray, dst: np.ndarray,
                  n_super: int, block_ops: int = BLOCK_OPS) -> np.ndarray:
    """The block of every super-node; all 0 without ``block`` (per op) or when blocks share a sync
    group or an edge (then they are no independent components).

    Consecutive blocks are merged until each holds about ``block_ops`` ops: every (block, wave) pair is
    one pass of numpy calls, and a deep graph cut into small blocks (a 117k-op job's 44 steps: 8,140
    waves of ~14 ops) spent its planning and replay on per-call overhead, while a block of this size
    still fits the caches the blocks are for."""
    s_block = np.zeros(n_super, dtype=np.int64)
    if block is not None:
        b = np.asarray(block, dtype=np.int64)
        s_block[node] = b
        if np.any(s_block[node] != b) or _crosses(b, src, dst):
            s_block[:] = 0
        elif b.size:
            lo = int(b.min())
            sizes = np.bincount(b - lo)
            before = np.cumsum(sizes) - sizes  # ops in the blocks before each block
            s_block = (before // max(1, block_ops))[s_block - lo]
    return s_block


def _wave_major_order(s_block: np.ndarray, wave_of: np.ndarray, m_count: np.ndarray, n_waves: int) -> np.ndarray:
    """Super-nodes ordered by (block, wave, member count), as ``lexsort((m_count, wave_of, s_block))``.

    One stable sort of a combined key where it fits in 62 bits: the same order at a third of the cost."""
    n_super = s_block.size
    top_m, top_w = int(m_count.max()) + 1 if n_super else 1, n_waves + 1
    if (int(s_block.max()) + 1 if n_super else 1) * top_w * top_m < 2**62:
        return np.argsort((s_block * top_w + wave_of) * top_m + m_count, kind="stable")
    return np.lexsort((m_count, wave_of, s_block))


def _inverse(order: np.ndarray, it: type) -> np.ndarray:
    """The inverse permutation of ``order`` (new number of each old index), as ``it``."""
    inv = np.empty(order.size, dtype=it)
    inv[order] = np.arange(order.size, dtype=it)
    return inv


def _wave_cuts(s_block: np.ndarray, wave_of: np.ndarray, super_order: np.ndarray, n_waves: int) -> np.ndarray:
    """Where each (block, wave) begins among the renumbered super-nodes, with their count at the end."""
    n_super = super_order.size
    if not n_super:
        return np.zeros(1, np.int64)
    key = s_block[super_order] * (n_waves + 1) + wave_of[super_order]
    return np.r_[np.flatnonzero(np.r_[True, key[1:] != key[:-1]]), n_super]


def _node_runs(m_counts: np.ndarray, op_start: np.ndarray, lo: int, hi: int) -> tuple:
    """The runs of equal member count among super-nodes lo:hi (see Wave.node_runs)."""
    sizes = m_counts[lo:hi]
    rc = _run_bounds(sizes[1:] != sizes[:-1], hi - lo) + lo
    return tuple((a, b, int(op_start[a]), int(op_start[b]), int(m_counts[a]))
                 for a, b in zip(rc[:-1].tolist(), rc[1:].tolist(), strict=True))


def _waves(cuts: np.ndarray, m_counts: np.ndarray, op_start: np.ndarray, super_order: np.ndarray,
           offsets: np.ndarray, e_dst_op: np.ndarray, new_op: np.ndarray) -> tuple[Wave, ...]:
    """Every wave, in processing order, in the renumbered ops and super-nodes.

    ``cuts``: wave bounds among new super-nodes; ``m_counts``/``op_start``: member count and first op
    of each new super-node; ``super_order``: old super-node of each new one; ``offsets``/``e_dst_op``:
    the CSR of edges by old source super-node, to old target ops; ``new_op``: new number of each op."""
    n, it = new_op.size, new_op.dtype
    out_deg = offsets[1:] - offsets[:-1]
    reached = np.zeros(n, dtype=bool)  # ops an earlier wave (in processing order) has an edge to
    waves = []
    for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        wave_supers = super_order[lo:hi]
        eidx = csr_gather(offsets, wave_supers)
        tgt_ops = new_op[e_dst_op[eidx]]
        # the edges of super-node super_order[k] come from new super-node k, in CSR order
        e_from = np.repeat(np.arange(lo, hi, dtype=it), out_deg[wave_supers])
        tgt, edge_src, edge_runs = _edge_runs(tgt_ops, e_from, reached, n)
        waves.append(Wave(lo, hi, int(op_start[lo]), int(op_start[hi]), _node_runs(m_counts, op_start, lo, hi),
                          tgt, edge_src, edge_runs))
    return tuple(waves)


def plan_replay(n: int, src: np.ndarray, dst: np.ndarray, sync_group: np.ndarray | None = None,
                block: np.ndarray | None = None, block_ops: int = BLOCK_OPS) -> ReplayPlan:
    """Waves of a graph of ``n`` ops with edges ``src -> dst`` and sync groups (-1: alone), as ``replay``.

    ``block`` (optional, per op, e.g. the step): independent components, replayed one after another
    for memory locality, merged up to ``block_ops`` ops each; ignored when an edge or a sync group joins
    two blocks.
    """
    src, dst, it = _index_arrays(n, src, dst)
    if sync_group is None:
        node = np.arange(n, dtype=it)
    else:
        node = _super_nodes(np.asarray(sync_group, dtype=np.int64)).astype(it)
    n_super = int(node.max()) + 1 if n else 0
    indeg, offsets, e_dst_op = _super_edge_csr(node, src, dst, n_super, it)
    e_dst = node[e_dst_op]
    has_pred = np.zeros(n, dtype=bool)
    has_pred[dst] = True
    members = np.argsort(node, kind="stable").astype(it)
    m_off = _offsets(np.bincount(node, minlength=n_super))
    wave_of, n_waves = _wave_numbers(offsets, e_dst, indeg)
    del e_dst, indeg

    # renumber super-nodes by (block, wave) and ops with them: each block's waves touch one small,
    # contiguous, cache-resident range instead of the whole job's arrays
    s_block = _super_blocks(block, node, src, dst, n_super, block_ops)
    m_count = m_off[1:] - m_off[:-1]
    super_order = _wave_major_order(s_block, wave_of, m_count, n_waves)
    new_super = _inverse(super_order, it)
    op_order = members[csr_gather(m_off, super_order)] if n_super else np.zeros(0, it)
    del members, m_off
    # the plan's op-side maps, before the wave loop, so their inputs are freed before it runs
    super_of_op = _idx(new_super[node], n)
    del new_super, node
    new_op = _inverse(op_order, it)
    roots = _idx(new_op[np.flatnonzero(~has_pred)], n)
    del has_pred
    m_counts = m_count[super_order]
    del m_count
    op_start = np.r_[0, np.cumsum(m_counts)] if n_super else np.zeros(1, np.int64)
    cuts = _wave_cuts(s_block, wave_of, super_order, n_waves)
    del wave_of, s_block
    waves = _waves(cuts, m_counts, op_start, super_order, offsets, e_dst_op, new_op)
    m_seg = op_start[:-1]
    return ReplayPlan(n, n_super, _idx(op_order, n), super_of_op, _idx(m_seg, n), roots, waves)


def replay_waves(plan: ReplayPlan, duration: np.ndarray, launch_delay: np.ndarray | None = None,
                 work: dict | None = None, zero_groups: bool = False) -> np.ndarray:
    """End time of every super-node, ``duration`` and ``launch_delay`` already in the plan's op order.

    1-D (n,) or 2-D (n, K) durations; the result has the matching shape (n_super[, K]). Roots start at 0.
    ``launch_delay``: (n,), the same in every column, or (n, K).
    ``work`` (optional, a dict kept by the caller) holds the large scratch arrays between calls of one
    shape: a what-if replays one plan ~100 times, and fresh arrays of millions of entries per call
    cost page faults (system time) of the same order as the replay itself. The returned array is then
    one of them, valid until the next call.
    ``zero_groups``: the caller guarantees that every op of a multi-op super-node has duration +0.0 (the
    what-if graph's sync-group members: their transfer time is a tail of its own); their maximum, 0.0,
    is then added without reading them.
    """
    dur = np.asarray(duration, dtype=np.float64)
    shape = (plan.n_super,) + dur.shape[1:]
    if plan.n == 0:
        return np.zeros(shape)
    tail = dur.shape[1:]
    delay = launch_delay
    if delay is not None and dur.ndim == 2 and np.ndim(delay) == 1:
        delay = delay[:, None]  # one delay per node, the same in every column
    if work is not None and work.get("shape") == dur.shape:
        # no reset: every op is a root or reached by an earlier wave, whose first ("fresh") edge run
        # assigns its predecessor end before its own wave reads it, so no stale value is ever read
        pred_end, s_end = work["pred_end"], work["s_end"]
    else:
        pred_end, s_end = np.full(dur.shape, -np.inf), np.empty(shape)
        if work is not None:
            work.update(shape=dur.shape, pred_end=pred_end, s_end=s_end)
    pred_end[plan.roots] = 0.0
    for w in plan.waves:
        ready = pred_end[w.op_lo:w.op_hi]
        if delay is not None:
            ready = ready + delay[w.op_lo:w.op_hi]
        for s_lo, s_hi, o_lo, o_hi, size in w.node_runs:
            r = ready[o_lo - w.op_lo:o_hi - w.op_lo]
            d = dur[o_lo:o_hi]
            if size > 1:
                r = _row_max(r.reshape((s_hi - s_lo, size) + tail))
                d = 0.0 if zero_groups else _row_max(d.reshape((s_hi - s_lo, size) + tail))
            np.add(r, d, out=s_end[s_lo:s_hi])
        for t, src, count, fresh in w.edge_runs:
            upd = s_end[src]
            if count > 1:
                upd = _row_max(upd.reshape((t.size, count) + tail))
            pred_end[t] = upd if fresh else np.maximum(pred_end[t], upd)
    return s_end


def _row_max(a: np.ndarray) -> np.ndarray:
    """max over axis 1. numpy reduces a short inner axis at ~30 ns a row; up to 16 columns, pairwise
    maxima over strided columns are 5-30x faster (max is exact, so the order does not matter)."""
    if a.shape[1] > 16:
        return a.max(axis=1)
    out = np.maximum(a[:, 0], a[:, 1])
    for j in range(2, a.shape[1]):
        np.maximum(out, a[:, j], out=out)
    return out


def replay_many(plan: ReplayPlan, duration: np.ndarray, launch_delay: np.ndarray | None = None) -> np.ndarray:
    """End time of every op (n, K) for K duration sets ``duration`` (n, K); roots are released at 0.

    ``launch_delay`` (n,) is the same in every scenario. Equal to ``replay(...).end`` column by column.
    """
    dur = np.asarray(duration, dtype=np.float64)
    delay = None if launch_delay is None else np.asarray(launch_delay, dtype=np.float64)[plan.op_order]
    return replay_waves(plan, dur[plan.op_order], delay)[plan.super_of_op]
