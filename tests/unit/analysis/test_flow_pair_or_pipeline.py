"""Two endpoints joined by one TCP link: a data-parallel pair or a two-stage pipeline? And the stage
order of a pipeline from its stages' gradient reductions.

Over TCP both directions of a link share one 5-tuple and each opens with the other's ACKs, so the lag
between the directions' first payload says nothing, and how much of each step the link is busy says
nothing either (pipeline sends are short bursts apart by each micro-batch's compute; real gloo pipeline
links were busy 13-48 % of their burst period, DP links 3-42 %): a lone pair is a tie, reported so.
"""

import polars as pl
import pytest

from rankscope.analysis.strategy.flows.infer import infer_flows

MS = 1_000_000
T0 = 1_764_000_000_000 * MS


def tcp_link(bursts: list[tuple[int, int]], bytes_per_burst: float = 4e8) -> pl.DataFrame:
    """One TCP connection between two hosts, one record per direction per burst (both directions
    open and close together, as ACKs ride on the reverse direction), millisecond timestamps (times
    in ms from ``T0``; not all multiples of 10 ms, or the clock would read as a 10 ms one)."""
    rows = []
    for s, e in bursts:
        for src, dst, sp, dp in (("10.0.0.1", "10.0.0.2", 20001, 41234), ("10.0.0.2", "10.0.0.1", 41234, 20001)):
            packets = int(bytes_per_burst / 1000)
            rows.append({"exporter": "leaf0", "src_addr": src, "dst_addr": dst, "src_port": sp, "dst_port": dp,
                         "protocol": 6, "size_bytes": int(bytes_per_burst), "num_packets": packets,
                         "sampling_rate": 1, "start_ns": T0 + s * MS, "end_ns": T0 + e * MS})
    return pl.DataFrame(rows)


@pytest.mark.parametrize("bursts", [
    [(300 * k + 241, 300 * k + 299) for k in range(8)],  # busy the last 60 ms of each 300 ms step
    [(300 * k + 11, 300 * k + 263) for k in range(8)],  # busy 250 ms of each step
], ids=["short-bursts", "long-bursts"])
def test_busy_share_does_not_tell_a_pair_from_a_pipeline(bursts):
    s = infer_flows(tcp_link(bursts)).strategy
    assert s.flows.ambiguous
    alt = s.flows.alternatives
    assert len(alt) == 1 and {(s.dp, s.pp), (alt[0].dp, alt[0].pp)} == {(2, 1), (1, 2)}
    assert s.confidence < 0.5
    # the report claims neither degree: both are null, with the labellings that fit
    open_ = {u.field: u.candidates for u in s.undecided}
    assert open_["dp"] == [1, 2] and open_["pp"] == [1, 2] and len(open_["dp_groups"]) == 2
    claimed = s.claimed()
    assert (claimed.dp, claimed.pp, claimed.dp_groups, claimed.pp_groups) == (None, None, [], [])


def test_no_timing_evidence_is_reported_ambiguous():
    # the exporter keeps one record per direction for the whole capture: nothing tells the two apart
    flows = tcp_link([(3, 2399)])
    s = infer_flows(flows).strategy
    assert s.flows.ambiguous
    alt = s.flows.alternatives
    assert len(alt) == 1 and {(s.dp, s.pp), (alt[0].dp, alt[0].pp)} == {(2, 1), (1, 2)}
    assert s.confidence < 0.5


def _link(a: str, b: str, bursts: list[tuple[int, int]], bytes_per_burst: float, port: int) -> list[dict]:
    rows = []
    for s, e in bursts:
        for src, dst, sp, dp in ((a, b, port, 41234), (b, a, 41234, port)):
            rows.append({"exporter": "leaf0", "src_addr": src, "dst_addr": dst, "src_port": sp, "dst_port": dp,
                         "protocol": 6, "size_bytes": int(bytes_per_burst), "num_packets": int(bytes_per_burst / 1000),
                         "sampling_rate": 1, "start_ns": T0 + s * MS, "end_ns": T0 + e * MS})
    return rows


def _ring(members: list[str], bursts: list[tuple[int, int]], bytes_per_burst: float, port: int) -> list[dict]:
    """A ring all-reduce over TCP: payload one way round the ring, the ACKs back (64-byte packets)."""
    rows = []
    for i, a in enumerate(members):
        b = members[(i + 1) % len(members)]
        for s, e in bursts:
            for src, dst, sp, dp, size in ((a, b, port + i, 41234, bytes_per_burst),
                                           (b, a, 41234, port + i, bytes_per_burst / 1000 * 64)):
                packets = int(bytes_per_burst / 1000)
                rows.append({"exporter": "leaf0", "src_addr": src, "dst_addr": dst, "src_port": sp, "dst_port": dp,
                             "protocol": 6, "size_bytes": int(size), "num_packets": packets,
                             "sampling_rate": 1, "start_ns": T0 + s * MS, "end_ns": T0 + e * MS})
    return rows


def _dp3_pp2(stage1_ring: list[tuple[int, int]]) -> pl.DataFrame:
    """dp3 x pp2 over TCP, addresses numbered against the stage order: stage 0 = .4 .5 .6, stage 1 = .1 .2
    .3; the pipeline links open both ways together (ACKs); stage 0's ring reduces at 237-297 ms of each
    300 ms step, stage 1's ring as given."""
    steps = range(8)
    rows = []
    for up, down in (("10.0.0.4", "10.0.0.1"), ("10.0.0.5", "10.0.0.2"), ("10.0.0.6", "10.0.0.3")):
        rows += _link(up, down, [(300 * k + 11, 300 * k + 200) for k in steps], 5e7, 20001)
    rows += _ring(["10.0.0.4", "10.0.0.5", "10.0.0.6"], [(300 * k + 237, 300 * k + 297) for k in steps], 4e8, 21000)
    rows += _ring(["10.0.0.1", "10.0.0.2", "10.0.0.3"], [(300 * k + s, 300 * k + e) for k in steps
                                                         for s, e in stage1_ring], 4e8, 22000)
    return pl.DataFrame(rows)


def test_two_stage_order_from_when_each_stage_reduces_its_gradients():
    # the last stage finishes its backward first, so its DP all-reduce starts and ends 25 ms before the
    # first stage's, every step (millisecond clocks: closer than 20 ticks would not vote)
    s = infer_flows(_dp3_pp2([(212, 272)])).strategy
    assert (s.dp, s.pp) == (3, 2) and not s.flows.ambiguous
    assert sorted(s.pp_groups) == [["10.0.0.4", "10.0.0.1"], ["10.0.0.5", "10.0.0.2"], ["10.0.0.6", "10.0.0.3"]]
    assert s.flows.stage_order_known and s.confidence >= 0.9


def test_a_slow_ring_ending_late_is_no_stage_order():
    # both stages' reductions start together; the last stage's ring (a slow NIC) ends 40 ms later every step,
    # as a real gloo DP2 x PP2 job's slow stage-1 ring did (1.2-1.5 s later): that is its speed, not its
    # place in the pipeline, and the order is not claimed
    s = infer_flows(_dp3_pp2([(237, 337)])).strategy
    assert (s.dp, s.pp) == (3, 2) and not s.flows.ambiguous
    assert not s.flows.stage_order_known


def test_dp_end_votes_need_ends_clearly_apart():
    from rankscope.analysis.strategy.flows.stage_order import dp_end_votes

    rows = _link("a0", "a1", [(300 * k + 237, 300 * k + 297) for k in range(6)], 4e8, 1) \
        + _link("b0", "b1", [(300 * k + 237, 300 * k + 297) for k in range(6)], 4e8, 2)
    f = pl.DataFrame(rows)
    groups, pipes = [["a0", "a1"], ["b0", "b1"]], [["a0", "b0"], ["a1", "b1"]]
    # both stages end together: no step votes
    assert dp_end_votes(f, groups, pipes, {("a0", "a1"), ("b0", "b1")}, MS) == {}
    a = pl.col("src_addr").str.starts_with("a")
    late = f.with_columns(start_ns=pl.when(a).then(pl.col("start_ns") + 25 * MS).otherwise(pl.col("start_ns")),
                          end_ns=pl.when(a).then(pl.col("end_ns") + 25 * MS).otherwise(pl.col("end_ns")))
    v = dp_end_votes(late, groups, pipes, {("a0", "a1"), ("b0", "b1")}, MS)
    assert v[(0, 1)] == (5, 0) and v[(1, 0)] == (0, 5)  # the last burst may hold the shutdown: not counted
    # ends 25 ms apart, starts together: one reduction took longer, which is no stage order
    longer = f.with_columns(end_ns=pl.when(a).then(pl.col("end_ns") + 25 * MS).otherwise(pl.col("end_ns")))
    assert dp_end_votes(longer, groups, pipes, {("a0", "a1"), ("b0", "b1")}, MS) == {}


def test_dp_end_votes_need_most_steps_to_agree():
    from rankscope.analysis.strategy.flows.stage_order import dp_end_votes

    rows = _link("a0", "a1", [(300 * k + 237, 300 * k + 297) for k in range(6)], 4e8, 1) \
        + _link("b0", "b1", [(300 * k + 237, 300 * k + 297) for k in range(6)], 4e8, 2)
    groups, pipes, pairs = [["a0", "a1"], ["b0", "b1"]], [["a0", "b0"], ["a1", "b1"]], {("a0", "a1"), ("b0", "b1")}

    def shifted(ms_per_step):
        # a's reduction of step k moved by ms_per_step[k], start and end alike (+: a later)
        by_step = (pl.col("start_ns") - T0).floordiv(300 * MS).replace_strict(dict(enumerate(ms_per_step)), default=0)
        a = pl.col("src_addr").str.starts_with("a")
        return pl.DataFrame(rows).with_columns(
            start_ns=pl.when(a).then(pl.col("start_ns") + by_step * MS).otherwise(pl.col("start_ns")),
            end_ns=pl.when(a).then(pl.col("end_ns") + by_step * MS).otherwise(pl.col("end_ns")))

    # a real gloo DP2 x PP2 job: the stages' reductions ended -6, -32, +20, +14, +3 ms apart; the one step
    # past the blur is no stage order
    assert dp_end_votes(shifted((-6, -32, 20, 14, 3, 0)), groups, pipes, pairs, MS) == {}
    # three of five steps clearly one way, one the other: the order stands, with its minority
    assert dp_end_votes(shifted((25, 30, -40, 28, 3, 0)), groups, pipes, pairs, MS) == {(0, 1): (3, 1), (1, 0): (1, 3)}
    # one micro-batch's backward (19-20 ms) apart in every step but the first, a little under the 20-tick
    # floor (a simulated 16 x 2 RoCE job's rails did this): past the clock's blur, unanimous, most steps
    assert dp_end_votes(shifted((1, 20, 19, 20, 20, 0)), groups, pipes, pairs, MS) == {(0, 1): (4, 0), (1, 0): (0, 4)}
    # ... but one step the other way past the blur, and the short gaps are no order
    assert dp_end_votes(shifted((-4, 20, 19, 20, 20, 0)), groups, pipes, pairs, MS) == {}
    # ... nor are two steps of five past it
    assert dp_end_votes(shifted((1, 20, 19, 1, 0, 0)), groups, pipes, pairs, MS) == {}


def roce_link(lag_ns: int, steps: int = 6, period_ms: int = 375, busy_ms: int = 100) -> pl.DataFrame:
    """One RoCE link, nanosecond clock, one record per direction per step, each direction on its own
    queue pair (source port): B -> A's first payload ``lag_ns`` after A -> B's in every step. Times fall
    on no round number of nanoseconds, or the clock would read as a coarse one."""
    rows = []
    for k in range(steps):
        s = T0 + k * period_ms * MS + 123_457 + 7_919 * k * k
        for src, dst, sp, t in (("10.0.0.1", "10.0.0.2", 50001, s), ("10.0.0.2", "10.0.0.1", 50002, s + lag_ns)):
            rows.append({"exporter": "leaf0", "src_addr": src, "dst_addr": dst, "src_port": sp, "dst_port": 4791,
                         "protocol": 17, "size_bytes": 1_600_000_000, "num_packets": 390_000, "sampling_rate": 1,
                         "start_ns": t, "end_ns": t + busy_ms * MS})
    return pl.DataFrame(rows)


def test_a_collectives_directions_a_fraction_of_a_millisecond_apart_are_no_pipeline():
    # each direction's first transfer leaves when its queues let it: a DP pair's two directions start
    # up to a millisecond apart (0.16-0.25 ms read a DP2 x TP4 job as 2-stage pipelines at 0.99)
    s = infer_flows(roce_link(250_000)).strategy
    assert s.flows.ambiguous and s.confidence < 0.5


def test_gradients_a_micro_batch_after_the_activations_read_as_a_pipeline():
    s = infer_flows(roce_link(20 * MS + 3_217, busy_ms=5)).strategy
    assert (s.dp, s.pp) == (1, 2) and not s.flows.ambiguous and s.confidence >= 0.9
    assert s.pp_groups == [["10.0.0.1", "10.0.0.2"]] and s.flows.stage_order_known
