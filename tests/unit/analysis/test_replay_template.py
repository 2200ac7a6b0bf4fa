"""Steps replayed as columns of one step's plan equal the whole graph's replay, bit for bit; steps that
differ fall back to the whole graph."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.replay_template import step_template


def _sim_graph(**cfg):
    sim = pytest.importorskip("rankscope.datasets.simulator")
    from rankscope.analysis.job_model import build_job_model
    from rankscope.analysis.whatif_graph import build_graph
    from rankscope.analysis.whatif_metrics import ideal_durations
    from rankscope.collectors.job_frames import JobFrames

    res = sim.simulate(sim.SimConfig(flows=False, **cfg))
    frames = JobFrames.from_frames("default", **{k: pl.from_arrow(v) for k, v in res.tables.items()
                                                 if k in ("comm_op", "compute_op", "step_mark")})
    graph = build_graph(build_job_model(frames).frames)
    return graph, graph.actual, ideal_durations(graph)


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
    from rankscope.analysis.whatif_batch import Scenarios, step_times

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
