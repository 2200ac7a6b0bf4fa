"""The critical path's replays over a graph's template, every instance at once.

An OSDI'25 graph repeats one model-parallel group's ops in every (step, dp rank) instance
(:class:`~rankscope.analysis.whatif.graph.Template`). The wave plan (:meth:`WhatIfGraph.replay_detail`,
:meth:`WhatIfGraph.step_replayer`) replays such a graph too, but must build its plan first: 0.6 s on the
1.9 M-op trace tiled 16x, more than the ten replays it served. Here one pass over the template's ~1,000
nodes in topological order computes a node of every instance at once (one row per node), as the straggler
what-if's template replay does: no plan, no engine edge arrays, and the path's walk reads the rows at the
nodes it visits instead of every node's times being scattered to the engine's numbering.

The arithmetic is the wave plan's, max for max and add for add: an op is ready at its latest predecessor's
end (0.0 without one) plus its launch delay and ends at ready + duration; a sync group starts at its members'
latest ready (over the step's dp ranks when dp-synced) and its members end at start + 0.0; a transfer's
tail is ready at its member's end + 0.0 and ends at ready + transfer time. So every time, and every tie the
binding links are read from, is bit-identical to the plan's.
"""

from __future__ import annotations

from dataclasses import field

import numpy as np

from rankscope.analysis.whatif.graph import Template, WhatIfGraph, latest_end, supernode_order
from rankscope.collectors.record_class import record


@record
class TemplateOrder:
    """The template's nodes (op ``m`` is node m, the tail of the k-th synced op is node n_t + k) in
    topological order, and each op's predecessor nodes in template edge order (the graph's edge order within
    an instance)."""

    items: tuple
    """("g", group id) for a sync group (its members at once), ("n", node) for a lone op or a tail."""
    preds: tuple
    """per template op: the nodes its in-edges come from, in edge order."""
    n_t: int
    synced: np.ndarray
    """the synced template ops, ascending: tail n_t + k is synced[k]'s."""
    op: np.ndarray
    """(template op, instance): the op id, C-ordered (``rows.T`` gathers into Fortran order, and a template op's
    row of that is one cache miss per instance)."""
    flat: np.ndarray
    """per op id, its place in ``op`` (flat): template op ``flat // instances``, instance ``flat % instances``."""
    reads: tuple
    """per node, how often the replay reads its end (it is let go after the last: the replay's working set
    then stays in cache)."""
    laid: dict = field(default_factory=dict, compare=False, repr=False)
    """id of a per-op array -> (the array, its layout): see :func:`laid_out`."""


def laid_out(order: TemplateOrder, a: np.ndarray) -> np.ndarray:
    """Per-op ``a`` as (template op, instance), read-only; kept for the array's next call (the path's replay
    and the edits' replays read the same durations and delays: one gather of every op each, not four)."""
    hit = order.laid.get(id(a))
    if hit is not None and hit[0] is a:
        return hit[1]
    out = a[order.op]
    out.setflags(write=False)
    order.laid[id(a)] = (a, out)
    return out


def order_of(graph: WhatIfGraph) -> TemplateOrder | None:
    """The order of ``graph``'s template (built once per graph), or None without one."""
    if graph.template is None:
        return None
    cached = graph.notes.get("_path_order")
    if cached is None:
        cached = graph.notes["_path_order"] = template_order(graph.template)
    return cached


def template_order(t: Template) -> TemplateOrder:
    """The replay order of template ``t`` (see :class:`TemplateOrder`)."""
    n_t = t.rows.shape[1]
    supers, op_preds, group_of = supernode_order(t)
    synced = sorted(group_of)
    # here the tail of the k-th synced op is node n_t + k (the order's tails are n_t + op)
    tail = {n_t + m: n_t + k for k, m in enumerate(synced)}
    preds = [[tail.get(p, p) for p in ps] for ps in op_preds]
    items = [(kind, tail.get(x, x) if kind == "n" else x) for kind, x in supers]
    op = np.ascontiguousarray(t.rows.T)
    # int32 places where they fit: the array lives as long as the graph (one entry per op)
    flat = np.empty(op.size, dtype=np.int32 if op.size < 2**31 - 1 else np.int64)
    flat[op] = np.arange(op.size, dtype=flat.dtype).reshape(op.shape)
    reads = [0] * (n_t + len(synced))
    for p in (p for ps in preds for p in ps):
        reads[p] += 1
    for m in synced:
        reads[m] += 1  # by its tail
    return TemplateOrder(tuple(items), tuple(tuple(p) for p in preds), n_t,
                         np.array(synced, dtype=np.int64), op, flat, tuple(reads))


def _group_start(t: Template, ready: list[np.ndarray], dp_sync: bool) -> np.ndarray:
    """A sync group's start per instance: its members' latest ready, over the step's dp ranks if dp-synced."""
    start = ready[0]
    for r in ready[1:]:
        start = np.maximum(start, r)
    if dp_sync:
        shape = start.shape[1:]
        start = np.repeat(start.reshape((t.n_steps, t.dp) + shape).max(axis=1), t.dp, axis=0)
    return start


def _replay(t: Template, order: TemplateOrder, d: np.ndarray, dl: np.ndarray, visit) -> dict:
    """Replay with durations ``d`` and launch delays ``dl`` per (template op, instance) (each op's row
    contiguous): ``visit(node, ready, end)`` sees each node's times per instance as they are computed (a
    group's members end at its start + 0.0). Returns every group's start (group id -> per instance)."""
    n_t = order.n_t
    zero = np.zeros(dl.shape[1:])  # (instance,), or (instance, 1) beside a batch of duration sets
    end: dict[int, np.ndarray] = {}
    left = list(order.reads)
    starts: dict[int, np.ndarray] = {}
    for kind, x in order.items:
        if kind == "g":
            members, dp_sync = t.groups[x]
            ready = [latest_end(order.preds[m], end, left, zero) + dl[m] for m in members]
            starts[x] = _group_start(t, ready, dp_sync)
            e = starts[x] + 0.0
            for m, r in zip(members, ready, strict=True):
                end[m] = e
                visit(m, r, e)
            continue
        m = int(order.synced[x - n_t]) if x >= n_t else x
        if x >= n_t:  # a tail: ready at its op's end + 0.0
            r = latest_end((m,), end, left, zero) + 0.0
        else:  # an op: at its predecessors' latest end + its launch delay
            r = latest_end(order.preds[m], end, left, zero) + dl[m]
        e = end[x] = r + d[m]
        visit(x, r, e)
        if not left[x]:
            del end[x]
    return starts


def step_times(t: Template, order: TemplateOrder, dur: np.ndarray, delay: np.ndarray) -> np.ndarray:
    """Replayed time of each step (its ops' latest end; a synced op's is its tail's) with per-op durations
    ``dur`` and launch delays ``delay``, as :meth:`WhatIfGraph.step_replayer` gives it."""
    return _step_times(t, order, dur[order.op], laid_out(order, delay))


EDIT_BATCH_BYTES = 16 << 20
"""Most bytes of edited durations one replay carries: edits whose layouts fit replay together, as columns.

A replay walks the template's ~1,000 nodes with a few numpy calls each, whatever their width: on the OSDI'25
traces (64 instances and less) that fixed cost is most of an edit's replay, so nine edits as columns of one
replay cost about one (AR: the section's edits 59 -> 27-42 ms, their replays ~11 ms of that). At 1.9 M ops one edit's layout is 15 MB and an edit's
replay costs the same alone or batched: there each replays alone, and no batch adds to the peak."""


def edit_replayer(t: Template, order: TemplateOrder, base: np.ndarray, delay: np.ndarray):
    """A function ``run(edits)`` -> per edit (ops, durations) its :func:`step_times` with per-op durations
    ``base`` except ``durations`` on ``ops``: the template's layout of the base and the delays is gathered
    once, an edit's few ops are put into a copy of it (a gather of every op was a third of a replay), and
    edits replay together while their layouts fit :data:`EDIT_BATCH_BYTES`. Each result is the one a replay
    of that edit alone gives, bit for bit: every time is the same max or sum of the same numbers."""
    d0, dl = laid_out(order, base), laid_out(order, delay)
    n_inst = d0.shape[1]

    def run(edits: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        per = max(1, EDIT_BATCH_BYTES // max(d0.nbytes, 1))
        out: list[np.ndarray] = []
        for lo in range(0, len(edits), per):
            batch = edits[lo:lo + per]
            if len(batch) == 1:
                d = d0.copy()
                d.ravel()[order.flat[batch[0][0]]] = batch[0][1]
                out.append(_step_times(t, order, d, dl))
                continue
            # (template op, instance, edit): each node's row is then one contiguous (instance, edit) block
            d = np.repeat(d0[:, :, None], len(batch), axis=2)
            for j, (ops, durations) in enumerate(batch):
                at = order.flat[ops]
                d[at // n_inst, at % n_inst, j] = durations
            times = _step_times(t, order, d, dl[:, :, None])
            out.extend(times[:, j].copy() for j in range(len(batch)))
        return out

    return run


def _step_times(t: Template, order: TemplateOrder, d: np.ndarray, dl: np.ndarray) -> np.ndarray:
    """:func:`step_times` with durations and delays in the template's layout (see :func:`_replay`): per step,
    or (step, duration set) for durations laid out (template op, instance, set) beside delays (template op,
    instance, 1)."""
    inst_end = np.full(d.shape[1:], -np.inf)
    member = np.zeros(order.n_t, dtype=bool)
    member[order.synced] = True

    def visit(x: int, r: np.ndarray, e: np.ndarray) -> None:
        if x >= order.n_t or not member[x]:  # a lone op or a tail: a member ends when its group starts
            np.maximum(inst_end, e, out=inst_end)

    _replay(t, order, d, dl, visit)
    return inst_end.reshape((t.n_steps, t.dp) + inst_end.shape[1:]).max(axis=1)


@record
class Links:
    """What the path's walk reads of one replay: per engine node (the ops, then one tail per synced op) its
    ready and end time and binding predecessor (-1: none), indexed by an int node id (arrays from the wave
    plan, look-ups into the rows of a template replay); per sync group its last launcher; per op its end (a
    synced op's: its tail's)."""

    ready: object
    end: object
    binding: object
    launcher: np.ndarray
    op_end: np.ndarray


class _ByNode:
    """Engine node id (an int) -> the place of its times among the replay's rows: (template node, instance).
    The walk reads a few thousand nodes, so no time is scattered to every node's id (3 M nodes)."""

    def __init__(self, order: TemplateOrder, tail: np.ndarray):
        self.order, self.tail = order, tail
        self.n, self.n_inst = order.flat.size, order.op.shape[1]
        self.synced_ops = np.flatnonzero(tail >= 0)  # the op of each tail, in tail order
        self.k = np.full(order.n_t, -1, dtype=np.int64)  # per template op, its place among the synced
        self.k[order.synced] = np.arange(order.synced.size)

    def place(self, v: int) -> tuple[int, int]:
        if v < self.n:
            return divmod(int(self.order.flat[v]), self.n_inst)
        m, i = divmod(int(self.order.flat[self.synced_ops[v - self.n]]), self.n_inst)
        return self.order.n_t + int(self.k[m]), i

    def node(self, x: int, i: int) -> int:
        """The engine node of template node ``x`` in instance ``i``."""
        if x < self.order.n_t:
            return int(self.order.op[x, i])
        return int(self.tail[self.order.op[self.order.synced[x - self.order.n_t], i]])


class _Times:
    """Per engine node id (an int) its time, read from the replay's rows (template node -> per instance)."""

    def __init__(self, rows: list, at: _ByNode):
        self.rows, self.at = rows, at

    def __getitem__(self, v: int):
        x, i = self.at.place(v)
        return self.rows[x][i]


class _Binding:
    """Per engine node id (an int) its binding predecessor (-1: none), found when the walk asks: an op's is
    its last in-edge (in the graph's edge order) whose source's end plus the op's delay is its ready time,
    the same sums as the replay's; a tail's is its own op."""

    def __init__(self, ready: list, end: list, dl: np.ndarray, at: _ByNode):
        self.ready, self.end, self.dl, self.at = ready, end, dl, at

    def __getitem__(self, v: int) -> int:
        x, i = self.at.place(v)
        order = self.at.order
        if x >= order.n_t:
            m = int(order.synced[x - order.n_t])
            return self.at.node(m, i) if self.end[m][i] + 0.0 == self.ready[x][i] else -1
        hit = [p for p in order.preds[x] if self.end[p][i] + self.dl[x, i] == self.ready[x][i]]
        return self.at.node(hit[-1], i) if hit else -1


def binding_links(t: Template, order: TemplateOrder, group: np.ndarray, tail: np.ndarray, dur: np.ndarray,
                  delay: np.ndarray) -> Links:
    """:func:`rankscope.analysis.critical_path.path.binding_links`' answer over engine nodes (the ops, then one
    tail per synced op; ``tail``: per op its tail node, -1 for none), from one template replay.

    Ties go as there: an op's binding predecessor is its last in-edge (in the graph's edge order) whose
    source's end plus the op's delay is its ready time; a group's launcher is its highest op id among the
    members whose ready is the group's start."""
    n_rows = order.n_t + order.synced.size
    ready: list = [None] * n_rows
    end: list = [None] * n_rows  # the replay's own arrays: it never writes into one it handed out

    def visit(x: int, r: np.ndarray, e: np.ndarray) -> None:
        ready[x], end[x] = r, e

    dl = laid_out(order, delay)
    starts = _replay(t, order, laid_out(order, dur), dl, visit)
    at = _ByNode(order, tail)
    # per op its end: a synced op's is its tail's; written row by row into op order (no (template op,
    # instance) copy of every op's end beside it)
    op_end = np.empty(order.flat.size)
    for x, k in enumerate(at.k.tolist()):
        op_end[order.op[x]] = end[x] if k < 0 else end[order.n_t + int(k)]
    return Links(_Times(ready, at), _Times(end, at), _Binding(ready, end, dl, at),
                 _launchers(t, group, order, ready, starts), op_end)


def _launchers(t: Template, group: np.ndarray, order: TemplateOrder, ready: list, starts: dict) -> np.ndarray:
    """Per sync group id of ``group``, its member that launched last (highest op id on a tie), -1: none.
    ``ready``: per template op, its ready time per instance."""
    launcher = np.full(int(group.max()) + 1 if group.size else 0, -1, dtype=np.int64)
    for gid, start in starts.items():
        members, dp_sync = t.groups[gid]
        last = np.where(ready[members[0]] == start, order.op[members[0]], -1)
        for m in members[1:]:
            np.maximum(last, np.where(ready[m] == start, order.op[m], -1), out=last)
        if dp_sync:
            last = np.repeat(last.reshape(t.n_steps, t.dp).max(axis=1), t.dp)
        launcher[group[order.op[members[0]]]] = last
    return launcher
