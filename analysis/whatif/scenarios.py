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
once in topological order with a matrix of ends per op -- the authors' "SIMD"
replay, extended with a scenario axis -- so the Python loop runs once per
template op, never per record or per scenario. Where each op's choice is the
same in every step (labels of ranks, stages, op types: every batch the
metrics replay), the matrix rows are *lanes*, (scenario, dp rank) pairs over
the steps, and pairs that choose alike share one lane until the dp ranks
first meet (:func:`_lane_replay`); otherwise the rows are (instance,
scenario) pairs. Other graphs fall back to one call of the shared engine per
scenario.
"""

from __future__ import annotations

import numpy as np

from rankscope.analysis.whatif.graph import WhatIfGraph, latest_end, supernode_order
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
    return np.concatenate([_replay_chunk(graph, plan, actual, ideal,
                                         Scenarios(sc.labels, sc.select[i:i + per], sc.remove[i:i + per]),
                                         launch_delay)
                           for i in range(0, k, per)], axis=1)


def _replay_chunk(graph: WhatIfGraph, plan: dict, actual: np.ndarray, ideal: np.ndarray, sc: Scenarios,
                  launch_delay: np.ndarray | None) -> np.ndarray:
    """The template replay of one chunk of scenarios: in lanes where each op's choice is the same in every step."""
    t = graph.template
    choice = _choice_per_step(t, sc)
    if choice is None:
        return _template_replay(graph, plan, actual, ideal, sc, launch_delay)
    rows = _lane_rows(t, plan)
    tab = np.empty((2,) + rows.shape)
    # a duration no scenario takes is never read (the launch-delay replay takes the actual alone); mode="clip"
    # (the rows are valid) as take buffers its output otherwise
    for b, durations, taken in ((0, ideal, not choice.all()), (1, actual, choice.any())):
        if taken:
            np.take(durations, rows, out=tab[b], mode="clip")
    delay = None if launch_delay is None else np.take(launch_delay, rows, mode="clip")
    return _lane_replay(t, plan, tab, choice, delay)


def _lane_rows(t, plan: dict) -> np.ndarray:
    """The template's op rows as (op, dp rank, step), each (op, dp rank)'s steps one row; cached in the plan,
    int32 where that holds every row (the gather through a transposed view copies the index each time)."""
    rows = plan.get("lane_rows")
    if rows is None:
        view = t.rows.reshape(t.n_steps, t.dp, -1).transpose(2, 1, 0)
        small = t.rows.size == 0 or int(t.rows.max()) < np.iinfo(np.int32).max
        rows = plan["lane_rows"] = np.ascontiguousarray(view, dtype=np.int32 if small else np.intp)
    return rows


def _choice_per_step(t, sc: Scenarios) -> np.ndarray | None:
    """(template ops, K, dp) bool, True where a scenario takes an op's actual duration, when that is the same
    in every step (labels of ranks, stages, op types); else None."""
    k = sc.select.shape[0]
    if sc.select.shape[1] and (sc.select == sc.select[:, :1]).all():  # every code alike: no label look-up
        return np.broadcast_to((sc.select[:, 0] != sc.remove)[None, :, None], (t.rows.shape[1], k, t.dp))
    lab_t = sc.labels[t.rows]
    lab_1 = lab_t[: t.dp]
    if not (lab_t.reshape(t.n_steps, t.dp, -1) == lab_1[None]).all():
        return None
    # looked up for all ops at once (per-op look-ups were a fifth of a replay)
    return (sc.select[:, lab_1] != sc.remove[:, None, None]).transpose(2, 0, 1)


def _plan(graph: WhatIfGraph) -> dict:
    """Topological order of the template's super-nodes (groups, lone ops, transfer tails); cached."""
    cached = graph.notes.get("_plan")
    if cached is not None:
        return cached
    t = graph.template
    n_t = t.rows.shape[1]
    supers, op_preds, member_of = supernode_order(t)
    # node ids: template op m, and tail n_t + m for synced m (whose one predecessor is m)
    preds: dict[int, list[int]] = dict(enumerate(op_preds))
    for m in member_of:
        preds[n_t + m] = [m]
    order = []
    consumers: dict[int, int] = {}
    for s in supers:
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
    plan = {"order": order, "consumers": consumers, "n_t": n_t, "peak_live": max(peak, 1), **_regions(order, n_t)}
    graph.notes["_plan"] = plan
    return plan


def _regions(order: list, n_t: int) -> dict:
    """The plan split where dp ranks first meet: ``before`` (the super-nodes that no dp-synced group with a
    predecessor precedes; a synced group without one starts at the same time in every scenario) and ``after``
    (the rest), each in plan order, and ``before_ops``: the template ops whose durations ``before`` reads.

    Before that meeting an instance's ends depend on its own durations alone, so scenarios that choose alike
    on one dp rank's ops there replay that rank alike (see _lane_replay)."""
    before, after, met = [], [], set()
    for entry in order:
        members, dp_sync, ps_list, _ = entry
        if (dp_sync and any(ps_list)) or any(p in met for ps in ps_list for p in ps):
            met.update(members)
            after.append(entry)
        else:
            before.append(entry)
    ops = sorted({m - n_t if m >= n_t else m for members, _, _, is_group in before if not is_group for m in members})
    return {"before": before, "after": after, "before_ops": np.array(ops, dtype=np.intp)}


def _lanes(choice: np.ndarray, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct lanes of a (template ops, K, dp) choice: (scenario, dp rank) pairs that choose alike on
    ``ops``, one per dp rank and distinct choice. Returns (each lane's representative scenario, its dp rank,
    (K, dp) lane of every pair)."""
    k, dp = choice.shape[1], choice.shape[2]
    bits = np.ascontiguousarray(np.packbits(choice[ops].transpose(2, 1, 0), axis=2))  # (dp, K, bytes)
    if bits.shape[2] == 0:
        sig = np.zeros(dp * k, dtype=np.intp)
    else:
        sig = np.unique(bits.view(np.dtype((np.void, bits.shape[2]))).reshape(-1), return_inverse=True)[1]
    # pair (j, c) at j * K + c; a lane per distinct (dp rank, choice)
    _, first, lane = np.unique(np.arange(dp).repeat(k) * (k * dp) + sig.reshape(-1), return_index=True,
                               return_inverse=True)
    return first % k, first // k, lane.reshape(dp, k).T.copy()


def _lane_replay(t, plan: dict, tab: np.ndarray, choice: np.ndarray, delay: np.ndarray | None) -> np.ndarray:
    """The template replay of scenarios whose choice is the same in every step (``choice``: (template ops,
    K, dp) bool, True for actual), in lanes: a lane is a (scenario, dp rank) pair, a row of its ends over
    the steps. Until dp ranks first meet (a dp-synced group with a predecessor) pairs that choose alike have
    equal ends, so only the distinct ones are replayed (a dp rank's scenario is the ideal on every other
    rank: the metrics' 87 scenarios on 64 dp ranks are 19 lanes per rank, not 87); there every pair gets its
    lane's row and the rest replays all pairs. Every end is the same sum or maximum of the same numbers as in
    an instance-by-instance replay, so the result is too, bit for bit. ``tab``: (2, template ops, dp, steps),
    the ideal and the actual durations; ``delay``: (template ops, dp, steps) or None. Returns (n_steps, K)."""
    ns, dp, n_t = t.n_steps, t.dp, plan["n_t"]
    k = choice.shape[1]
    # row (b * n_t + m) * dp + j: template op m's ideal (b = 0) or actual (b = 1) durations on dp rank j
    flat = tab.reshape(-1, ns)
    choice_has = (not choice.all(), bool(choice.any()))  # which of tab's halves the scenarios read
    # without a negative duration or launch delay an op ends no later than every op that waits for it, in its
    # own instance (through a dp-synced group too: the group starts at the latest member over the dp ranks),
    # so an instance's last end is that of an op nothing waits for: only those are taken into its maximum
    # (the same maximum, bit for bit; a NaN fails the check)
    sinks_only = delay is None and all(bool((tab[b] >= 0).all()) for b in (0, 1) if choice_has[b])
    end: dict[int, np.ndarray] = {}
    left = dict(plan["consumers"])

    def ready(ps: list[int], zeros: np.ndarray) -> np.ndarray:
        return latest_end(ps, end, left, zeros)

    def run(order: list, lane_c: np.ndarray, lane_j: np.ndarray, inst_end: np.ndarray) -> None:
        zeros = np.zeros_like(inst_end)
        row = {}
        if len(order) and order is plan["before"]:
            ops = plan["before_ops"]
            rows = (choice[ops][:, lane_c, lane_j] * n_t + ops[:, None]) * dp + lane_j
            row = dict(zip(ops.tolist(), rows, strict=True))

        def launched(ps: list[int], m: int) -> np.ndarray:
            r = ready(ps, zeros)
            return r if delay is None else r + delay[m][lane_j]

        for members, dp_sync, ps_list, is_group in order:
            if is_group:
                if dp_sync and not any(ps_list):
                    start = _unled_synced_start(members, delay, dp, ns, len(lane_j))
                else:
                    start = launched(ps_list[0], members[0])
                    for i, (m, ps) in enumerate(zip(members[1:], ps_list[1:], strict=True)):
                        # the first maximum makes the array the rest go into
                        start = np.maximum(start, launched(ps, m), out=None if i == 0 else start)
                    if dp_sync:  # after the meeting: lanes are every (scenario, dp rank), dp rank inner
                        start = np.repeat(start.reshape(k, dp, ns).max(axis=1), dp, axis=0)
                for m in members:
                    if left.get(m, 0):
                        end[m] = start
                continue
            node = members[0]
            tail = node >= n_t  # a transfer tail: starts when its group starts
            m = node - n_t if tail else node
            r = row.get(m)
            # the duration matrix is this replay's own: the end goes into it (x + y == y + x, bit for bit)
            d = flat[(choice[m][lane_c, lane_j] * n_t + m) * dp + lane_j if r is None else r]
            e = np.add(d, ready(ps_list[0], zeros) if tail else launched(ps_list[0], node), out=d)
            if left.get(node, 0):
                end[node] = e
                if sinks_only:
                    continue
            np.maximum(inst_end, e, out=inst_end)

    lane_c, lane_j, lane_of = _lanes(choice, plan["before_ops"])
    inst_end = np.full((len(lane_c), ns), -np.inf)
    run(plan["before"], lane_c, lane_j, inst_end)
    inst_end = _to_pairs(end, inst_end, lane_of)
    run(plan["after"], np.repeat(np.arange(k), dp), np.tile(np.arange(dp), k), inst_end)
    return inst_end.reshape(k, dp, ns).max(axis=1).T


def _unled_synced_start(members: list[int], delay: np.ndarray | None, dp: int, ns: int, n_lanes: int) -> np.ndarray:
    """The start of a dp-synced group with no predecessor, per lane: the same in every scenario, the latest
    launch over the dp ranks."""
    start = np.zeros((dp, ns)) if delay is None else np.zeros((dp, ns)) + delay[members[0]]
    for m in members[1:]:
        start = np.maximum(start, np.zeros((dp, ns)) + (0 if delay is None else delay[m]))
    return np.repeat(start.max(axis=0)[None], n_lanes, axis=0)


def _to_pairs(end: dict[int, np.ndarray], inst_end: np.ndarray, lane_of: np.ndarray) -> np.ndarray:
    """Every (scenario, dp rank) pair, scenario-major, given its lane's row: the live ends in ``end`` in place
    (ends shared by several nodes stay shared), and the instances' last ends, returned."""
    pairs = lane_of.reshape(-1)
    expanded = {}
    for p, e in end.items():
        if id(e) not in expanded:
            expanded[id(e)] = e[pairs]
        end[p] = expanded[id(e)]
    return inst_end[pairs]


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

    def dur(m: int) -> np.ndarray:
        use_actual = sc.select[:, lab_t[:, m]].T != sc.remove
        return np.where(use_actual, act_t[:, m, None], idl_t[:, m, None])

    # the loop is bound by memory traffic on (instances x K) matrices: maxima and sums go into arrays this
    # replay made itself (never into ``end``'s, which later nodes read) instead of a new array each
    def ready(ps: list[int]) -> np.ndarray:
        return latest_end(ps, end, left, zeros)

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
