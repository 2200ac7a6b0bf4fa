"""The chain of ops that sets each step's end, read off one replay of the job's dependency graph.

The replay (:mod:`rankscope.analysis.replay.engine`) gives every node a ready and an end time. A node
became ready when its latest predecessor ended (plus its launch delay); a sync group's transfer started
when its last member launched. Walking back from the step's last end along those *binding* links gives
the critical path: a plain op, then the predecessor that ended last before it; a synced op's transfer,
then the member of its group that launched last (often on another rank), then that member's binding
predecessor. Every piece of the path is a segment of time that ends where the next one starts, so the
segments of a step add up to the step's replayed time exactly:

- ``work``: an op's own duration (compute, or a synced op's transfer);
- ``gap``: an op's launch delay (untraced CPU work between its predecessor and its start).
"""

from __future__ import annotations

import numpy as np

from rankscope.analysis.critical_path import template
from rankscope.analysis.whatif.graph import WhatIfGraph, engine_nodes, tail_of
from rankscope.analysis.whatif.metrics import rank_index
from rankscope.collectors.record_class import record


@record
class StepPaths:
    """The critical path of every step, as flat arrays of segments (step by step, each from its end back).

    ``op`` is the graph's op row a segment belongs to; ``kind`` 0 = work, 1 = gap; ``start``/``dur`` in ns on
    the replay's clock (every step from 0); ``waited`` the rank that launched a sync group last (the op
    the transfer waited for), -1 otherwise.
    """

    step_index: np.ndarray
    op: np.ndarray
    kind: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    waited: np.ndarray
    step_time: np.ndarray
    """replayed time of each step (the path's length)."""
    op_end: np.ndarray
    """every op's replayed end (its transfer's end for a synced op)."""


def _last_by(key: np.ndarray, value: np.ndarray, size: int) -> np.ndarray:
    """Per key 0..size-1: the entry with the largest value, the last such entry on a tie (-1 where the key
    has none). Two scatters, no sort (a lexsort of 1.9 M ops took 0.65 s)."""
    out = np.full(size, -1, dtype=np.int64)
    if key.size == 0:
        return out
    if np.isnan(value).any():  # a sort ranks NaN above every number: keep its answer
        order = np.lexsort((value, key))
        k = key[order]
        last = np.r_[k[1:] != k[:-1], True]
        out[k[last]] = order[last]
        return out
    top = np.full(size, -np.inf)
    np.maximum.at(top, key, value)
    at_top = np.flatnonzero(value == top[key])
    last = np.full(size, -1, dtype=np.int64)
    np.maximum.at(last, key[at_top], at_top)
    return last


def binding_links(graph: WhatIfGraph, duration: np.ndarray, delay: np.ndarray):
    """One replay of the engine graph and, per node, its binding predecessor and per sync group its last
    member to launch. Returns (:class:`~rankscope.analysis.critical_path.template.Links`, tail_of).

    A graph with a template replays that (:func:`rankscope.analysis.critical_path.template.binding_links`);
    another runs the wave plan (:meth:`WhatIfGraph.replay_detail`), and the engine graph's edges are built
    here and not cached on the graph (~0.4 GB at 4,096 GPUs, as :meth:`WhatIfGraph.replay` would keep
    them)."""
    order = template.order_of(graph)
    if order is not None:  # one pass over the template: no plan, no engine edge arrays
        tail = tail_of(graph.group)
        return template.binding_links(graph.template, order, graph.group, tail, duration, delay), tail
    n = graph.ops.height
    ready, end = graph.replay_detail(duration, delay)
    # int32 node ids where they fit (ops plus tails): the edge arrays are the section's largest
    src, dst, group, tail = engine_nodes(graph.src, graph.dst, graph.group,
                                         np.int32 if ready.size < 2**31 - 1 else np.int64)
    synced = tail >= 0
    full_delay = np.concatenate([delay, np.zeros(int(synced.sum()))])
    n_nodes = ready.size
    # a node's binding predecessor is one whose end is the latest among its predecessors: the replay
    # computed ready = that end + the launch delay, so the same sum finds it exactly (no sort of the edges)
    hit = end[src] + full_delay[dst] == ready[dst]
    binding = np.full(n_nodes, -1, dtype=np.int64)
    binding[dst[hit]] = src[hit]
    members = np.flatnonzero(group >= 0)
    n_groups = int(group.max()) + 1 if members.size else 0
    # a group's transfer starts at its last member's ready time: that member launched last
    start = np.full(n_groups, -np.inf)
    np.maximum.at(start, group[members], ready[members])
    last = members[ready[members] == start[group[members]]]
    launcher = np.full(n_groups, -1, dtype=np.int64)
    launcher[group[last]] = last
    op_end = np.where(tail >= 0, end[np.maximum(tail, 0)], end[:n])
    return template.Links(ready, end, binding, launcher, op_end), tail


def path_delays(graph: WhatIfGraph) -> np.ndarray:
    """The graph's launch delays (:meth:`WhatIfGraph.launch_delays`), with a rank's first ops of a step
    counted from that rank's own start of the step, not the job's.

    Ranks start a step when they finished the last one: a stage that finished early starts early. Counted
    from the job's first start, the late ranks' first ops would carry that stagger as a launch delay, and a
    what-if that removes its cause (a slow rank) would keep it."""
    delay = graph.launch_delays()
    has_pred = np.zeros(graph.ops.height, dtype=bool)
    has_pred[graph.dst] = True
    if has_pred.all():
        return delay
    start = graph.ops["start_ns"].to_numpy()
    first = _rank_step_first(graph.ops["rank"].to_numpy(), graph.step_index, len(graph.steps), start)
    np.subtract(start, first, out=first)
    np.maximum(first, 0.0, out=first)
    np.copyto(delay, first, where=~has_pred)  # launch_delays' array is this call's own
    return delay


def _rank_step_first(rank: np.ndarray, step_index: np.ndarray, n_steps: int, start: np.ndarray) -> np.ndarray:
    """Per op the earliest ``start`` of its rank's ops in its step: a scatter-min over (rank, step) ids, not a
    polars window over a three-column frame (its pages stay with polars' allocator)."""
    key, n_keys = rank_step_key(rank, step_index, n_steps)
    lo = np.full(n_keys, np.inf)
    np.minimum.at(lo, key, start)
    return lo[key]


def rank_step_key(rank: np.ndarray, step_index: np.ndarray, n_steps: int) -> tuple[np.ndarray, int]:
    """Per op one id of its (rank, step index): rank's place among the ranks x ``n_steps`` + step index (so
    ``id % n_steps`` is the step index), and the number of ids."""
    # a table over the ranks, not np.unique's sort of every op's rank (0.15 s a call at 1.9 M ops)
    ranks, r_idx = rank_index(rank)
    return r_idx.astype(np.int64) * n_steps + step_index, ranks.size * n_steps


def step_paths(graph: WhatIfGraph, duration: np.ndarray, delay: np.ndarray | None = None) -> StepPaths:
    """The critical path of each step of ``graph`` replayed with per-op ``duration`` (transfer time for
    synced ops) and launch ``delay`` (default none). Needs graph.ops column rank."""
    n = graph.ops.height
    delay = np.zeros(n) if delay is None else np.asarray(delay, dtype=np.float64)
    links, tail = binding_links(graph, np.asarray(duration, dtype=np.float64), delay)
    ready, end, binding, launcher, op_end = links.ready, links.end, links.binding, links.launcher, links.op_end
    group = graph.group
    rank = graph.ops["rank"].to_numpy()
    # the node that ends each step: its last op's own node, or that op's transfer's tail (mapped for the
    # ~50 steps only: a per-op node array is 15 MB at 1.9 M ops)
    last = _last_by(graph.step_index, op_end, len(graph.steps))
    has = last >= 0
    last[has] = np.where(tail[last[has]] >= 0, tail[last[has]], last[has])
    out: dict[str, list] = {k: [] for k in ("step_index", "op", "kind", "start", "dur", "waited")}
    tail_op = np.flatnonzero(tail >= 0)

    def add(si: int, op: int, kind: int, start: float, dur: float, waited: int) -> None:
        for k, v in zip(out, (si, op, kind, start, dur, waited), strict=True):
            out[k].append(v)

    for si, node in enumerate(last.tolist()):
        v = node
        while v >= 0:
            op = v if v < n else int(tail_op[v - n])
            if v >= n:  # a transfer's tail: the transfer, then the group's last launcher
                add(si, op, 0, float(ready[v]), float(end[v] - ready[v]), -1)
                j = int(launcher[group[op]])
                out["waited"][-1] = int(rank[j])
                if delay[j] > 0:  # j is an op: a tail has no delay of its own
                    add(si, j, 1, float(ready[j] - delay[j]), float(delay[j]), -1)
                v = int(binding[j])
                continue
            if end[v] > ready[v]:
                add(si, op, 0, float(ready[v]), float(end[v] - ready[v]), -1)
            if delay[v] > 0:
                add(si, op, 1, float(ready[v] - delay[v]), float(delay[v]), -1)
            v = int(binding[v])
    step_time = np.full(len(graph.steps), np.nan)
    ok = last >= 0
    step_time[ok] = [end[v] for v in last[ok].tolist()]
    return StepPaths(step_index=np.asarray(out["step_index"], np.int64), op=np.asarray(out["op"], np.int64),
                     kind=np.asarray(out["kind"], np.int8), start=np.asarray(out["start"], np.float64),
                     dur=np.asarray(out["dur"], np.float64), waited=np.asarray(out["waited"], np.int64),
                     step_time=step_time, op_end=op_end)
