"""Flows-only slow pipeline stage on hand-built records: which stage a pipeline falls behind from, its TP
group's pipelines late alike, clocks that cannot be compared, and readings no slow stage makes."""

from dataclasses import replace

import numpy as np
import polars as pl

from rankscope.analysis.report import Steps, Strategy
from rankscope.analysis.report.strategy import FlowsDetail
from rankscope.analysis.stragglers.findings import findings_of
from rankscope.analysis.stragglers.from_flows import flow_straggler_section
from rankscope.analysis.stragglers.late_arrivals import late_stage, late_stage_unread
from tests.unit.analysis.flow_records import STEP, frame


def _pipeline_records(slow_pipe=None, slow_stage=None, late_start=None, n_pipes=5, pp=4, steps=6, extra=None,
                      backward=False):
    """Forward sends of each pipeline's first microbatch: stage k sends 40 ms after it received; a slow
    stage takes 40 ms more (or ``extra[(pipe, stage)]``). ``late_start``: a pipeline whose first stage
    starts 30 ms late but whose later stages catch up (late for another reason, not a slow stage).
    ``backward``: the last stage sends its first gradient back after 40 ms forward and 40 ms backward
    (a slow last stage takes twice its extra)."""
    extra = extra or {(slow_pipe, slow_stage): 40_000_000}
    rows = []
    rng = np.random.default_rng(5)
    pipes = [[f"10.{k}.{p}.1" for k in range(pp)] for p in range(n_pipes)]
    for s in range(steps):
        for p, addrs in enumerate(pipes):
            t = s * STEP + int(rng.normal(0, 1e5))
            for k in range(pp - 1):
                t += 40_000_000 + extra.get((p, k), 0)
                if p == late_start:
                    t += 30_000_000 if k == 0 else -30_000_000 if k == 1 else 0
                rows.append((addrs[k], addrs[k + 1], t, t + 5_000_000, 1e8, True))
                t += 5_000_000
            if backward:
                t += 80_000_000 + 2 * extra.get((p, pp - 1), 0)
                rows.append((addrs[-1], addrs[-2], t, t + 5_000_000, 1e8, True))
    strat = Strategy(dp=n_pipes, pp=pp, pp_groups=pipes, flows=FlowsDetail(),
                     dp_groups=[[pipes[p][k] for p in range(n_pipes)] for k in range(pp)])
    return frame(rows), strat


def test_a_slow_stage_is_the_first_from_which_its_pipeline_stays_late():
    f, strat = _pipeline_records(slow_pipe=2, slow_stage=1)
    x = late_stage(f, strat, STEP, 1)
    assert x["culprit"] == "10.1.2.1" and x["stage"] == 1 and 1.8 < x["factor"] < 2.2
    assert late_stage(_pipeline_records()[0], strat, STEP, 1) is None
    # late at its start, on time further on: not a slow stage
    f, strat = _pipeline_records(late_start=3)
    assert late_stage(f, strat, STEP, 1) is None
    # stage order unknown: the direction of the pipeline is a guess, nobody is named
    f, strat = _pipeline_records(slow_pipe=2, slow_stage=1)
    strat = replace(strat, flows=replace(strat.flows, stage_order_known=False))
    assert late_stage(f, strat, STEP, 1) is None


def test_a_slow_last_stage_is_named_from_its_first_gradient_sent_back():
    # two stages: the last sends no activations, only the gradients back
    f, strat = _pipeline_records(slow_pipe=3, slow_stage=1, pp=2, backward=True)
    x = late_stage(f, strat, STEP, 1)
    assert x is not None and x["culprit"] == "10.1.3.1" and x["stage"] == 1, x
    # forward + backward took 80 ms more than the others' 80 ms (+ the 5 ms transfer): about 2x
    assert 1.8 < x["factor"] < 2.1, x["factor"]
    assert late_stage(_pipeline_records(pp=2, backward=True)[0], strat, STEP, 1) is None
    # a slow earlier stage still comes first: its lateness carries on to the last stage's gradient
    f, strat = _pipeline_records(slow_pipe=2, slow_stage=1, backward=True)
    assert late_stage(f, strat, STEP, 1)["culprit"] == "10.1.2.1"


def test_a_last_stage_late_after_earlier_stages_slightly_late_names_nobody():
    # GPipe: the last stage runs every micro-batch's forward before its first backward, so an earlier stage
    # slow by a little delays each arrival and the last stage's first gradient by their sum. Stages 1-2 of
    # pipeline 2 are 0.3 ms late (under the bar), its last stage's gradient 30 ms: the last stage, or
    # stage 1 multiplied, so the pipeline is named, not an address (dev corpus: slow workers at stages 1,
    # 2 and 6 were named at the last stage)
    f, strat = _pipeline_records(extra={(2, 1): 300_000, (2, 3): 15_000_000}, backward=True)
    x = late_stage(f, strat, STEP, 1)
    assert x is not None and x["culprit"] is None and x["kind"] == "late_pipelines", x
    assert set(x["members"]) == set(strat.pp_groups[2]) and x["stage"] == 3
    # the same last stage with the earlier stages on time is named
    f, strat = _pipeline_records(extra={(2, 3): 15_000_000}, backward=True)
    assert late_stage(f, strat, STEP, 1)["culprit"] == strat.pp_groups[2][3]


def test_a_slow_ring_and_a_late_pipeline_read_together():
    from rankscope.analysis.stragglers.from_flows import _ring_and_late_stage

    ring = {"kind": "slow_group", "culprit": None, "members": ["a1", "b1", "c1"], "extra_ns": 9e8, "factor": 3.0,
            "group": 1}
    late = {"kind": "slow_worker", "culprit": "b2", "pipeline": ["b0", "b1", "b2"], "extra_ns": 3e8, "factor": 1.2,
            "stage": 2}
    # the ring crosses the late pipeline at b1, not at its late stage: a slow NIC at b1 would hold up the
    # pipeline as well as a slow worker at b2 would keep b1's ring waiting; the larger cost (the ring's) is
    # kept and the late stage names nobody
    r, x, amb = _ring_and_late_stage(ring, late)
    assert r is ring and x["culprit"] is None and amb["rank"] == "b2" and amb["ring"] == ring["members"]
    # the late stage's cost larger: it keeps its name, and the ring is no longer a verdict of its own
    r, x, amb = _ring_and_late_stage(ring, {**late, "extra_ns": 2e9})
    assert x["culprit"] == "b2" and r["kind"] != "slow_group" and amb["between"] == ["communication", "worker"]
    # the ring crosses at the late stage itself: that address, with the larger cost's cause
    r, x, amb = _ring_and_late_stage(ring, {**late, "culprit": "b1", "stage": 1})
    assert r is None and x["culprit"] == "b1" and x["kind"] == "slow_nic" and amb["rank"] == "b1"
    # a pipeline the ring does not cross, or a ring with its member named: nothing changes
    other = {**late, "pipeline": ["d0", "d1", "d2"], "culprit": "d2"}
    assert _ring_and_late_stage(ring, other) == (ring, other, None)
    named = {**ring, "culprit": "b1", "kind": "slow_nic"}
    assert _ring_and_late_stage(named, late) == (named, late, None)


def test_pipelines_as_late_from_one_stage_name_nobody_even_when_only_one_clears_the_bar():
    # a slow worker in a tensor-parallel group delays every pipeline of the group alike; on a 5 ms clock
    # (noise floor 10 ms) one reads 65 ms late (6.5 sd) and its mate 55 ms (5.5 sd): naming the first
    # would name a worker flows cannot single out
    f, strat = _pipeline_records(extra={(1, 1): 55_000_000, (2, 1): 65_000_000}, n_pipes=8)
    x = late_stage(f, strat, STEP, 5_000_000)
    assert x["culprit"] is None and x["kind"] == "late_pipelines", x
    assert x["members"] == ["10.1.1.1", "10.1.2.1"] and x["stage"] == 1
    # the report: a worker straggler on one of them, nobody named
    st = flow_straggler_section(f, strat, Steps(count=6, median_ns=STEP), 5_000_000)
    # the top worker is one of the TP group's endpoints, each as right as the other
    assert st.verdict == "worker" and [w.one_of for w in st.top_workers] == [["10.1.1.1", "10.1.2.1"]], st
    # its cost is what the step waits for: the pipelines end 65 ms late (a lateness here, not a slower pace)
    assert st.culprits["worker"]["ranks"] == ["10.1.1.1", "10.1.2.1"]
    assert abs(st.slowdown - STEP / (STEP - 65_000_000)) < 0.003, st.slowdown
    from rankscope.analysis.report.diagnosis import Diagnosis
    from rankscope.analysis.report.summary import summary_text

    text = summary_text(Diagnosis(job="j", stragglers=st, findings=findings_of(st)))
    assert text.startswith("verdict worker: one of 10.1.1.1, 10.1.2.1 (stage 1) computes"), text
    assert "the the" not in text and "the same stage's forward time in the other pipelines" in text, text
    # the mate far less late: the one pipeline is still named
    f, strat = _pipeline_records(extra={(1, 1): 15_000_000, (2, 1): 65_000_000}, n_pipes=8)
    assert late_stage(f, strat, STEP, 5_000_000)["culprit"] == "10.1.2.1"


def test_a_late_two_stage_pipeline_group_under_the_bar_is_said_with_its_cost_a_lower_bound():
    # two pipelines of one TP group 30 ms late from stage 0 of two: no later stage gives the forward time,
    # so the cost is the lateness alone (S 1.03, under the bar) and the summary says it is a lower bound
    from rankscope.analysis.report.diagnosis import Diagnosis
    from rankscope.analysis.report.summary import summary_text

    f, strat = _pipeline_records(extra={(1, 0): 30_000_000, (2, 0): 30_000_000}, n_pipes=8, pp=2)
    st = flow_straggler_section(f, strat, Steps(count=6, median_ns=STEP), 1)
    assert st.verdict == "none" and not st.top_workers
    (under,) = st.below_threshold
    assert under["kind"] == "late_pipelines" and under["members"] == ["10.0.1.1", "10.0.2.1"] and under["cost"]
    text = summary_text(Diagnosis(job="j", stragglers=st, findings=findings_of(st)))
    assert "under the bar: late_pipelines one of 10.0.1.1, 10.0.2.1, 30 ms late a step (a lower bound)" in text, text
    (f,) = findings_of(st)
    assert f.kind == "slow_worker" and f.culprit.one_of == ["10.0.1.1", "10.0.2.1"] and f.evidence["cost"]


def test_two_pipelines_alone_name_nobody():
    # DP2: one pipeline later than the other could as well be a steady difference between the two (a
    # clean DP16 x PP2 job's two pipelines on one rail read 1.9 ms apart at the last stage): not read
    f, strat = _pipeline_records(slow_pipe=1, slow_stage=2, n_pipes=2)
    assert late_stage(f, strat, STEP, 1) is None


def test_half_the_pipelines_late_from_one_stage_is_a_tp_group_and_a_majority_is_nobody():
    # a slow worker of a TP group on two rails delays two of four pipelines alike: the median of all four
    # sat between them and nobody was late; the two above the widest gap are set against the two below
    f, strat = _pipeline_records(extra={(0, 1): 40_000_000, (2, 1): 40_000_000}, n_pipes=4)
    x = late_stage(f, strat, STEP, 1)
    assert x["kind"] == "late_pipelines" and x["members"] == ["10.1.0.1", "10.1.2.1"] and x["stage"] == 1, x
    # five of eight late: more than half sit above the widest gap, so none is late against the others
    f, strat = _pipeline_records(extra={(p, 1): 40_000_000 for p in range(5)}, n_pipes=8)
    assert late_stage(f, strat, STEP, 1) is None


def test_sends_on_exporters_that_share_no_flow_are_not_compared():
    # two rails, each with its own exporter and an offset nobody could measure (they share no flow):
    # rail b's clock runs 3 ms ahead, so its three pipelines read late from stage 0 in a clean job
    f, strat = _pipeline_records(n_pipes=6)
    rail_b = pl.col("src_addr").str.contains(r"^10\.\d+\.[345]\.")
    f = f.with_columns(pl.col("start_ns") + pl.when(rail_b).then(3_000_000).otherwise(0),
                       pl.col("end_ns") + pl.when(rail_b).then(3_000_000).otherwise(0),
                       exporter=pl.when(rail_b).then(pl.lit("b")).otherwise(pl.lit("a")))
    # read as one clock, the rail is a late set
    assert late_stage(f, strat, STEP, 1, {"a": "a", "b": "a"})["kind"] == "late_pipelines"
    # each rail on its own clock: nothing is late
    assert late_stage(f, strat, STEP, 1, {"a": "a", "b": "b"}) is None
    assert late_stage(f, strat, STEP, 1) is None
    # a slow stage is still found among its own rail's pipelines
    g, _ = _pipeline_records(slow_pipe=4, slow_stage=1, n_pipes=6)
    g = g.with_columns(exporter=pl.when(rail_b).then(pl.lit("b")).otherwise(pl.lit("a")))
    assert late_stage(g, strat, STEP, 1)["culprit"] == "10.1.4.1"
    # one pipeline alone on an exporter whose clock runs 3 ms ahead reads late from stage 0: its clock's
    # offset would read the same, so nobody is named; late from a later stage, it is still named
    f, strat5 = _pipeline_records()
    alone = pl.col("src_addr").str.contains(r"^10\.\d+\.4\.")
    shift = pl.when(alone).then(3_000_000).otherwise(0)
    f = f.with_columns(pl.col("start_ns") + shift, pl.col("end_ns") + shift,
                       exporter=pl.when(alone).then(pl.lit("b")).otherwise(pl.lit("a")))
    assert late_stage(f.drop("exporter"), strat5, STEP, 1)["culprit"] == "10.0.4.1"
    assert late_stage(f, strat5, STEP, 1) is None
    g, _ = _pipeline_records(slow_pipe=4, slow_stage=1)
    g = g.with_columns(exporter=pl.when(alone).then(pl.lit("b")).otherwise(pl.lit("a")))
    assert late_stage(g, strat5, STEP, 1)["culprit"] == "10.1.4.1"


def test_the_pipelines_of_one_replica_are_not_compared():
    # DP1: the pipelines are the replica's TP copies on several rails, which keep time with each other
    f, strat = _pipeline_records(slow_pipe=1, slow_stage=2, n_pipes=2)
    strat = replace(strat, dp=1)
    assert late_stage(f, strat, STEP, 1) is None


def test_exporter_clocks_keep_unmatched_exporters_apart():
    from rankscope.analysis.model.clocks import exporter_clocks

    off = pl.DataFrame({"exporter": ["r", "p1", "rail1"], "offset_ns": [0.0, 5e5, 0.0], "num_matched": [0, 40, 0]})
    assert exporter_clocks(off) == {"r": "r", "p1": "r", "rail1": "rail1"}
    assert exporter_clocks(off.head(0)) == {}


def test_a_stage_whose_earlier_stages_are_partly_late_too_is_no_single_slow_stage():
    # 5 ms clock (noise floor 10 ms): stage 1 reads 30 ms late (3 sd, under the bar) and stage 2 70 ms:
    # a single slow stage 2 would leave stage 1 on time, so nobody is named
    f, strat = _pipeline_records(extra={(2, 1): 30_000_000, (2, 2): 40_000_000}, n_pipes=8)
    assert late_stage(f, strat, STEP, 5_000_000) is None
    # stage 1 on time: stage 2 is named
    f, strat = _pipeline_records(extra={(2, 2): 70_000_000}, n_pipes=8)
    assert late_stage(f, strat, STEP, 5_000_000)["culprit"] == "10.2.2.1"


def test_a_send_later_than_many_forward_times_is_no_slow_worker():
    # 600 ms late against a 40 ms forward: 16x, a burst of another phase of the step read as the send
    f, strat = _pipeline_records(extra={(2, 1): 600_000_000}, n_pipes=8)
    assert late_stage(f, strat, STEP, 1) is None


def test_why_pipelines_are_not_read_is_said():
    two = Strategy(dp=2, pp=2, pp_groups=[["a0", "a1"], ["b0", "b1"]], dp_groups=[["a0", "b0"], ["a1", "b1"]])
    assert "2 pipelines" in late_stage_unread(two)
    assert "one data-parallel replica" in late_stage_unread(replace(two, dp=1))
    assert late_stage_unread(Strategy(dp=4, pp=1, dp_groups=[["a", "b", "c", "d"]])) == "not evaluated: no pipeline"
