"""The critical path's template replays (analysis/critical_path/template.py) give what the wave plan gives, bit
for bit, on the OSDI'25 reference traces: every step's path, the edits' predictions, the step times of edited
durations, the op-type columns the edits read."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rankscope.analysis.critical_path import path_of_graph, step_paths
from rankscope.analysis.critical_path import template as tpl
from rankscope.analysis.critical_path.edits import _string_columns
from rankscope.analysis.critical_path.path import path_delays
from rankscope.analysis.model.job_model import build_job_model
from rankscope.analysis.whatif.build import model_graph
from rankscope.analysis.whatif.metrics import ideal_durations
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.job_frames import load_job
from rankscope.collectors.store import Store


@pytest.fixture(scope="module")
def graphs(reference_dir, tmp_path_factory):
    d = reference_dir / "stragglers-osdi25"
    if not d.is_dir():
        pytest.skip(f"{d} not found")
    store = Store(tmp_path_factory.mktemp("osdi-tpl") / "st")
    ingest(store, [d])
    out = {}
    for name in ("AR", "ST", "SE"):
        g = model_graph(build_job_model(load_job(store, name)))
        assert g.template is not None
        # the same graph without its template: the critical path replays it with the wave plan
        plain = dataclasses.replace(g, template=None, notes={k: v for k, v in g.notes.items() if not k.startswith("_")})
        out[name] = (g, plain)
    return out


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.int64)


@pytest.mark.parametrize("name", ["AR", "ST", "SE"])
def test_paths_and_edits_equal_the_wave_plans(graphs, name):
    g, plain = graphs[name]
    delay = path_delays(g)
    a, b = step_paths(g, g.actual, delay), step_paths(plain, plain.actual, delay)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        np.testing.assert_array_equal(x.view(np.int64) if x.dtype == np.float64 else x,
                                      y.view(np.int64) if y.dtype == np.float64 else y, err_msg=f.name)
    ideal = ideal_durations(g)
    assert path_of_graph(g, ideal, hooks_only=False) == path_of_graph(plain, ideal, hooks_only=False)


@pytest.mark.parametrize("name", ["AR", "SE"])
def test_edited_step_times_equal_the_wave_plans(graphs, name, monkeypatch):
    g, plain = graphs[name]
    delay = path_delays(g)
    rng = np.random.default_rng(40)
    edits, wants = [], []
    for size in (g.ops.height // 7, 1, g.ops.height // 50):
        ops = np.sort(rng.choice(g.ops.height, size=size, replace=False))
        faster = g.actual[ops] * rng.uniform(0.2, 1.0, ops.size)
        dur = g.actual.copy()
        dur[ops] = faster
        edits.append((ops, faster))
        wants.append(plain.step_replayer(delay)(dur))
    order = tpl.order_of(g)
    np.testing.assert_array_equal(_bits(tpl.step_times(g.template, order, dur, delay)), _bits(wants[-1]))
    # the edits as columns of one replay, and (a batch too small for two) one replay each
    for batch_bytes in (tpl.EDIT_BATCH_BYTES, 1):
        monkeypatch.setattr(tpl, "EDIT_BATCH_BYTES", batch_bytes)
        got = tpl.edit_replayer(g.template, order, g.actual, delay)(edits)
        assert len(got) == len(wants)
        for a, b in zip(got, wants, strict=True):
            np.testing.assert_array_equal(_bits(a), _bits(b))


def test_op_type_columns_read_by_template_position_equal_every_ops(graphs):
    g, plain = graphs["AR"]
    ours, theirs = _string_columns(g), _string_columns(plain)
    for a, b in zip(ours[1:], theirs[1:], strict=True):
        np.testing.assert_array_equal(a, b)
    # the codes may be numbered differently; they must group the ops alike
    pairs = np.unique(np.stack([ours[0], theirs[0]]), axis=1)
    assert pairs.shape[1] == np.unique(ours[0]).size == np.unique(theirs[0]).size
