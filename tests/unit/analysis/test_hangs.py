import jsonschema
import polars as pl

from rankscope.analysis.hangs import stuck_collectives
from rankscope.analysis.report.codec import to_json
from rankscope.collectors.job_frames import JobFrames
from rankscope.collectors.schema import polars_schema


def _comm(rows):
    base = {"job": "j", "group_id": "1", "peer": None, "size_bytes": 4096, "dtype": "float32",
            "state": "completed", "source": "hook"}
    full = []
    for i, r in enumerate(rows):
        row = {**base, **r}
        row.setdefault("start_ns", 1000 * (i + 1))
        row.setdefault("end_ns", None if row["state"] == "pending" else row["start_ns"] + 10)
        full.append(row)
    df = pl.DataFrame(full)
    sch = polars_schema("comm_op")
    return df.with_columns([pl.col(c).cast(sch[c]) for c in df.columns])


def _ar(rank, seq, step, ranks=(0, 1), **kw):
    return {"rank": rank, "op": "all_reduce", "group_ranks": list(ranks), "seq": seq, "step": step, **kw}


def test_skipped_collective_names_missing_rank_group_and_seq(report_schema):
    # Rank 1 skipped its all_reduce in step 1, so its later calls run one seq behind: rank 0 waits at seq 5.
    rows = [_ar(0, s, st) for s, st in enumerate((0, 0, 1, 1, 2))]
    rows += [_ar(1, s, st) for s, st in enumerate((0, 0, 1, 2, 2))]
    rows.append(_ar(0, 5, 2, state="pending", start_ns=99_000))
    hangs = stuck_collectives(JobFrames.from_frames("j", comm_op=_comm(rows)))
    assert len(hangs) == 1
    h = hangs[0]
    assert (h.group_ranks, h.seq, h.missing, h.pending_ranks) == ([0, 1], 5, [1], [0])
    assert h.first and h.op == "all_reduce" and h.group == "1"
    assert h.first_divergent_seq == 3
    assert h.last_seq == {"0": 5, "1": 4}
    assert h.last_completed["1"]["seq"] == 4 and h.last_completed["0"]["seq"] == 4
    jsonschema.validate([to_json(h) for h in hangs], report_schema["properties"]["hangs"])


def test_mismatched_size_and_first_stuck_ordering():
    g = (0, 1, 2)
    rows = [_ar(r, 0, 0, g) for r in g]
    rows += [_ar(0, 1, 0, g, state="pending", start_ns=50_000), _ar(1, 1, 0, g, state="pending", start_ns=50_010),
             _ar(2, 1, 0, g, state="pending", start_ns=50_020, size_bytes=2048)]
    # A later stuck op in another group must come second.
    rows += [_ar(3, 0, 0, (3, 4), state="pending", start_ns=70_000)]
    hangs = stuck_collectives(JobFrames.from_frames("j", comm_op=_comm(rows)))
    assert [h.group_ranks for h in hangs] == [[0, 1, 2], [3, 4]]
    assert hangs[0].first and not hangs[1].first
    assert hangs[0].missing == [] and hangs[0].mismatched[0]["rank"] == 2
    assert hangs[0].mismatched[0]["differs_in"] == ["size_bytes"]
    assert hangs[1].missing == [4]


def test_sources_are_analysed_apart_and_p2p():
    rows = [_ar(0, 1, 0, source="flight_recorder", state="pending", start_ns=0),
            _ar(1, 0, 0, source="flight_recorder", start_ns=0),
            {"rank": 2, "op": "send", "peer": 3, "group_ranks": [2, 3], "seq": 0, "step": 0, "state": "pending"}]
    hangs = stuck_collectives(JobFrames.from_frames("j", comm_op=_comm(rows)))
    by_src = {h.source: h for h in hangs}
    assert by_src["flight_recorder"].missing == [1] and by_src["flight_recorder"].seq == 1
    assert by_src["hook"].group_key == "p2p 2->3" and by_src["hook"].missing == [3]
    assert hangs[0].source == "hook"


def test_no_pending_no_hang():
    rows = [_ar(r, s, 0) for r in (0, 1) for s in range(3)]
    assert stuck_collectives(JobFrames.from_frames("j", comm_op=_comm(rows))) == []
    assert stuck_collectives(JobFrames.from_frames("j")) == []


def test_failed_op_counts_as_stuck_and_lagging_members_found():
    # The hook's pending row was later closed as failed (timeout); the flight recorder marks all done.
    rows = [_ar(0, 0, 0), _ar(1, 0, 0), _ar(0, 1, 1, state="failed", end_ns=9_000_000, start_ns=5_000)]
    rows += [_ar(r, s, 0, source="flight_recorder", group_ranks=None) for r, n in ((0, 3), (1, 2))
             for s in range(1, n + 1)]
    hangs = stuck_collectives(JobFrames.from_frames("j", comm_op=_comm(rows)))
    by_src = {h.source: h for h in hangs}
    assert (by_src["hook"].seq, by_src["hook"].missing, by_src["hook"].evidence) == (1, [1], "pending")
    fr = by_src["flight_recorder"]
    assert (fr.seq, fr.missing, fr.group_ranks, fr.evidence) == (3, [1], [0, 1], "lagging")


def test_root_cause_comes_before_earlier_started_consequences():
    # Rank 1 never joins the step-0 all_reduce of [0, 1]; rank 2 (next stage) already waits, from an earlier
    # time, on rank 0's step-1 send, and rank 3 on rank 1's. Only the all_reduce is a root cause of rank 0's wait.
    rows = [_ar(0, 0, 0, state="pending", start_ns=50_000),
            {"rank": 2, "op": "recv", "peer": 0, "group_ranks": [0, 2], "seq": 3, "step": 1, "state": "pending",
             "start_ns": 40_000},
            {"rank": 0, "op": "send", "peer": 2, "group_ranks": [0, 2], "seq": 2, "step": 0},
            {"rank": 3, "op": "recv", "peer": 1, "group_ranks": [1, 3], "seq": 3, "step": 1, "state": "pending",
             "start_ns": 45_000},
            # rank 1's dump exists (it stopped, its trace is not absent): its last send completed.
            {"rank": 1, "op": "send", "peer": 3, "group_ranks": [1, 3], "seq": 2, "step": 0}]
    hangs = stuck_collectives(JobFrames.from_frames("j", comm_op=_comm(rows)))
    assert hangs[0].op == "all_reduce" and hangs[0].first and hangs[0].missing == [1]
    by_key = {h.group_key: h for h in hangs}
    assert not by_key["p2p 0->2"].root_cause and by_key["p2p 1->3"].root_cause


def test_member_without_any_input_is_missing_input_not_a_hang():
    # 1 of 2 ranks supplied (HTA sample): rank 1 has no record at all, so nothing says it stopped.
    rows = [_ar(0, s, 0) for s in range(1, 4)]
    hangs = stuck_collectives(JobFrames.from_frames("j", comm_op=_comm(rows)))
    assert hangs == []


def test_member_with_records_elsewhere_still_lags():
    # Rank 1 has records (in another group) but never joined this one: that is evidence.
    rows = [_ar(0, s, 0) for s in range(1, 4)] + [_ar(1, 0, 0, ranks=(1, 2)), _ar(2, 0, 0, ranks=(1, 2))]
    hangs = stuck_collectives(JobFrames.from_frames("j", comm_op=_comm(rows)))
    assert [(h.group_ranks, h.missing, h.missing_input) for h in hangs] == [([0, 1], [1], [])]


def test_pending_op_with_absent_member_keeps_the_hang_but_names_missing_input():
    rows = [_ar(0, 0, 0), _ar(0, 1, 0, state="pending", start_ns=50_000)]
    hangs = stuck_collectives(JobFrames.from_frames("j", comm_op=_comm(rows)))
    assert len(hangs) == 1 and hangs[0].missing_input == [1] and not hangs[0].root_cause


def test_dump_of_unfinished_calls_only_names_the_rank_behind_where_others_wait_first():
    # Active entries only (NVRx): ranks 1 and 2 completed seq 5 (not dumped) and wait at 6 and 7 of group
    # [0,1,2]; rank 0 never enqueued 6 and waits first in another group [0,3], which rank 3 joined. Rank 0
    # is missing at 6 (where 1 and 2 wait first), nobody is missing at 5 or at rank 0's own wait.
    g = (0, 1, 2)
    rows = [_ar(0, 5, None, g, state="pending", start_ns=10), _ar(0, 40, None, (0, 3), state="pending", start_ns=5),
            _ar(3, 40, None, (0, 3), state="pending", start_ns=6)]
    rows += [_ar(r, s, None, g, state="pending", start_ns=100 + s) for r in (1, 2) for s in (6, 7)]
    frames = JobFrames.from_frames("j", comm_op=_comm(rows))
    hangs = {(h.group_key, h.seq): h for h in stuck_collectives(frames)}
    at6 = hangs[("ranks 0,1,2", 6)]
    assert at6.missing == [0] and at6.waiting == [1, 2] and at6.root_cause and at6.first
    assert hangs[("ranks 0,1,2", 5)].missing == [] and hangs[("ranks 0,1,2", 5)].passed == [1, 2]
    assert not hangs[("ranks 0,1,2", 7)].root_cause  # queued behind 6: nobody waits there first
    assert hangs[("ranks 0,3", 40)].waiting == [0, 3] and not hangs[("ranks 0,3", 40)].root_cause


def test_rank_with_an_empty_dump_is_input_not_absent():
    # rank 1's dump had no unfinished call: it is behind (others wait), not missing input
    rows = [_ar(0, 3, None, state="pending", start_ns=10)]
    frames = JobFrames.from_frames("j", comm_op=_comm(rows))
    assert stuck_collectives(frames)[0].missing_input == [1]
    frames.source_ranks = [0, 1]
    h = stuck_collectives(frames)[0]
    assert h.missing == [1] and h.missing_input == [] and h.root_cause


def test_p2p_ends_numbered_apart_name_nobody_missing():
    # the flight recorder's p2p_seq_id counts every send/recv of a rank in its group: rank 0's send and
    # rank 1's recv of one transfer wait at 700 and 420. Seqs cannot say who never arrived.
    rows = [{"rank": 0, "op": "send", "peer": 1, "group_ranks": [0, 1], "seq": 700, "step": None,
             "state": "pending", "source": "flight_recorder"},
            {"rank": 1, "op": "recv", "peer": 0, "group_ranks": [0, 1], "seq": 420, "step": None,
             "state": "pending", "source": "flight_recorder"}]
    hangs = stuck_collectives(JobFrames.from_frames("j", comm_op=_comm(rows)))
    assert hangs and all(h.missing == [] and not h.root_cause for h in hangs)


def test_rank_dumped_twice_with_every_op_done_reports_the_lagging_hang_once():
    # The gloo flight recorder marks every op done; rank 0 was dumped by two writers (each of its rows twice,
    # the copies with a different size so a count over them would tip the majority). The duplicates are
    # left for a stuck point to remove: the hang must be the one the rows without them give.
    rows = [_ar(r, s, 0, source="flight_recorder", group_ranks=None) for r, n in ((0, 3), (1, 2))
            for s in range(1, n + 1)]
    twice = rows + [{**_ar(0, s, 0, source="flight_recorder", group_ranks=None), "size_bytes": 8}
                    for s in range(1, 4)]
    once = stuck_collectives(JobFrames.from_frames("j", comm_op=_comm(rows)))
    dumped_twice = stuck_collectives(JobFrames.from_frames("j", comm_op=_comm(twice)))
    assert [(h.seq, h.missing, h.evidence) for h in once] == [(3, [1], "lagging")]
    assert dumped_twice == once
