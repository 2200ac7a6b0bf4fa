"""The critical path on the OSDI'25 reference traces (issue 39): each share comes out as a figure.

AR slows one worker (dp rank 0 of stage 0), ST the last stage, SE skews the microbatches' sequence lengths.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from rankscope.analysis.critical_path import path_of_graph, step_paths
from rankscope.analysis.critical_path.path import path_delays
from rankscope.analysis.critical_path.shares import segment_frame
from rankscope.analysis.model.job_model import build_job_model
from rankscope.analysis.whatif.build import model_graph
from rankscope.analysis.whatif.metrics import ideal_durations
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.job_frames import load_job
from rankscope.collectors.store import Store


@pytest.fixture(scope="module")
def osdi(reference_dir, tmp_path_factory):
    d = reference_dir / "stragglers-osdi25"
    if not d.is_dir():
        pytest.skip(f"{d} not found")
    store = Store(tmp_path_factory.mktemp("osdi-cp") / "st")
    ingest(store, [d])
    cache = {}

    def get(name: str):
        if name not in cache:
            g = model_graph(build_job_model(load_job(store, name)))
            seg = segment_frame(g, step_paths(g, g.actual, path_delays(g)))
            cache[name] = (g, seg)
        return cache[name]

    return get


def _per_step_share(seg: pl.DataFrame, mask: pl.Expr) -> np.ndarray:
    per = seg.group_by("step_index").agg(pl.col("dur_ns").filter(mask).sum().alias("on"),
                                         pl.col("dur_ns").sum().alias("all")).sort("step_index")
    return (per["on"] / per["all"]).to_numpy()


def test_paths_add_up_to_the_recorded_steps(osdi):
    for name in ("AR", "ST", "SE"):
        g, seg = osdi(name)
        c = path_of_graph(g, ideal_durations(g), hooks_only=False)
        print(f"{name}: replayed vs recorded step time, worst relative error {c.replay_vs_recorded_max_rel_err:.2e}")
        assert c.evaluated and c.replay_vs_recorded_max_rel_err < 0.01


def test_ar_path_runs_through_the_slow_workers_compute(osdi):
    g, seg = osdi("AR")
    place = g.ops.select("rank", "dp_rank", "stage").unique()
    slow = place.filter((pl.col("dp_rank") == 0) & (pl.col("stage") == 0))["rank"].to_list()
    assert len(slow) == 1
    compute = ~pl.col("comm") & pl.col("op_class").str.ends_with("-compute")
    share = _per_step_share(seg, compute & (pl.col("rank") == slow[0]))
    whole = _per_step_share(seg, pl.col("rank") == slow[0])
    print(f"AR: slow worker rank {slow[0]}: its compute holds {np.median(share):.3f} of the path (median over "
          f"{share.size} steps, least {share.min():.3f}); with its launch gaps {np.median(whole):.3f}")
    assert np.median(share) > 0.5 and share.min() > 0.4


def test_st_path_runs_through_the_last_stage(osdi):
    g, seg = osdi("ST")
    last = int(g.ops["stage"].max())
    share = _per_step_share(seg, pl.col("stage") == last)
    fair = 1 / g.ops["stage"].n_unique()
    print(f"ST: last stage {last} holds {np.median(share):.3f} of the path (median over {share.size} steps, "
          f"least {share.min():.3f}; a fair share is {fair:.3f})")
    assert np.median(share) > 0.5 and share.min() > fair


def test_se_path_follows_the_long_microbatches_from_step_to_step(osdi):
    g, seg = osdi("SE")
    top = seg.group_by("step_index", "rank").agg(pl.col("dur_ns").sum()).sort(
        ["step_index", "dur_ns", "rank"], descending=[False, True, False]).group_by(
        "step_index", maintain_order=True).first()
    # each rank's compute per step against its stage peers' in that step: the long microbatches' ranks
    comp = g.ops.filter(pl.col("optype").is_in(["forward-compute", "backward-compute"])).with_columns(
        pl.Series("si", g.step_index[g.ops["optype"].is_in(["forward-compute", "backward-compute"]).to_numpy()]),
        (pl.col("end_ns") - pl.col("start_ns")).alias("d")).group_by("si", "rank", "stage").agg(pl.col("d").sum())
    ranked = comp.with_columns((pl.col("d").rank("min", descending=True).over("si", "stage")).alias("place"),
                               pl.len().over("si", "stage").alias("n"))
    hit = top.join(ranked, left_on=["step_index", "rank"], right_on=["si", "rank"])
    in_top_quarter = float(((hit["place"] - 1) < hit["n"] / 4).mean())
    distinct = top["rank"].n_unique()
    print(f"SE: the path's top rank changes: {distinct} distinct ranks over {top.height} steps; in "
          f"{in_top_quarter:.3f} of the steps it is among the quarter of its stage with the most compute")
    assert distinct >= top.height / 4
    assert in_top_quarter >= 0.75


@pytest.mark.parametrize("name", ["AR", "ST", "SE"])
def test_the_graphs_own_instances_give_the_step_template(osdi, name):
    """The OSDI'25 graph's per-(step, dp rank) instances order each step's positions (no sort of every op);
    the replay through that template equals the whole graph's, bit for bit, and so do the binding times
    the critical path reads."""
    import dataclasses

    from rankscope.analysis.replay.step_template import step_template

    g, _ = osdi(name)
    order = g._instance_order()
    assert order is not None and order.shape[0] == len(g.steps)
    t = step_template(g.ops, g.src, g.dst, g.group, g.step_index, order)
    assert t is not None
    fresh = dataclasses.replace(g, notes={k: v for k, v in g.notes.items() if not k.startswith("_")})
    whole = dataclasses.replace(g, notes={k: v for k, v in g.notes.items() if not k.startswith("_")}
                                | {"_step_template": False})
    assert fresh._replay_plan().columns == len(g.steps)
    delay = path_delays(g)
    np.testing.assert_array_equal(fresh.step_replayer(delay)(g.actual), whole.step_replayer(delay)(g.actual))
    for a, b in zip(fresh.replay_detail(g.actual, delay), whole.replay_detail(g.actual, delay), strict=True):
        np.testing.assert_array_equal(a, b)
