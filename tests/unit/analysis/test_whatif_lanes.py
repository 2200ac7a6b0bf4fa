"""The lane replay of analysis/whatif/scenarios.py is a faster layout of the instance-by-instance template
replay, not another model: on random templates (tensor- and dp-synced groups, synced groups with and without
predecessors, transfer tails), random scenarios, launch delays and negative durations it gives the same step
times bit for bit."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rankscope.analysis.whatif import scenarios as sc_mod
from rankscope.analysis.whatif.graph import Template
from rankscope.analysis.whatif.scenarios import Scenarios, step_times


def _template(rng: np.random.Generator, n_steps: int, dp: int, layers: int = 6, width: int = 5) -> Template:
    """Ops in layers, edges from lower to higher layers, sync groups within a layer (so the super-node
    graph is acyclic); layer 0 has a dp-synced group without predecessors (a step's first all-gather)."""
    layer_of = np.repeat(np.arange(layers), width)
    n_t = layer_of.size
    src, dst = [], []
    for v in range(width, n_t):
        lower = np.flatnonzero(layer_of < layer_of[v])
        for u in rng.choice(lower, size=min(lower.size, int(rng.integers(1, 4))), replace=False):
            src.append(int(u))
            dst.append(v)
    groups = [((0, 1), True)]
    for layer in range(1, layers):
        ops = np.flatnonzero(layer_of == layer)
        rng.shuffle(ops)
        groups.append((tuple(int(m) for m in ops[:2]), bool(rng.random() < 0.5)))
        if rng.random() < 0.5:
            groups.append(((int(ops[2]),), bool(rng.random() < 0.5)))
    # op rows in an order unlike the instances' (a job's ops sorted by rank and time)
    rows = rng.permutation(n_steps * dp * n_t).reshape(n_steps * dp, n_t).astype(np.int32)
    return Template(rows=rows, src=np.array(src, dtype=np.int32), dst=np.array(dst, dtype=np.int32),
                    groups=tuple(groups), n_steps=n_steps, dp=dp)


def _case(seed: int, n_steps: int = 3, dp: int = 4):
    rng = np.random.default_rng(seed)
    t = _template(rng, n_steps, dp)
    n = t.rows.size
    actual = rng.uniform(1.0, 10.0, n).round(3)
    ideal = rng.uniform(0.5, 5.0, n).round(3)
    # labels that repeat every step: a code per (dp rank, template op), as rank x op group codes do
    per_op = rng.integers(0, 7, t.rows.shape[1])
    codes = (np.arange(dp)[:, None] * 7 + per_op[None, :])  # (dp, ops)
    labels = np.empty(n, dtype=np.int64)
    labels[t.rows] = np.tile(codes, (n_steps, 1))
    return t, actual, ideal, labels, dp * 7


def _graph(t: Template) -> SimpleNamespace:
    return SimpleNamespace(template=t, notes={}, steps=np.arange(t.n_steps))


def _instance_replay(t, actual, ideal, sc, delay=None) -> np.ndarray:
    g = _graph(t)
    return sc_mod._template_replay(g, sc_mod._plan(g), actual, ideal, sc, delay)


def _scenarios(rng, labels, n_codes, dp, k: int = 12) -> Scenarios:
    select = rng.random((k, n_codes)) < 0.5
    # dp rank scenarios (one rank's codes), all-actual, all-ideal, and random ones
    for d in range(min(dp, k - 2)):
        select[d] = np.arange(n_codes) // 7 == d
    select[-2], select[-1] = True, False
    return Scenarios(labels, select, rng.random(k) < 0.3)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.int64)


@pytest.mark.parametrize("seed", range(8))
def test_lanes_equal_the_instance_replay(seed):
    t, actual, ideal, labels, n_codes = _case(seed)
    sc = _scenarios(np.random.default_rng(seed + 100), labels, n_codes, t.dp)
    got = step_times(_graph(t), actual, ideal, sc)
    assert got.shape == (t.n_steps, sc.select.shape[0])
    np.testing.assert_array_equal(_bits(got), _bits(_instance_replay(t, actual, ideal, sc)))


@pytest.mark.parametrize("seed", range(4))
def test_lanes_with_launch_delays_and_negative_durations(seed):
    t, actual, ideal, labels, n_codes = _case(seed, n_steps=2, dp=3)
    rng = np.random.default_rng(seed + 200)
    sc = _scenarios(rng, labels, n_codes, t.dp)
    delay = rng.uniform(0.0, 2.0, actual.size).round(3)
    np.testing.assert_array_equal(_bits(step_times(_graph(t), actual, ideal, sc, launch_delay=delay)),
                                  _bits(_instance_replay(t, actual, ideal, sc, delay)))
    # a negative duration: every op's end goes into the step's maximum, not only those nothing waits for
    actual = actual.copy()
    actual[rng.integers(0, actual.size, 5)] *= -1
    np.testing.assert_array_equal(_bits(step_times(_graph(t), actual, ideal, sc)),
                                  _bits(_instance_replay(t, actual, ideal, sc)))


def test_one_scenario_of_every_code_alike_reads_no_labels():
    """The launch-delay replay (one scenario, all actual) needs neither labels nor the ideal."""
    t, actual, _, _, _ = _case(3)
    sc = Scenarios(np.zeros(actual.size, dtype=np.int64), np.array([[True]]), np.array([False]))
    ideal = np.full(actual.size, np.nan)  # never read
    got = step_times(_graph(t), actual, ideal, sc)
    np.testing.assert_array_equal(_bits(got), _bits(_instance_replay(t, actual, actual, sc)))


def test_labels_that_change_between_steps_take_the_instance_replay():
    t, actual, ideal, labels, n_codes = _case(5)
    labels = labels.copy()
    labels[t.rows[0, 0]] = (labels[t.rows[0, 0]] + 1) % n_codes  # step 0 differs from step 1
    sc = _scenarios(np.random.default_rng(7), labels, n_codes, t.dp)
    assert sc_mod._choice_per_step(t, sc) is None
    np.testing.assert_array_equal(_bits(step_times(_graph(t), actual, ideal, sc)),
                                  _bits(_instance_replay(t, actual, ideal, sc)))


def test_scenario_chunks_change_nothing(monkeypatch):
    t, actual, ideal, labels, n_codes = _case(2)
    sc = _scenarios(np.random.default_rng(9), labels, n_codes, t.dp, k=20)
    whole = step_times(_graph(t), actual, ideal, sc)
    monkeypatch.setattr(sc_mod, "MEMORY_BUDGET_BYTES", 1)  # one scenario per chunk
    np.testing.assert_array_equal(_bits(step_times(_graph(t), actual, ideal, sc)), _bits(whole))


def test_lanes_share_scenarios_that_choose_alike():
    """A dp rank's scenario is the ideal on every other dp rank: those pairs are one lane."""
    t, *_ = _case(1, dp=4)
    n_t = t.rows.shape[1]
    k, dp = 6, 4
    choice = np.zeros((n_t, k, dp), dtype=bool)
    for d in range(dp):
        choice[:, d, d] = True  # scenario d: actual on dp rank d
    choice[:, 5] = True  # all actual
    lane_c, lane_j, lane_of = sc_mod._lanes(choice, np.arange(n_t))
    # per dp rank: ideal-like (scenarios != d and 4), actual-like (d and 5)
    assert len(lane_c) == 2 * dp
    for j in range(dp):
        assert lane_of[j, j] == lane_of[5, j]
        assert len({lane_of[c, j] for c in range(5) if c != j}) == 1
        assert lane_of[j, j] != lane_of[4, j]
    assert (lane_j[lane_of] == np.arange(dp)[None, :]).all()
    assert (choice[:, lane_c[lane_of], lane_j[lane_of]] == choice).all()
