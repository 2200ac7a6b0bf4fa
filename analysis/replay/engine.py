"""The dependency-graph replay engine shared by the simulator and the what-if analysis.

A training step is a DAG of ops. Each op has a duration and a launch delay
(untraced CPU work between its latest dependency's end and its own start).
Ops that must start their transfer together (the members of one collective,
or the two sides of a send/recv pair) share a *sync group*: the group's
transfer starts when its last member is ready, and every member ends at
transfer start + the group's duration.

    ready[i]  = max(end[p] for p in preds(i), default=release[i]) + launch_delay[i]
    start[G]  = max(ready[i] for i in G)           (a lone op is its own group)
    end[i]    = start[G] + duration[G]              (duration of a group = max over members)

Replay runs Kahn's algorithm in vectorised waves: every op whose
dependencies are all finished is computed in one numpy step, so the Python
loop runs once per wave (the critical-path depth), never once per op.
"""

from __future__ import annotations

import numpy as np

from rankscope.collectors.errors import RankscopeError
from rankscope.collectors.record_class import record


class CycleError(RankscopeError):
    """The dependency graph has a cycle (or a sync group depends on itself)."""


@record
class ReplayResult:
    """Times of every op, in the units the inputs used (ns in rankscope)."""

    ready: np.ndarray
    """when each op could have started its transfer/compute (its own launch)."""
    start: np.ndarray
    """when it started: ready for plain ops, the group's last ready for synced ops."""
    end: np.ndarray
    waves: int
    """number of vectorised waves (the graph's depth in groups)."""

    @property
    def makespan(self) -> float:
        return float(self.end.max() - self.start.min()) if len(self.end) else 0.0

    @property
    def wait(self) -> np.ndarray:
        """Time each op spent waiting for the other members of its sync group."""
        return self.start - self.ready


def chain_edges(stream_key: np.ndarray, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Edges between consecutive ops of the same stream.

    ``stream_key``: one int per op naming its stream (e.g. rank * 8 + stream id);
    ``order``: a sortable launch order (e.g. original start time), or None when the ops are in
    launch order already (one stable integer sort then keeps it, instead of a two-key lexsort).
    Returns (src, dst) arrays: each op depends on the previous op of its stream.
    """
    stream_key = np.asarray(stream_key)
    idx = np.argsort(stream_key, kind="stable") if order is None else np.lexsort((np.asarray(order), stream_key))
    same = stream_key[idx[1:]] == stream_key[idx[:-1]]
    return idx[:-1][same], idx[1:][same]


def csr_gather(offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Concatenated index ranges offsets[r]:offsets[r+1] for each r in rows (CSR gather)."""
    lo = offsets[rows]
    counts = offsets[rows + 1] - lo
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(lo - np.cumsum(np.r_[0, counts[:-1]]), counts) + np.arange(total)


@record
class _SuperGraph:
    """A graph's super-nodes (one per sync group, one per lone op) and the edges between them.

    Edges are in CSR order by source super-node: the edges of super-node k are offsets[k]:offsets[k+1].
    """

    node: np.ndarray
    """per op: its super-node."""
    n_super: int
    e_src: np.ndarray
    """per edge: source super-node."""
    e_dst_op: np.ndarray
    """per edge: target op."""
    e_dst: np.ndarray
    """per edge: target super-node."""
    offsets: np.ndarray
    indeg: np.ndarray
    """per super-node: its in-edges (counted down as the replay runs)."""
    members: np.ndarray
    m_off: np.ndarray
    """the ops of super-node k: members[m_off[k]:m_off[k+1]]."""


def _super_node_ids(n: int, sync_group: np.ndarray | None) -> tuple[np.ndarray, int]:
    """Super-node of each of ``n`` ops (ops of one sync group >= 0 share one; -1: its own) and their count."""
    if sync_group is None:
        return np.arange(n), n
    g = np.asarray(sync_group, dtype=np.int64)
    lone = g < 0
    key = np.where(lone, -(np.arange(n) + 1), g)
    _, node = np.unique(key, return_inverse=True)
    return node, int(node.max()) + 1


def _super_graph(n: int, src: np.ndarray, dst: np.ndarray, sync_group: np.ndarray | None) -> _SuperGraph:
    """The super-nodes of ``n`` ops and the edges between them. Raises CycleError for an edge inside one
    sync group (it would be a self-wait)."""
    node, n_super = _super_node_ids(n, sync_group)
    ssrc, sdst = node[src], node[dst]
    if np.any(ssrc == sdst):
        raise CycleError(f"{int(np.sum(ssrc == sdst))} dependency edges lie inside one sync group")
    order = np.argsort(ssrc)  # CSR by source; order within a source does not matter
    e_src, e_dst_op = ssrc[order], dst[order]
    offsets = np.zeros(n_super + 1, dtype=np.int64)
    np.add.at(offsets, e_src + 1, 1)
    # Ops of each super-node as a CSR (members sorted by super-node).
    m_off = np.zeros(n_super + 1, dtype=np.int64)
    np.add.at(m_off, node + 1, 1)
    return _SuperGraph(node=node, n_super=n_super, e_src=e_src, e_dst_op=e_dst_op, e_dst=node[e_dst_op],
                       offsets=np.cumsum(offsets), indeg=np.bincount(sdst, minlength=n_super),
                       members=np.argsort(node), m_off=np.cumsum(m_off))


def _replay_waves(g: _SuperGraph, s_dur: np.ndarray, pred_end: np.ndarray, delay: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, int]:
    """Kahn's algorithm in vectorised waves over the super-graph ``g``.

    ``s_dur``: duration per super-node; ``pred_end`` (per op, roots at their release, the rest -inf)
    is raised to each op's latest predecessor end in place; ``delay``: launch delay per op.
    Returns (start, end) per super-node and the number of waves. Raises CycleError if some ops can
    never run."""
    s_start = np.zeros(g.n_super)
    s_end = np.zeros(g.n_super)
    indeg = g.indeg
    frontier = np.flatnonzero(indeg == 0)
    stamp = np.empty(g.n_super, dtype=np.int64)
    waves = 0
    processed = 0
    while frontier.size:
        waves += 1
        processed += frontier.size
        # Ready per member op of this wave; a group starts at its last member's ready.
        ops = g.members[csr_gather(g.m_off, frontier)]
        ready_ops = pred_end[ops] + delay[ops]
        m_counts = g.m_off[frontier + 1] - g.m_off[frontier]
        starts = np.maximum.reduceat(ready_ops, np.r_[0, np.cumsum(m_counts)[:-1]])
        s_start[frontier] = starts
        s_end[frontier] = starts + s_dur[frontier]
        # Out-edges of the frontier.
        eidx = csr_gather(g.offsets, frontier)
        if eidx.size == 0:
            break
        tgt_ops = g.e_dst_op[eidx]
        np.maximum.at(pred_end, tgt_ops, s_end[g.e_src[eidx]])
        tgt = g.e_dst[eidx]
        np.subtract.at(indeg, tgt, 1)
        # Targets whose last dependency just finished join the next wave; a target reached by
        # several edges appears several times, so keep one copy (stamp trick: no sort).
        cand = tgt[indeg[tgt] == 0]
        pos = np.arange(cand.size)
        stamp[cand] = pos
        frontier = cand[stamp[cand] == pos]
    if processed != g.n_super:
        raise CycleError(f"{g.n_super - processed} of {g.n_super} op groups are on a dependency cycle")
    return s_start, s_end, waves


def replay(duration: np.ndarray, src: np.ndarray, dst: np.ndarray, *,
           launch_delay: np.ndarray | None = None, sync_group: np.ndarray | None = None,
           release: np.ndarray | None = None) -> ReplayResult:
    """Replay a dependency graph; returns every op's ready, start and end time.

    ``duration``: per-op float/int array; ``src, dst``: edges (dst waits for
    src to end); ``launch_delay``: added to each op's ready time (default 0);
    ``sync_group``: per-op group id, -1 for ops that start alone; ``release``:
    earliest ready time of ops without predecessors (default 0).
    Raises CycleError if some ops can never run.
    """
    n = len(duration)
    dur = np.asarray(duration, dtype=np.float64)
    delay = np.zeros(n) if launch_delay is None else np.asarray(launch_delay, dtype=np.float64)
    rel = np.zeros(n) if release is None else np.asarray(release, dtype=np.float64)
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if n == 0:
        e = np.zeros(0)
        return ReplayResult(e, e, e, 0)
    g = _super_graph(n, src, dst, sync_group)
    s_dur = np.zeros(g.n_super)
    np.maximum.at(s_dur, g.node, dur)
    # Op-level "latest predecessor end", starting at the release time for roots.
    pred_end = np.full(n, -np.inf)
    has_pred = np.zeros(n, dtype=bool)
    has_pred[dst] = True
    pred_end[~has_pred] = rel[~has_pred]
    s_start, s_end, waves = _replay_waves(g, s_dur, pred_end, delay)
    ready = pred_end + delay
    return ReplayResult(ready=ready, start=s_start[g.node], end=s_end[g.node], waves=waves)
