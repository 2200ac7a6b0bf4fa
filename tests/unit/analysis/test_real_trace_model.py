"""The what-if model on what real CPU (gloo) traces look like: async sends, collectives nested in compute
spans, start-up steps, descheduled passes and transfers (issue 12, truth matrix)."""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.model.steps import startup_steps
from rankscope.analysis.stragglers.config import StragglerConfig, evidenced_verdict
from rankscope.analysis.whatif.evidence import persistent_links
from rankscope.analysis.whatif.generic import generic_graph
from rankscope.analysis.whatif.graph import BWD, FWD
from rankscope.analysis.whatif.sequence import heaviest_agreement
from rankscope.collectors.job_frames import JobFrames

MS = 1_000_000
T0 = 1_700_000_000 * 10**9


def _comp(rows):
    return pl.DataFrame([(r, s, mb, cat, T0 + a * MS, T0 + b * MS) for r, s, mb, cat, a, b in rows],
                        schema={"rank": pl.Int64, "step": pl.Int64, "microbatch": pl.Int64, "category": pl.Utf8,
                                "start_ns": pl.Int64, "end_ns": pl.Int64}, orient="row").with_columns(
        pl.col("category").alias("name"), pl.lit(None, dtype=pl.Int64).alias("stage"))


def _comm(rows):
    return pl.DataFrame([(r, s, mb, op, gid, seq, peer, T0 + a * MS, T0 + b * MS, 1024)
                         for r, s, mb, op, gid, seq, peer, a, b in rows],
                        schema={"rank": pl.Int64, "step": pl.Int64, "microbatch": pl.Int64, "op": pl.Utf8,
                                "group_id": pl.Utf8, "seq": pl.Int64, "peer": pl.Int64, "start_ns": pl.Int64,
                                "end_ns": pl.Int64, "size_bytes": pl.Int64}, orient="row").with_columns(
        pl.lit(None, dtype=pl.Utf8).alias("stream"))


LAYOUT = pl.DataFrame({"rank": [0, 1], "stage": [0, 1], "dp_rank": [0, 0]})


def _by(graph, **where):
    ops = graph.ops.with_columns(pl.Series("actual", graph.actual)).with_row_index("i")
    for k, v in where.items():
        ops = ops.filter(pl.col(k) == v)
    return ops


def test_an_async_send_ends_with_its_recv_not_with_the_senders_late_wait():
    # rank 0 posts an isend at 10 ms and waits on it at the step's end (90 ms); rank 1 has the data at 12 ms
    comp = _comp([(0, 0, 0, "forward", 0, 10), (1, 0, 0, "forward", 12, 22)])
    comm = _comm([(0, 0, 0, "send", None, 1, 1, 10, 90), (1, 0, 0, "recv", None, 1, 0, 9, 12)])
    g = generic_graph(JobFrames.from_frames("j", compute_op=comp, comm_op=comm), LAYOUT)
    send = _by(g, optype="forward-send")
    recv = _by(g, optype="forward-recv")
    # the transfer, not the 80 ms wait (epoch nanoseconds as floats: within a microsecond)
    assert abs(send["actual"][0] - 2 * MS) < 1e3 and abs(recv["actual"][0] - 2 * MS) < 1e3
    assert abs(float(g.step_times(g.actual)[0]) - 22 * MS) < 1e3  # the replay reproduces the step


def test_a_collective_inside_a_compute_span_is_not_compute():
    # TP pair: rank 0's forward (0-40 ms) waits 25 ms inside a TP all-reduce for rank 1, which starts late
    comp = _comp([(0, 0, 0, "forward", 0, 40), (1, 0, 0, "forward", 25, 45)])
    comm = _comm([(0, 0, None, "all_reduce", "tp", 1, None, 5, 31), (1, 0, None, "all_reduce", "tp", 1, None, 30, 31)])
    layout = pl.DataFrame({"rank": [0, 1], "stage": [0, 0], "dp_rank": [0, 0]})
    g = generic_graph(JobFrames.from_frames("j", compute_op=comp, comm_op=comm), layout)
    fwd = _by(g, optype=FWD).sort("rank")
    assert np.allclose(fwd["actual"].to_numpy(), [14 * MS, 19 * MS], atol=1e3)  # own work: 40 - 26, 20 - 1
    assert g.notes["compute_spans_enclosing_comm"] == 2
    # replayed from 0: the all-reduce (1 ms transfer) first, then each forward's own work; rank 1's 19 ms ends it
    assert abs(float(g.step_times(g.actual)[0]) - 20 * MS) < 1e3


def test_leading_start_up_steps_that_stand_out_are_left_out_of_the_what_if():
    steps = pl.DataFrame({"step": [0, 1, 2, 3], "duration_ns": [900, 420, 400, 410],
                          "warmup": [True, True, False, False]})
    assert sorted(startup_steps(steps)) == [0]  # step 1 is flagged warm-up but does not stand out (1.04x)
    steady = steps.with_columns(pl.Series("duration_ns", [410, 400, 400, 410]))
    assert startup_steps(steady) == {}  # a first step at the job's pace stays (a trace of steady steps)


def _passes(heavy: dict, jitter: dict, back_to_back: set, steps: int = 6, m: int = 4) -> pl.DataFrame:
    rows = []
    for r in range(4):
        for s in range(steps):
            t = 0.0
            order = ([(mb, FWD) for mb in range(m)] + [(mb, BWD) for mb in range(m)] if r not in back_to_back
                     else [(mb, o) for mb in range(m) for o in (FWD, BWD)])
            for mb, o in order:
                f = 3.0 if heavy.get((r, s)) == mb else 1.0
                a = (1 if o == FWD else 2) * f * jitter.get((r, s, mb), 1.0)
                rows.append((r, s, mb, o, a, s * 1000.0 + t))
                t += a
    return pl.DataFrame(rows, schema={"rank": pl.Int64, "step": pl.Int64, "microbatch": pl.Int64,
                                      "optype": pl.Utf8, "a": pl.Float64, "start_ns": pl.Float64}, orient="row")


def test_a_descheduling_across_a_back_to_back_forward_and_backward_is_no_sequence_evidence():
    # ranks 2 and 3 run each microbatch's backward right after its forward (1F1B's last stage): one
    # descheduling stretches both passes of the same microbatch
    stretched = {(r, s, (s + r) % 4): 2.0 for r in (2, 3) for s in range(6)}
    res = heaviest_agreement(_passes({}, stretched, back_to_back={2, 3}), 1.2)
    assert res["agree"] == 0 and res["left_out_back_to_back"] == 12 and res["p_value"] == 1.0
    # long sequences on ranks whose passes are apart still count
    heavy = {(r, s): (s + r) % 4 for r in (0, 1) for s in range(6)}
    res = heaviest_agreement(_passes(heavy, stretched, back_to_back={2, 3}), 1.2)
    assert res["agree"] == 12 and res["p_value"] < 1e-3


class _G:
    def __init__(self, rows):
        self.ops = pl.DataFrame(rows, schema={"rank": pl.Int64, "step": pl.Int64, "optype": pl.Utf8,
                                              "comm": pl.Boolean}, orient="row")


def test_a_link_is_slow_in_every_step_noise_is_not():
    rng = np.random.default_rng(0)
    rows, actual = [], []
    for s in range(4):
        for r in range(4):
            for _ in range(5):
                rows.append((r, s, "all_reduce:tp", True))
                # noise: some rank's transfers 3x in one step or another; rank 3 in step 1 and 2 only
                noisy = 3.0 if (r == 3 and s in (1, 2)) or rng.random() < 0.05 else 1.0
                actual.append(noisy)
    g = _G(rows)
    ideal = np.ones(len(actual))
    assert persistent_links(g, np.array(actual), ideal, 1.5) == []
    slow = np.array([a * (2.5 if row[0] == 1 else 1.0) for a, row in zip(actual, rows, strict=True)])
    found = persistent_links(g, slow, ideal, 1.5)
    assert [x["rank"] for x in found] == [1] and found[0]["factor"] >= 1.5 and found[0]["steps"] == [0, 1, 2, 3]


def test_a_cause_without_its_evidence_is_set_aside_with_why():
    cfg = StragglerConfig()
    shares = {"worker": 0.1, "communication": 0.8, "sequence_imbalance": 0.0, "stage_imbalance": 0.55}
    v, aside = evidenced_verdict(1.2, shares, cfg, {"communication": "no slow link"})
    assert v == "stage_imbalance" and "no slow link" in aside["communication"]
    v, aside = evidenced_verdict(1.2, shares, cfg, {"communication": "no link", "stage_imbalance": "no stage"})
    assert v == "mixed" and set(aside) == {"communication", "stage_imbalance"}
    assert evidenced_verdict(1.2, shares, cfg, {}) == ("communication", {})
    assert evidenced_verdict(1.01, shares, cfg, {"communication": "x"}) == ("none", {})


def _pipelines(heavy: dict, stretch: dict, steps: int = 5, m: int = 4) -> pl.DataFrame:
    """DP 2 x PP 2 under 1F1B (the truth matrix's seq-skew job): stage 0 runs F0 F1 B0 F2 B1 F3 B2 B3,
    stage 1 each microbatch's backward right after its forward. heavy: (dp_rank, step) -> the long
    microbatch (4x work on every stage, both passes); stretch: (rank, step, mb, pass) -> extra factor."""
    first = [(0, FWD), (1, FWD), (0, BWD), (2, FWD), (1, BWD), (3, FWD), (2, BWD), (3, BWD)]
    last = [(mb, o) for mb in range(m) for o in (FWD, BWD)]
    rows = []
    for rank in range(4):
        dp, stage = rank % 2, rank // 2
        for s in range(steps):
            t = 0.0
            for mb, o in first if stage == 0 else last:
                a = (1 if o == FWD else 2) * (4.0 if heavy.get((dp, s)) == mb else 1.0)
                a *= stretch.get((rank, s, mb, o), 1.0)
                rows.append((rank, dp, stage, s, mb, o, a, s * 1000.0 + t))
                t += a
    return pl.DataFrame(rows, schema={"rank": pl.Int64, "dp_rank": pl.Int64, "stage": pl.Int64, "step": pl.Int64,
                                      "microbatch": pl.Int64, "optype": pl.Utf8, "a": pl.Float64,
                                      "start_ns": pl.Float64}, orient="row")


def test_a_long_microbatch_is_the_heaviest_on_every_stage_of_its_pipeline():
    # one long microbatch per step, its DP rank and position moving (train_dp_pp.py --seq-skew), five
    # steps, and a descheduled pass on some rank in every step: within a rank, forward/backward
    # agreement has only five chances (the last stage's passes run back to back), and a 1-in-4 chance
    # five times over is ~1e-3; pairing each stage's passes with the next stage's doubles the chances,
    # and two processes are not descheduled together
    heavy = {(s % 2, s): (3 * s + 1) % 4 for s in range(5)}
    stretch = {(s % 4, s, (s + 2) % 4, FWD if s % 3 else BWD): 1.6 for s in range(5)}
    res = heaviest_agreement(_pipelines(heavy, stretch), 1.2)
    assert res["agree"] == 10 and res["p_value"] < 1e-4, res
    # the same descheduled passes without long microbatches agree nowhere
    clean = heaviest_agreement(_pipelines({}, stretch), 1.2)
    assert clean["agree"] == 0 and clean["p_value"] == 1.0, clean


def test_a_microbatch_index_that_is_always_heavy_is_position_not_length():
    # every step's first microbatch runs long on every rank (warming up after the optimizer): it is
    # heaviest everywhere, so agreeing on it is what chance gives, not evidence of long sequences
    heavy = {(dp, s): 0 for dp in range(2) for s in range(5)}
    res = heaviest_agreement(_pipelines(heavy, {}), 1.2)
    assert res["agree"] == res["pairs"] == 20 and res["chance"] == 1.0 and res["p_value"] == 1.0, res
