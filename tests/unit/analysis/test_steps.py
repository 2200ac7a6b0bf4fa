"""The one step definition: per-rank period on one clock, own span on relative time, warm-up left out."""

import polars as pl

from rankscope.analysis.model.steps import job_steps, rank_step_windows, steps_section

MS = 1_000_000


def _windows(rows):
    return pl.DataFrame(rows, schema=["rank", "step", "start_ns", "end_ns"], orient="row")


def test_relative_time_steps_use_their_own_span():
    # every step starts at 0 (OSDI'25 traces): start-to-start would be 0
    rows = [(r, s, r * 5 * MS, (100 + 10 * s) * MS - r * MS) for s in range(4) for r in range(2)]
    t = job_steps(_windows(rows), relative_time=True)
    assert t["basis"].unique().to_list() == ["span"]
    assert t["duration_ns"].to_list() == [(100 + 10 * s) * MS for s in range(4)]
    sec = steps_section(t, "step column")
    assert sec.median_ns == 120 * MS  # steps 1..3 (step 0 is warm-up)
    # even unflagged, starts that do not increase are not one clock
    assert job_steps(_windows(rows))["basis"].unique().to_list() == ["span"]


def test_first_step_is_warmup_and_left_out_of_the_median():
    # --steps 2 on a real job: a 3 s start-up step and one real 0.9 s step
    rows = [(r, 0, 0, 3000 * MS) for r in range(2)] + [(r, 1, 3000 * MS, 3900 * MS) for r in range(2)]
    sec = steps_section(job_steps(_windows(rows)), "step_mark")
    assert sec.count == 2 and sec.median_ns == 900 * MS
    assert [w.step for w in sec.warmup] == [0] and "first step" in sec.warmup[0].why
    assert sec.table.num_in_median == 1


def test_leading_slow_steps_are_warmup_later_slow_steps_are_not():
    durs = [5000, 2500, 1000, 1000, 1000, 3000, 1000]
    starts = [sum(durs[:i]) for i in range(len(durs))]
    rows = [(0, i, starts[i] * MS, (starts[i] + d) * MS) for i, d in enumerate(durs)]
    t = job_steps(_windows(rows))
    assert t["warmup"].to_list() == [True, True, False, False, False, False, False]
    assert steps_section(t, "x").median_ns == 1000 * MS


def test_single_step_is_kept():
    t = job_steps(_windows([(0, 3, 0, 10 * MS)]))
    assert t["warmup"].to_list() == [False] and steps_section(t, "x").median_ns == 10 * MS


def test_pipeline_stages_offset_by_a_fixed_lag_give_the_per_rank_period():
    # stage 1 runs 150 ms ahead of stage 0 from step 1 on; each rank's own step is 850 ms
    rows = []
    for s in range(5):
        rows.append((0, s, s * 850 * MS, (s + 1) * 850 * MS))
        lead = 0 if s == 0 else 150
        rows.append((1, s, (s * 850 - lead) * MS, ((s + 1) * 850 - 150) * MS))
    t = job_steps(_windows(rows))
    assert t["basis"].unique().to_list() == ["rank_period"]
    assert steps_section(t, "x").median_ns == 850 * MS
    # job-wide spans mix the lag in
    assert t["span_ns"][2] == 1000 * MS


def test_windows_stretch_to_the_next_start_only_when_it_lies_ahead():
    ops = pl.DataFrame({"rank": [0, 0, 0], "step": [0, 1, 2], "start_ns": [0, 100, 200], "end_ns": [50, 150, 230]})
    w = rank_step_windows(pl.DataFrame(), ops, ops.head(0))
    assert w["end_ns"].to_list() == [100, 200, 230]
    rel = ops.with_columns(start_ns=pl.lit(0))
    assert rank_step_windows(pl.DataFrame(), rel, rel.head(0))["end_ns"].to_list() == [50, 150, 230]
