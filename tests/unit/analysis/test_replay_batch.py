"""The batched replay equals the one-at-a-time engine, scenario by scenario, bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.replay.engine import CycleError, replay
from rankscope.analysis.replay.step_template import step_template
from rankscope.analysis.replay.waves import plan_replay, replay_many


def _random_graph(rng, n=400, streams=12, groups=40):
    stream = rng.integers(0, streams, n)
    order = rng.permutation(n)
    src, dst = [], []
    for s in range(streams):
        ops = order[stream[order] == s]
        src += ops[:-1].tolist()
        dst += ops[1:].tolist()
    # cross edges only forward in the global order: a DAG
    pos = np.empty(n, int)
    pos[order] = np.arange(n)
    for _ in range(n // 3):
        a, b = rng.integers(0, n, 2)
        if pos[a] < pos[b]:
            src.append(a)
            dst.append(b)
    group = np.full(n, -1)
    # a sync group takes ops of distinct streams at similar positions (no path between them)
    for g in range(groups):
        at = rng.integers(0, n - streams)
        cand = [o for o in order[at:at + streams]]
        pick = {}
        for o in cand:
            pick.setdefault(stream[o], o)
        if len(pick) >= 2:
            group[list(pick.values())[:3]] = g
    return np.array(src), np.array(dst), group


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_replay_equals_the_engine_per_scenario(seed):
    rng = np.random.default_rng(seed)
    src, dst, group = _random_graph(rng)
    n = len(group)
    dur = rng.uniform(1, 100, (n, 5))
    delay = rng.uniform(0, 3, n)
    try:
        expected = [replay(dur[:, k], src, dst, sync_group=group, launch_delay=delay).end for k in range(5)]
    except CycleError:
        pytest.skip("random groups formed a cycle")
    got = replay_many(plan_replay(n, src, dst, group), dur, delay)
    for k in range(5):
        np.testing.assert_array_equal(got[:, k], expected[k])


def test_cycles_are_refused_like_the_engine():
    with pytest.raises(CycleError):
        plan_replay(3, np.array([0, 1, 2]), np.array([1, 2, 0]))


def _sim_graph(**cfg):
    """(what-if graph, actual durations, ideal durations) of a small simulated job (flows off)."""
    sim = pytest.importorskip("rankscope.datasets.simulator")

    from rankscope.analysis.model.job_model import build_job_model
    from rankscope.analysis.whatif.build import build_graph
    from rankscope.analysis.whatif.metrics import ideal_durations
    from rankscope.collectors.job_frames import JobFrames

    res = sim.simulate(sim.SimConfig(flows=False, **cfg))
    frames = JobFrames.from_frames("default", **{k: pl.from_arrow(v) for k, v in res.tables.items()
                                                 if k in ("comm_op", "compute_op", "step_mark")})
    graph = build_graph(build_job_model(frames).frames)
    return graph, graph.actual, ideal_durations(graph)


def test_graph_step_times_many_equals_step_times():
    pytest.importorskip("rankscope.datasets.simulator")
    from rankscope.datasets.sim.job_config import Fault

    graph, actual, ideal = _sim_graph(dp=2, pp=2, tp=2, steps=3, microbatches=2,
                                      faults=(Fault("slow-worker", {"rank": 3, "factor": 1.5}),))
    mix = np.where(np.arange(len(actual)) % 2 == 0, actual, ideal)
    delay = graph.launch_delays()
    many = graph.step_times_many(np.stack([actual, ideal, mix], axis=1), delay)
    for k, d in enumerate((actual, ideal, mix)):
        np.testing.assert_array_equal(many[:, k], graph.step_times(d, delay))


@pytest.mark.parametrize("block_ops", [1, 300, 1 << 20])
@pytest.mark.parametrize("joined", [False, True])
def test_blocks_replay_like_one_graph(joined, block_ops):
    # two independent copies of a random graph as blocks; joined: an edge across them (blocks ignored);
    # block_ops: each block its own (1), or merged into one (the copies hold fewer ops than block_ops)
    rng = np.random.default_rng(5)
    src, dst, group = _random_graph(rng, n=200)
    n = len(group)
    src2, dst2 = np.r_[src, src + n], np.r_[dst, dst + n]
    group2 = np.r_[group, np.where(group >= 0, group + group.max() + 1, -1)]
    if joined:
        src2, dst2 = np.r_[src2, 0], np.r_[dst2, n + 1]
    dur = rng.uniform(1, 100, (2 * n, 2))
    try:
        expected = replay_many(plan_replay(2 * n, src2, dst2, group2), dur)
    except CycleError:
        pytest.skip("random groups formed a cycle")
    block = np.r_[np.zeros(n, int), np.ones(n, int)]
    plan = plan_replay(2 * n, src2, dst2, group2, block=block, block_ops=block_ops)
    np.testing.assert_array_equal(replay_many(plan, dur), expected)
    if not joined:  # separate blocks are processed apart: their waves do not mix
        one = plan_replay(2 * n, src2, dst2, group2)
        assert (len(plan.waves) > len(one.waves)) == (block_ops < n), (len(plan.waves), len(one.waves), n)


def test_choice_replayer_equals_step_times_of_the_scenario_durations():
    from rankscope.analysis.whatif.scenarios import Scenarios, step_times

    graph, actual, ideal = _sim_graph(dp=2, pp=2, tp=2, steps=3, microbatches=2)
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 5, len(actual))
    sc = Scenarios(labels, rng.random((6, 5)) < 0.5, np.array([False, True, False, True, True, False]))
    delay = graph.launch_delays()
    # steps are independent blocks: step ends come from per-step super-node runs
    assert graph._super_step_runs() is not None
    got = step_times(graph, actual, ideal, sc, launch_delay=delay)
    for k in range(6):
        np.testing.assert_array_equal(got[:, k], graph.step_times(sc.durations(k, actual, ideal), delay))
    # a negative transfer time: step ends from the ops' own ends (a group's node may end after a member's
    # tail), as the per-op step replayer
    ideal_neg = ideal.copy()
    ideal_neg[np.flatnonzero(graph.group >= 0)[::3]] = -5e5
    got = step_times(graph, actual, ideal_neg, sc, launch_delay=delay)
    run = graph.step_replayer(delay)
    for k in range(6):
        np.testing.assert_array_equal(got[:, k], run(sc.durations(k, actual, ideal_neg)))


def test_super_nodes_number_like_unique_of_the_group_keys():
    from rankscope.analysis.replay.waves import _super_nodes

    rng = np.random.default_rng(1)
    for n in (0, 1, 7, 5000):
        for p_lone in (0.0, 0.4, 1.0):
            g = np.where(rng.random(n) < p_lone, -1, rng.integers(0, max(1, n // 3), n))
            _, ref = np.unique(np.where(g < 0, -(np.arange(n) + 1), g), return_inverse=True)
            np.testing.assert_array_equal(_super_nodes(g), ref.reshape(-1))


def test_scenarios_with_the_same_choices_replay_once_and_alike():
    from rankscope.analysis.whatif.graph import WhatIfGraph
    from rankscope.analysis.whatif.scenarios import Scenarios, step_times

    graph, actual, ideal = _sim_graph(dp=2, pp=2, tp=1, steps=2, microbatches=2)
    labels = np.arange(len(actual)) % 3
    sel = np.array([[True, False, True], [False, True, False], [True, False, True], [True, True, True],
                    [False, False, False]])
    remove = np.array([False, True, False, False, True])  # 1 = remove of 0's complement; 2 = 0; 4 = 3
    calls = []
    orig = WhatIfGraph.choice_replayer

    def counting(self, *a, **kw):
        run = orig(self, *a, **kw)

        def counted(select, rem):
            calls.append(1)
            return run(select, rem)
        return counted

    WhatIfGraph.choice_replayer = counting
    try:
        got = step_times(graph, actual, ideal, Scenarios(labels, sel, remove))
    finally:
        WhatIfGraph.choice_replayer = orig
    assert len(calls) == 2
    for k in range(5):
        np.testing.assert_array_equal(got[:, k], graph.step_times(Scenarios(labels, sel, remove).durations(
            k, actual, ideal)))


# steps replayed as columns of one step's plan (replay.step_template) equal the whole graph's replay, bit for
# bit; steps that differ fall back to the whole graph

def _whole(graph):
    """The same graph with the step template turned off (its own plan cache)."""
    return dataclasses.replace(graph, notes={k: v for k, v in graph.notes.items() if not k.startswith("_")}
                               | {"_step_template": False})


@pytest.mark.parametrize("cfg,shared", [(dict(dp=2, pp=2, tp=2, steps=4, microbatches=2), True),
                                        (dict(dp=2, pp=4, tp=1, steps=3, microbatches=4), True),
                                        # jitter makes one step's trace contradict one of its edges: that
                                        # step's graph differs, so the whole graph is replayed
                                        (dict(dp=2, pp=4, tp=1, steps=3, microbatches=4, jitter=0.2), False)])
def test_template_replay_equals_the_whole_graph(cfg, shared):
    from rankscope.analysis.whatif.scenarios import Scenarios, step_times

    graph, actual, ideal = _sim_graph(**cfg)
    whole = _whole(graph)
    assert graph._replay_plan().columns == (len(graph.steps) if shared else 1)
    assert whole._replay_plan().columns == 1
    rng = np.random.default_rng(5)
    # labels that differ between steps (choices per node and step), and labels by rank, as the what-if
    # metrics give them (one choice per template node, broadcast over the steps)
    for labels in (rng.integers(0, 6, len(actual)), graph.ops["rank"].to_numpy() % 6):
        sc = Scenarios(labels, rng.random((5, 6)) < 0.5, np.array([False, True, False, True, False]))
        delay = graph.launch_delays()
        np.testing.assert_array_equal(step_times(graph, actual, ideal, sc, delay),
                                      step_times(whole, actual, ideal, sc, delay))
    # the per-op step ends (a negative transfer time) and the plain step replayer agree as well
    neg = ideal.copy()
    neg[np.flatnonzero(graph.group >= 0)[::3]] = -5e5
    np.testing.assert_array_equal(step_times(graph, actual, neg, sc, delay), step_times(whole, actual, neg, sc, delay))
    for d in (actual, neg):
        np.testing.assert_array_equal(graph.step_replayer(delay)(d), whole.step_replayer(delay)(d))
    np.testing.assert_array_equal(graph.step_replayer()(actual), graph.step_times(actual))  # the engine


def test_steps_that_differ_have_no_template():
    graph, _, _ = _sim_graph(dp=2, pp=2, tp=1, steps=3, microbatches=2)
    args = graph.ops, graph.src, graph.dst, graph.group, graph.step_index
    t = step_template(*args)
    assert t is not None and t.n_steps == 3 and t.n_ops * 3 == graph.ops.height
    # every op of step s at its position: ranks agree position by position
    ranks = graph.ops["rank"].to_numpy()[t.op_of]
    assert (ranks == ranks[0]).all()
    # one edge fewer in the last step
    last = np.flatnonzero(graph.step_index[graph.src] == 2)[0]
    keep = np.arange(graph.src.size) != last
    assert step_template(graph.ops, graph.src[keep], graph.dst[keep], graph.group, graph.step_index) is None
    # a sync group that joins two steps
    g = graph.group.copy()
    a, b = np.flatnonzero((g >= 0) & (graph.step_index == 0))[0], np.flatnonzero((g >= 0) & (graph.step_index == 1))[0]
    g[b] = g[a]
    assert step_template(graph.ops, graph.src, graph.dst, g, graph.step_index) is None
    # a rank that runs one op more in one step
    extra = graph.ops.head(1).with_columns(pl.lit(2, dtype=graph.ops["step"].dtype).alias("step"))
    ops = pl.concat([graph.ops, extra])
    assert step_template(ops, graph.src, graph.dst, np.r_[graph.group, -1], np.r_[graph.step_index, 2]) is None
    # a single step has nothing to share
    one = graph.step_index == 0
    assert step_template(graph.ops.filter(pl.Series(one)), graph.src[:0], graph.dst[:0], graph.group[one],
                         graph.step_index[one]) is None


def test_ops_listed_out_of_step_order_share_the_template():
    """The OSDI'25 graph lists its ops by dp rank, then step: the template must not need ops sorted by step
    (it did, and 1,024-worker jobs replayed the whole graph's plan: 2.2 s of a 17 s analysis)."""
    graph, _, _ = _sim_graph(dp=2, pp=2, tp=2, steps=4, microbatches=2)
    perm = np.random.default_rng(3).permutation(graph.ops.height)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size)
    shuffled = dataclasses.replace(graph, ops=graph.ops[perm], src=inv[graph.src], dst=inv[graph.dst],
                                   group=graph.group[perm], step_index=graph.step_index[perm],
                                   notes={k: v for k, v in graph.notes.items() if not k.startswith("_")})
    assert np.any(np.diff(shuffled.step_index) < 0)
    assert shuffled._replay_plan().columns == len(graph.steps)
    delay = shuffled.launch_delays()
    actual = shuffled.actual
    np.testing.assert_array_equal(shuffled.step_replayer(delay)(actual), _whole(shuffled).step_replayer(delay)(actual))
    np.testing.assert_array_equal(shuffled.step_replayer()(actual), shuffled.step_times(actual))


@pytest.mark.parametrize("template", [True, False])
def test_replay_detail_equals_the_engine(template):
    """Every engine node's ready and end time from the shared plan (one step's, or the whole graph's) equal
    the engine's own replay bit for bit: the critical path reads its binding links off them."""
    from rankscope.analysis.replay.engine import replay

    graph, actual, _ = _sim_graph(dp=2, pp=4, tp=1, steps=3, microbatches=4)
    if not template:
        graph = _whole(graph)
    assert (graph._replay_plan().columns > 1) == template
    delay = graph.launch_delays()
    src, dst, group, tail = graph.replay_nodes()
    synced = tail >= 0
    want = replay(np.concatenate([np.where(synced, 0.0, actual), actual[synced]]), src, dst, sync_group=group,
                  launch_delay=np.concatenate([delay, np.zeros(int(synced.sum()))]))
    ready, end = graph.replay_detail(actual, delay)
    np.testing.assert_array_equal(ready, want.ready)
    np.testing.assert_array_equal(end, want.end)
