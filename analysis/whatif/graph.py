"""Dependency model of a training job for what-if replay (OSDI'25 "what-if analysis").

One op table per job (compute_op + comm_op rows) and a DAG over it:

- per worker a compute stream, a data-parallel comm stream and pipeline
  send/recv streams; ops of a stream run in launch (start) order;
- a recv precedes the compute of its microbatch, which precedes its send;
  the parameter all-gather precedes the first forward; the last backward
  precedes the gradient sync; the optimizer tail (the clip all-reduce)
  synchronises the job;
- collectives and p2p pairs are *sync groups*: their transfer starts when the
  last member has launched; each member then ends after its own transfer time.

Replay semantics (as OSDI'25): a plain op ends at start + duration; a synced
op ends at (latest launch of its group) + its transfer time. The shared engine
(:mod:`rankscope.analysis.replay.engine`) ends every member at the group's start plus
the group's *longest* duration, so each synced op becomes two nodes: a
zero-length member of the group and a private tail of its own transfer time
that its successors wait for.

Two builders: :func:`build_graph` picks the OSDI'25 op-level model
(:mod:`rankscope.analysis.whatif.osdi`) when the records carry OSDI op types
(``source`` whatif_parquet), else the generic model for hooks, Kineto imports
and the simulator (:mod:`rankscope.analysis.whatif.generic`).
"""

from __future__ import annotations

from graphlib import TopologicalSorter

import numpy as np
import polars as pl

from rankscope.analysis.replay.engine import replay
from rankscope.analysis.replay.step_template import step_template
from rankscope.analysis.replay.waves import plan_replay, replay_waves
from rankscope.collectors.errors import RankscopeError
from rankscope.collectors.record_class import record

FWD, BWD = "forward-compute", "backward-compute"
CLOCK_ERROR_NS = 1e-2 * 1e9
"""Transfer times below -10 ms are clock errors and become 0 (as the authors)."""


class WhatIfInputError(RankscopeError):
    """The records do not form a dependency model the what-if can replay."""


@record
class Template:
    """One model-parallel group's ops in one step; every (step, dp rank) instance repeats it.

    ``rows[i, t]`` is the op row of template op ``t`` in instance ``i = step_index * dp + dp_rank``.
    """

    rows: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    groups: tuple
    """((members, dp_sync), ...) in template op ids."""
    n_steps: int
    dp: int


def supernode_order(t: Template) -> tuple[list[tuple[str, int]], list[list[int]], dict[int, int]]:
    """One topological order of the template's nodes, as the replays over a template walk them: op ``m`` is
    node m and the transfer tail of a synced op m is node ``n_t + m``; a sync group's members go at once.

    Returns (the order: ("g", group id) for a group, ("n", node) for a lone op or a tail; per op, its
    predecessor nodes in template edge order, an edge from a synced op counting from that op's tail; each
    synced op's group id). The straggler what-if's replay and the critical path's replays share it."""
    n_t = t.rows.shape[1]
    member_of = {m: gid for gid, (members, _) in enumerate(t.groups) for m in members}
    preds: list[list[int]] = [[] for _ in range(n_t)]
    for u, v in zip(t.src.tolist(), t.dst.tolist(), strict=True):
        preds[v].append(n_t + u if u in member_of else u)

    def item(node: int) -> tuple[str, int]:
        return ("g", member_of[node]) if node < n_t and node in member_of else ("n", node)

    ts: TopologicalSorter = TopologicalSorter()
    for m in range(n_t):
        ts.add(item(m), *[item(p) for p in preds[m]])
    for m in member_of:
        ts.add(("n", n_t + m), item(m))
    return list(ts.static_order()), preds, member_of


def latest_end(preds, end: dict, left, zeros: np.ndarray) -> np.ndarray:
    """The latest end of the nodes ``preds`` (``zeros`` without any), as the replays over a template read their
    predecessors: each one's count of reads still to come (``left``) goes down, and its end leaves ``end`` after
    its last read. The array returned may be one of ``end``'s, so it is read, never written into."""
    if not preds:
        return zeros
    out = end[preds[0]] if len(preds) == 1 else np.maximum(end[preds[0]], end[preds[1]])
    for p in preds[2:]:
        np.maximum(out, end[p], out=out)
    for p in preds:
        left[p] -= 1
        if left[p] == 0:
            del end[p]
    return out


@record
class _PlanMaps:
    """A graph's replay plan and the maps between op ids and the plan's nodes (flat arrays)."""

    plan: object
    """the ReplayPlan of the whole graph, or of one step when ``columns`` > 1."""
    in_idx: np.ndarray
    """per plan node (x step), the op whose duration it takes (-1: zero-length sync-group member)."""
    delay_idx: np.ndarray
    """per plan node (x step), the op whose launch delay it takes (-1: none)."""
    step_super: np.ndarray
    """per op in step order, the flat index of the super-node whose end is the op's end."""
    first: np.ndarray
    present: np.ndarray
    """runs of step_super per step, and the step index of each run."""
    columns: int
    """1, or the number of steps replayed as columns of one step's plan."""
    template: object = None
    """the StepTemplate the plan is of (``columns`` > 1), else None."""

    def shaped(self, flat: np.ndarray) -> np.ndarray:
        """A flat per-node array as replay_waves takes it: (nodes,) or (nodes, steps)."""
        return flat if self.columns == 1 else flat.reshape(-1, self.columns)

    def node_delays(self, launch_delay: np.ndarray | None) -> np.ndarray | None:
        """Per-op launch delays placed on the plan's nodes (a tail takes none), shaped; None for none."""
        if launch_delay is None:
            return None
        return self.shaped(np.append(np.asarray(launch_delay, dtype=np.float64), 0.0)[self.delay_idx])


@record
class WhatIfGraph:
    """A job's ops, their dependency DAG and sync groups, ready to replay.

    ``ops`` columns: rank, dp_rank, stage, step, optype, seq, microbatch,
    start_ns, end_ns (float64), synced (bool: member of a sync group), comm
    (bool: communication for the ideal), stream (str), plus ``actual``: the
    replay duration of each op (transfer time for synced ops).
    """

    ops: pl.DataFrame
    src: np.ndarray
    dst: np.ndarray
    group: np.ndarray
    """sync group per op, -1 for plain ops."""
    step_index: np.ndarray
    """0..n_steps-1 per op."""
    steps: np.ndarray
    """the step number of each step index."""
    model: str
    """'osdi25' or 'generic'."""
    notes: dict
    template: Template | None = None
    """the shared per-(step, dp rank) structure, when the model has one (OSDI'25)."""

    @property
    def actual(self) -> np.ndarray:
        return self.ops["actual"].to_numpy()

    def replay_nodes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, group, tail_of) of the engine graph: ops, then one tail per synced op."""
        cached = self.notes.get("_nodes")
        if cached is not None:
            return cached
        res = self._engine_graph(np.int64)
        self.notes["_nodes"] = res
        return res

    def _engine_graph(self, idx: type) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """replay_nodes' arrays, with src and dst of integer type ``idx``."""
        return engine_nodes(self.src, self.dst, self.group, idx)

    def replay(self, duration: np.ndarray, launch_delay: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Replay with per-op ``duration`` (transfer time for synced ops); every step starts at 0.

        Returns (start, end) per op: end is the op's own end (synced: its tail's end).
        """
        src, dst, group, tail = self.replay_nodes()
        n = self.ops.height
        synced = tail >= 0
        dur = np.concatenate([np.where(synced, 0.0, duration), duration[synced]])
        delay = None
        if launch_delay is not None:
            delay = np.concatenate([launch_delay, np.zeros(int(synced.sum()))])
        r = replay(dur, src, dst, sync_group=group, launch_delay=delay)
        end = np.where(synced, r.end[np.where(synced, tail, 0)], r.end[:n])
        return r.ready[:n], end

    def _replay_plan(self) -> _PlanMaps:
        """The engine graph's replay plan and the index maps around it (built once per graph).

        When every step repeats one step's structure (:mod:`rankscope.analysis.replay.step_template`), the plan
        is that step's and the replay runs all steps as columns; ``notes["_step_template"] = False``
        turns that off (tests compare both).
        """
        cached = self.notes.get("_replay_plan")
        if cached is not None:
            return cached
        tmpl = None
        if self.notes.get("_step_template", True):
            tmpl = step_template(self.ops, self.src, self.dst, self.group, self.step_index, self._instance_order())
        maps = self._whole_plan() if tmpl is None else self._template_plan(tmpl)
        self.notes["_replay_plan"] = maps
        return maps

    def _instance_order(self) -> np.ndarray | None:
        """(steps, ops per step) op ids from the OSDI'25 template (instances step-major, dp rank next): the
        step template's positions without its sort of every op (1 s at 1,024 workers); None without one."""
        t = self.template
        if t is None or t.rows.shape[0] != t.n_steps * t.dp:
            return None
        return t.rows.reshape(t.n_steps, -1)

    def _whole_plan(self) -> _PlanMaps:
        had_nodes = "_nodes" in self.notes
        # int32 edge arrays where the node ids (ops, then one tail per synced op) fit: they are built
        # for the plan only (half the memory)
        src, dst, group, tail = (self.replay_nodes() if had_nodes else self._engine_graph(
            np.int32 if 2 * self.ops.height < 2**31 - 1 else np.int64))
        synced = tail >= 0
        # steps are independent components (every step starts at 0): one block per step
        plan = plan_replay(len(group), src, dst, group,
                           block=np.concatenate([self.step_index, self.step_index[synced]]))
        # the engine graph's edge arrays (~0.4 GB at 4,096 GPUs) are not kept beside the plan; the
        # one-off engine replay (replay()) builds them
        del src, dst, group
        in_idx, delay_idx, out_super = _node_maps(plan, tail)
        return self._maps(plan, in_idx, delay_idx, out_super, 1, None)

    def _template_plan(self, tmpl) -> _PlanMaps:
        """One step's plan; node ``j`` of step ``s`` is entry ``j * n_steps + s`` of the flat arrays."""
        k = tmpl.n_steps
        src, dst, group, tail = engine_nodes(tmpl.src, tmpl.dst, tmpl.group, np.int64)
        plan = plan_replay(len(group), src, dst, group)
        del src, dst, group
        # plan-ordered node -> position in the step (as _whole_plan's maps), then -> op id in each step
        node_dur, node_delay, pos_super = _node_maps(plan, tail)
        op_cols = tmpl.op_of.T  # (position, step)

        def per_step(pos: np.ndarray) -> np.ndarray:
            return np.where(pos[:, None] >= 0, op_cols[np.maximum(pos, 0)], -1).reshape(-1)

        out_super = np.empty(self.ops.height, dtype=np.int64)
        out_super[tmpl.op_of] = pos_super[None, :].astype(np.int64) * k + np.arange(k)[:, None]
        return self._maps(plan, per_step(node_dur), per_step(node_delay), out_super, k, tmpl)

    def _maps(self, plan, in_idx, delay_idx, out_super, columns: int, tmpl) -> _PlanMaps:
        order = np.argsort(self.step_index, kind="stable")
        si = self.step_index[order]
        first = np.flatnonzero(np.r_[True, si[1:] != si[:-1]]) if si.size else np.zeros(0, np.int64)
        i32 = np.int32 if in_idx.size < 2**31 - 1 else np.int64  # index maps: half the memory on big jobs
        return _PlanMaps(plan, in_idx.astype(i32), delay_idx.astype(i32), out_super[order], first, si[first],
                         columns, tmpl)

    def step_replayer(self, launch_delay: np.ndarray | None = None):
        """A function: per-op duration (n,) -> replayed time of each step, as :meth:`step_times`.

        The plan and the launch delays' placement are shared by every call: a what-if replays one
        graph under many duration sets.
        """
        maps = self._replay_plan()
        delay = maps.node_delays(launch_delay)
        # scratch arrays kept between calls (see replay_waves): the op durations extended by one 0,
        # the plan-ordered node durations, and the replay's own
        ext = np.zeros(self.ops.height + 1)
        node_dur = np.empty(maps.in_idx.size)
        work: dict = {}

        def run(duration: np.ndarray) -> np.ndarray:
            ext[:-1] = duration
            # "wrap": no buffered copy of out, and -1 (a synced member) still reads the appended 0
            np.take(ext, maps.in_idx, out=node_dur, mode="wrap")
            # a sync group's member nodes are zero-length (their transfer is the tail's)
            s_end = replay_waves(maps.plan, maps.shaped(node_dur), delay, work, zero_groups=True)
            return self._step_ends(s_end.reshape(-1), work)

        return run

    def replay_detail(self, duration: np.ndarray, launch_delay: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
        """(ready, end) of every engine-graph node (:meth:`replay_nodes`' numbering: the ops, then one tail
        per synced op) replayed with per-op ``duration`` and ``launch_delay``; every step starts at 0.

        The engine's :func:`~rankscope.analysis.replay.engine.replay` gives the same times bit for bit (the
        same max/add sequence), but builds its own structure of the whole graph (2.7 s at 1,024 workers);
        this runs the plan the what-ifs share, which is one step's when the steps repeat."""
        maps = self._replay_plan()
        plan = maps.plan
        n, tail = self.ops.height, tail_of(self.group)
        n_nodes = n + int((tail >= 0).sum())
        ready, end = np.empty(n_nodes), np.empty(n_nodes)
        if plan.n == 0:
            return ready, end
        dur = maps.shaped(np.append(np.asarray(duration, dtype=np.float64), 0.0)[maps.in_idx])
        delay = maps.node_delays(launch_delay)
        work: dict = {}
        s_end = replay_waves(plan, dur, delay, work, zero_groups=True)
        del dur
        node = plan.op_order if maps.template is None else self._template_nodes(maps.template, plan.op_order, tail)
        # replay_waves' own per-node latest predecessor end, in plan order; a node is ready after its delay
        pred_end = work.pop("pred_end")
        if delay is not None:
            pred_end += delay
        ready[node] = pred_end
        del pred_end
        end[node] = s_end[plan.super_of_op[plan.op_order]]
        return ready, end

    @staticmethod
    def _template_nodes(tmpl, order: np.ndarray, tail: np.ndarray) -> np.ndarray:
        """(plan nodes, steps): the engine node of the whole graph that each node of one step's plan is in
        each step. A step's nodes are its positions, then one tail per synced position (engine_nodes)."""
        n_loc = tmpl.n_ops
        synced_pos = np.flatnonzero(tmpl.group >= 0)
        is_tail = order >= n_loc
        pos = np.where(is_tail, synced_pos[np.where(is_tail, order - n_loc, 0)] if synced_pos.size else 0, order)
        ops = tmpl.op_of.T[pos]
        return np.where(is_tail[:, None], tail[ops], ops)

    def choice_replayer(self, actual: np.ndarray, ideal: np.ndarray, labels: np.ndarray,
                        launch_delay: np.ndarray | None = None):
        """A function ``run(select, remove)`` -> replayed time of each step, where op i takes its actual
        duration when ``select[labels[i]] != remove`` and its ideal one otherwise (a what-if scenario).

        Equal to ``step_replayer(launch_delay)`` on those durations, but actual, ideal and labels are
        placed in the plan's node order once, so a scenario costs one look-up over the nodes instead of
        building the op durations and gathering them.
        """
        maps = self._replay_plan()
        in_idx = maps.in_idx
        delay = maps.node_delays(launch_delay)
        # a synced op's zero-length member node takes 0 either way
        act = np.append(np.asarray(actual, dtype=np.float64), 0.0)[in_idx]
        idl = np.append(np.asarray(ideal, dtype=np.float64), 0.0)[in_idx]
        lab = np.append(np.asarray(labels), 0)[in_idx]
        lab = lab.astype(np.int32 if lab.size and lab.max() < 2**31 - 1 else np.int64)
        dur = np.empty(in_idx.size)
        shape = (in_idx.size,)
        if maps.columns > 1:
            # a template node's label is usually the same in every step (its rank and op type): the
            # choice is then made once per node and broadcast over the steps
            per_node = lab.reshape(-1, maps.columns)
            if (per_node == per_node[:, :1]).all():
                lab = np.ascontiguousarray(per_node[:, 0])
                shape = (lab.size, 1)
                act, idl, dur = maps.shaped(act), maps.shaped(idl), maps.shaped(dur)
        mask = np.empty(shape, dtype=bool)
        flat_mask = mask.reshape(-1)
        work: dict = {}
        # with no negative duration a sync group's node ends no later than its members' tails, so a
        # step's latest op end is the latest end of all its super-nodes (contiguous per step in the plan,
        # or one column per step)
        by_super = None if (act < 0).any() or (idl < 0).any() else self._super_step_runs()

        def run(select: np.ndarray, remove: bool) -> np.ndarray:
            np.take(np.asarray(select, dtype=bool), lab, out=flat_mask, mode="clip")
            if remove:
                np.logical_not(mask, out=mask)
            np.copyto(dur, idl)
            np.copyto(dur, act, where=mask)
            s_end = replay_waves(maps.plan, maps.shaped(dur.reshape(-1)), delay, work, zero_groups=True)
            if by_super is None:
                return self._step_ends(s_end.reshape(-1), work)
            if maps.columns > 1:
                return s_end.max(axis=0)
            out = np.full(len(self.steps), -np.inf)
            if by_super[0].size:
                out[by_super[1]] = np.maximum.reduceat(s_end, by_super[0])
            return out

        return run

    def _super_step_runs(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(first super-node of each step's run, the step indices present) when the plan orders super-nodes
        by step (steps are independent blocks); None when it could not (an edge or group across steps).
        With a step template every step is a column of the replay: (0, every step)."""
        maps = self._replay_plan()
        plan = maps.plan
        if maps.columns > 1:
            return np.zeros(1, np.int64), np.arange(maps.columns)
        if plan.n_super == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        block = np.concatenate([self.step_index, self.step_index[self.group >= 0]])
        s_step = np.empty(plan.n_super, dtype=np.int64)
        s_step[plan.super_of_op] = block
        if np.any(s_step[plan.super_of_op] != block) or np.any(s_step[1:] < s_step[:-1]):
            return None
        first = np.flatnonzero(np.r_[True, s_step[1:] != s_step[:-1]])
        return first, s_step[first]

    def _step_ends(self, s_end: np.ndarray, work: dict | None = None) -> np.ndarray:
        """Latest end of each step's ops from the replay's super-node ends, flat (-inf: a step without ops).

        ``work`` keeps the per-op gather buffer between calls (one scenario after another)."""
        maps = self._replay_plan()
        step_super, first, present = maps.step_super, maps.first, maps.present
        out = np.full(len(self.steps), -np.inf)
        if step_super.size:
            buf = work.get("op_end") if work is not None else None
            if buf is None or buf.shape != step_super.shape:
                buf = np.empty(step_super.shape)
                if work is not None:
                    work["op_end"] = buf
            np.take(s_end, step_super, out=buf, mode="clip")  # indices are in range: unbuffered
            out[present] = np.maximum.reduceat(buf, first)
        return out

    def step_times_many(self, duration: np.ndarray, launch_delay: np.ndarray | None = None) -> np.ndarray:
        """:meth:`step_times` for K duration sets: ``duration`` (n, K) -> (n_steps, K)."""
        run = self.step_replayer(launch_delay)
        return np.stack([run(duration[:, k]) for k in range(duration.shape[1])], axis=1) if duration.shape[1] \
            else np.zeros((len(self.steps), 0))

    def launch_delays(self) -> np.ndarray:
        """Per op: recorded start minus the latest recorded end of its dependencies (untraced CPU work).

        Ops without dependencies count from their step's first start. Below -10 ms it is a clock
        error and becomes 0 (as the authors); small negative values stay.
        """
        start = self.ops["start_ns"].to_numpy()
        end = self.ops["end_ns"].to_numpy()
        n_steps = len(self.steps)
        step_lo = np.full(n_steps, np.inf)
        np.minimum.at(step_lo, self.step_index, start)
        pred = np.full(len(start), -np.inf)
        np.maximum.at(pred, self.dst, end[self.src])
        # in place: each step's temporary would be one more array of every op
        no_pred = ~np.isfinite(pred)
        pred[no_pred] = step_lo[self.step_index[no_pred]]
        d = np.subtract(start, pred, out=pred)
        d[d <= -CLOCK_ERROR_NS] = 0.0
        return d

    def step_times(self, duration: np.ndarray, launch_delay: np.ndarray | None = None) -> np.ndarray:
        """Replayed time of each step (latest end of the step's ops; steps start at 0)."""
        _, end = self.replay(duration, launch_delay)
        out = np.full(len(self.steps), -np.inf)
        np.maximum.at(out, self.step_index, end)
        return out


def tail_of(group: np.ndarray) -> np.ndarray:
    """Per op of sync groups ``group`` (-1: alone), its tail node in the engine graph (:func:`engine_nodes`):
    n + its index among the synced ops; -1 for a lone op."""
    synced = np.flatnonzero(group >= 0)
    # int32 node ids where the ops and their tails fit: the critical path keeps it beside the graph
    tail = np.full(len(group), -1, dtype=np.int32 if len(group) + synced.size < 2**31 - 1 else np.int64)
    tail[synced] = len(group) + np.arange(synced.size)
    return tail


def engine_nodes(src: np.ndarray, dst: np.ndarray, group: np.ndarray, idx: type
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, group, tail_of) of the engine graph of ops with edges ``src -> dst`` and sync groups
    (-1: alone): the ops, then one tail per synced op; edge ids of integer type ``idx``."""
    synced = np.flatnonzero(group >= 0)
    tail = tail_of(group)
    # successors wait for the tail (own transfer end), not the group start
    t_src = tail[src]
    out_src = np.where(t_src >= 0, t_src, src).astype(idx, copy=False)
    del t_src
    e_src = np.concatenate([out_src, synced.astype(idx, copy=False)])
    del out_src
    e_dst = np.concatenate([dst.astype(idx, copy=False), tail[synced].astype(idx, copy=False)])
    return e_src, e_dst, np.concatenate([group, np.full(synced.size, -1)]), tail


def _node_maps(plan, tail: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the plan of an engine graph (:func:`engine_nodes`, ``tail`` its tail_of): per plan-ordered
    node the op whose duration it takes (-1: a synced op's zero-length group member; a tail takes its
    op's transfer time) and the op whose launch delay it takes (-1: a tail); per op the super-node
    whose end is the op's end (a synced op ends with its tail)."""
    n = tail.size
    synced = tail >= 0
    node_dur = np.concatenate([np.where(synced, -1, np.arange(n)), np.flatnonzero(synced)])[plan.op_order]
    node_delay = np.concatenate([np.arange(n), np.full(int(synced.sum()), -1)])[plan.op_order]
    return node_dur, node_delay, plan.super_of_op[np.where(synced, tail, np.arange(n))]


