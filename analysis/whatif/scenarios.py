"""Many what-if replays of one graph at once.

A what-if *scenario* gives every op either its actual duration or its ideal
one: ``add`` scenarios start from the ideal timeline and put the actual
durations back on the selected ops (the OSDI'25 decomposition, S_t and S_w);
``remove`` scenarios start from the actual timeline and make the selected ops
ideal (M_W, M_S). Selections are look-up tables over one label column (dp
rank, stage, op type group, rank), so a batch of K scenarios costs K boolean
rows, not K copies of the job.

When the graph has a template (every step and dp rank repeats one model-
parallel group's ops, as in the OSDI'25 model), the replay walks the template
once in topological order with (instances x scenarios) matrices per op --
the authors' "SIMD" replay, extended with a scenario axis -- so the Python
loop runs once per template op, never per record or per scenario. Other
graphs fall back to one call of the shared engine per scenario.
"""

from __future__ import annotations

from graphlib import TopologicalSorter

import numpy as np

from rankscope.analysis.whatif.graph import WhatIfGraph
from rankscope.collectors.record_class import record

MEMORY_BUDGET_BYTES = 256 * 1024 * 1024
"""Upper bound on the live (instances x scenarios) matrices; more scenarios run in chunks."""


@record
class Scenarios:
    """K what-if scenarios over one label column.

    ``labels``: int code per op (n,); ``select``: (K, n_codes) bool, which
    codes each scenario selects; ``remove``: (K,) bool, True for remove
    scenarios (selected ops ideal, rest actual), False for add scenarios
    (selected ops actual, rest ideal).
    """

    labels: np.ndarray
    select: np.ndarray
    remove: np.ndarray

    def durations(self, k: int, actual: np.ndarray, ideal: np.ndarray) -> np.ndarray:
        use_actual = self.select[k, self.labels] != self.remove[k]
        return np.where(use_actual, actual, ideal)


def step_times(graph: WhatIfGraph, actual: np.ndarray, ideal: np.ndarray, sc: Scenarios,
               launch_delay: np.ndarray | None = None) -> np.ndarray:
    """Replayed step times, shape (n_steps, K).

    Needs the graph and per-op actual/ideal durations; ``launch_delay`` (per op,
    same in every scenario) is added to each op's ready time (default none).
    """
    k = sc.select.shape[0]
    if graph.template is None:
        # every scenario through one replay plan (built once); one scenario per pass: the replay is
        # bound by memory access, so wider passes cost as much per scenario and more memory
        run = graph.choice_replayer(actual, ideal, sc.labels, launch_delay)
        out = np.empty((len(graph.steps), k))
        # scenarios that give every code the same choice replay alike (an add of a selection is the
        # remove of its complement; M_S's add is the last stage's S_x): each distinct one runs once
        done: dict[bytes, int] = {}
        for i in range(k):
            key = (np.asarray(sc.select[i], dtype=bool) != bool(sc.remove[i])).tobytes()
            if key in done:
                out[:, i] = out[:, done[key]]
                continue
            done[key] = i
            out[:, i] = run(sc.select[i], bool(sc.remove[i]))
        return out
    plan = _plan(graph)
    n_inst = graph.template.rows.shape[0]
    per = max(1, MEMORY_BUDGET_BYTES // max(1, 8 * n_inst * plan["peak_live"]))
    return np.concatenate([_template_replay(graph, plan, actual, ideal,
                                            Scenarios(sc.labels, sc.select[i:i + per], sc.remove[i:i + per]),
                                            launch_delay)
                           for i in range(0, k, per)], axis=1)


def _plan(graph: WhatIfGraph) -> dict:
    """Topological order of the template's super-nodes (groups, lone ops, transfer tails); cached."""
    cached = graph.notes.get("_plan")
    if cached is not None:
        return cached
    t = graph.template
    n_t = t.rows.shape[1]
    member_of = {}
    for gid, (members, _) in enumerate(t.groups):
        for m in members:
            member_of[m] = gid
    # node ids: template op m, and tail n_t + m for synced m
    preds: dict[int, list[int]] = {m: [] for m in range(n_t)}
    for u, v in zip(t.src.tolist(), t.dst.tolist(), strict=True):
        preds[v].append(n_t + u if u in member_of else u)
    for m in member_of:
        preds[n_t + m] = [m]

    def sup(node: int):
        return ("g", member_of[node]) if node < n_t and node in member_of else ("n", node)

    ts = TopologicalSorter()
    for node, ps in preds.items():
        ts.add(sup(node), *[sup(p) for p in ps])
    order = []
    consumers: dict[int, int] = {}
    for s in ts.static_order():
        if s[0] == "g":
            members, dp_sync = t.groups[s[1]]
            order.append((list(members), bool(dp_sync), [preds[m] for m in members], True))
        else:
            order.append(([s[1]], False, [preds[s[1]]], False))
        for ps in order[-1][2]:
            for p in ps:
                consumers[p] = consumers.get(p, 0) + 1
    # peak number of live matrices, for chunking scenarios under the memory budget
    live, peak, left = 0, 0, dict(consumers)
    for members, _, ps_list, _ in order:
        live += len(members)
        peak = max(peak, live)
        for ps in ps_list:
            for p in ps:
                left[p] -= 1
                live -= left[p] == 0
    plan = {"order": order, "consumers": consumers, "n_t": n_t, "peak_live": max(peak, 1)}
    graph.notes["_plan"] = plan
    return plan


def _template_replay(graph: WhatIfGraph, plan: dict, actual: np.ndarray, ideal: np.ndarray,
                     sc: Scenarios, launch_delay: np.ndarray | None) -> np.ndarray:
    t = graph.template
    n_inst, k = t.rows.shape[0], sc.select.shape[0]
    n_t = plan["n_t"]
    end: dict[int, np.ndarray] = {}
    left = dict(plan["consumers"])
    inst_end = np.full((n_inst, k), -np.inf)
    zeros = np.zeros((n_inst, k))
    act_t, idl_t = actual[t.rows], ideal[t.rows]
    lab_t = sc.labels[t.rows]
    # labels that repeat every step (ranks, stages, op types) need the look-up for one step only
    lab_1 = lab_t[: t.dp]
    per_step = bool((lab_t.reshape(t.n_steps, t.dp, -1) == lab_1[None]).all())
    if per_step:
        # the (dp, K) choice of every template op, broadcast over steps: no (instances x K) look-up;
        # looked up for all ops at once and laid out op-major, so that each op's read below is one slice
        # (the per-op look-ups were a fifth of a replay)
        choice = np.ascontiguousarray((sc.select[:, lab_1] != sc.remove[:, None, None]).transpose(2, 1, 0))
        act_m = np.ascontiguousarray(act_t.T).reshape(-1, t.n_steps, t.dp, 1)
        idl_m = np.ascontiguousarray(idl_t.T).reshape(-1, t.n_steps, t.dp, 1)

    def dur(m: int) -> np.ndarray:
        if per_step:
            return np.where(choice[m][None], act_m[m], idl_m[m]).reshape(n_inst, k)
        use_actual = sc.select[:, lab_t[:, m]].T != sc.remove
        return np.where(use_actual, act_t[:, m, None], idl_t[:, m, None])

    # the loop is bound by memory traffic on (instances x K) matrices: maxima and sums go into arrays this
    # replay made itself (never into ``end``'s, which later nodes read) instead of a new array each
    def ready(ps: list[int]) -> np.ndarray:
        if not ps:
            return zeros
        out = end[ps[0]] if len(ps) == 1 else np.maximum(end[ps[0]], end[ps[1]])
        for p in ps[2:]:
            np.maximum(out, end[p], out=out)
        for p in ps:
            left[p] -= 1
            if left[p] == 0:
                del end[p]
        return out

    delay_t = None if launch_delay is None else launch_delay[t.rows]
    # without a negative duration or launch delay an op ends no later than every op that waits for it, in its
    # own instance (through a dp-synced group too: the group starts at the latest member over the dp ranks),
    # so an instance's last end is that of an op nothing waits for: only those are taken into its maximum
    # (the same maximum, bit for bit; a NaN fails the check)
    sinks_only = delay_t is None and bool((act_t >= 0).all()) and bool((idl_t >= 0).all())

    def finish(node: int, e: np.ndarray) -> None:
        if left.get(node, 0):
            end[node] = e
            if sinks_only:
                return
        np.maximum(inst_end, e, out=inst_end)

    def launched(ps: list[int], m: int) -> np.ndarray:
        r = ready(ps)
        return r if delay_t is None else r + delay_t[:, m, None]

    for members, dp_sync, ps_list, is_group in plan["order"]:
        if is_group:
            start = launched(ps_list[0], members[0])
            for i, (m, ps) in enumerate(zip(members[1:], ps_list[1:], strict=True)):
                # the first maximum makes the array the rest go into
                start = np.maximum(start, launched(ps, m), out=None if i == 0 else start)
            if dp_sync:
                start = np.repeat(start.reshape(t.n_steps, t.dp, k).max(axis=1), t.dp, axis=0)
            for m in members:
                if left.get(m, 0):
                    end[m] = start
        else:
            node = members[0]
            # the duration matrix is this replay's own: the end goes into it (x + y == y + x, bit for bit)
            tail = node >= n_t  # a transfer tail: starts when its group starts
            d = dur(node - n_t if tail else node)
            finish(node, np.add(d, ready(ps_list[0]) if tail else launched(ps_list[0], node), out=d))
    return inst_end.reshape(t.n_steps, t.dp, k).max(axis=1)
