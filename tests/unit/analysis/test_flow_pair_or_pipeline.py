"""Two endpoints joined by one TCP link: a data-parallel pair or a two-stage pipeline?

Over TCP both directions of a link share one 5-tuple and each opens with the other's ACKs, so the lag
between the directions' first payload says nothing. What tells them apart is the time each step keeps
the link busy: a collective is one burst a step after the backward pass, pipeline sends run through
the forward and backward passes. Without that (records as long as the capture) both labellings fit
and the answer must say so.
"""

import polars as pl

from rankscope.analysis.strategy_flows import infer_flows

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


def test_dp_pair_over_tcp_is_one_burst_a_step():
    # 8 steps of 300 ms, the all-reduce busy the last 60 ms of each
    flows = tcp_link([(300 * k + 241, 300 * k + 299) for k in range(8)])
    s = infer_flows(flows).strategy
    assert (s.dp, s.pp) == (2, 1)
    assert not s.extra["ambiguous"] and s.confidence >= 0.9


def test_two_stage_pipeline_over_tcp_is_busy_through_the_step():
    # activations and gradients run through the forward and backward passes: 250 ms of each 300
    flows = tcp_link([(300 * k + 11, 300 * k + 263) for k in range(8)], bytes_per_burst=5e7)
    s = infer_flows(flows).strategy
    assert (s.dp, s.pp) == (1, 2)
    assert not s.extra["ambiguous"]
    # the order of the two stages is not shown by this link: it is not claimed (address order is no
    # evidence), its own chance is a coin flip, and the confidence is of the pipeline alone
    assert not s.extra["stage_order_known"] and s.extra["stage_order_confidence"] == 0.5
    assert any("direction is not reported" in n for n in s.extra["notes"])
    assert s.extra["confidence_evidence"] == "unique grid, order unknown"


def test_no_timing_evidence_is_reported_ambiguous():
    # the exporter keeps one record per direction for the whole capture: nothing tells the two apart
    flows = tcp_link([(3, 2399)])
    s = infer_flows(flows).strategy
    assert s.extra["ambiguous"]
    alt = s.extra["alternatives"]
    assert len(alt) == 1 and {(s.dp, s.pp), (alt[0]["dp"], alt[0]["pp"])} == {(2, 1), (1, 2)}
    assert s.confidence < 0.5


def _link(a: str, b: str, bursts: list[tuple[int, int]], bytes_per_burst: float, port: int) -> list[dict]:
    rows = []
    for s, e in bursts:
        for src, dst, sp, dp in ((a, b, port, 41234), (b, a, 41234, port)):
            rows.append({"exporter": "leaf0", "src_addr": src, "dst_addr": dst, "src_port": sp, "dst_port": dp,
                         "protocol": 6, "size_bytes": int(bytes_per_burst), "num_packets": int(bytes_per_burst / 1000),
                         "sampling_rate": 1, "start_ns": T0 + s * MS, "end_ns": T0 + e * MS})
    return rows


def test_two_stage_order_from_when_each_stage_finishes_its_gradient_reduction():
    # dp2 x pp2 over TCP, addresses numbered against the stage order: stage 0 = .3 and .4, stage 1 = .1
    # and .2. The pipeline links open both ways together (ACKs); the last stage finishes its backward
    # first, so its DP all-reduce ends 26 ms before the first stage's, every step (millisecond clocks:
    # ends closer than 20 ticks would not vote)
    steps = range(8)
    rows = []
    for up, down in (("10.0.0.3", "10.0.0.1"), ("10.0.0.4", "10.0.0.2")):
        rows += _link(up, down, [(300 * k + 11, 300 * k + 263) for k in steps], 5e7, 20001)
    rows += _link("10.0.0.3", "10.0.0.4", [(300 * k + 237, 300 * k + 297) for k in steps], 4e8, 20002)
    rows += _link("10.0.0.1", "10.0.0.2", [(300 * k + 212, 300 * k + 271) for k in steps], 4e8, 20003)
    s = infer_flows(pl.DataFrame(rows)).strategy
    assert (s.dp, s.pp) == (2, 2)
    assert sorted(s.pp_groups) == [["10.0.0.3", "10.0.0.1"], ["10.0.0.4", "10.0.0.2"]]
    assert s.extra["stage_order_known"] and s.confidence >= 0.9


def test_dp_end_votes_need_ends_clearly_apart():
    from rankscope.analysis.flow_stage_order import dp_end_votes

    rows = _link("a0", "a1", [(300 * k + 237, 300 * k + 297) for k in range(6)], 4e8, 1) \
        + _link("b0", "b1", [(300 * k + 237, 300 * k + 297) for k in range(6)], 4e8, 2)
    f = pl.DataFrame(rows)
    groups, pipes = [["a0", "a1"], ["b0", "b1"]], [["a0", "b0"], ["a1", "b1"]]
    # both stages end together: no step votes
    assert dp_end_votes(f, groups, pipes, {("a0", "a1"), ("b0", "b1")}, MS) == {}
    late = f.with_columns(end_ns=pl.when(pl.col("src_addr").str.starts_with("a"))
                          .then(pl.col("end_ns") + 25 * MS).otherwise(pl.col("end_ns")))
    v = dp_end_votes(late, groups, pipes, {("a0", "a1"), ("b0", "b1")}, MS)
    assert v[(0, 1)] == (5, 0) and v[(1, 0)] == (0, 5)  # the last burst may hold the shutdown: not counted


def test_dp_end_votes_need_most_steps_to_agree():
    from rankscope.analysis.flow_stage_order import dp_end_votes

    rows = _link("a0", "a1", [(300 * k + 237, 300 * k + 297) for k in range(6)], 4e8, 1) \
        + _link("b0", "b1", [(300 * k + 237, 300 * k + 297) for k in range(6)], 4e8, 2)
    groups, pipes, pairs = [["a0", "a1"], ["b0", "b1"]], [["a0", "b0"], ["a1", "b1"]], {("a0", "a1"), ("b0", "b1")}
    # a real gloo DP2 x PP2 job: the stages' reductions ended -6, -32, +20, +14, +3 ms apart (+: a later);
    # the one step past the blur is no stage order
    shift = {300 * k + 297: d for k, d in enumerate((-6, -32, 20, 14, 3, 0))}
    f = pl.DataFrame(rows).with_columns(end_ns=pl.when(pl.col("src_addr").str.starts_with("a"))
                                        .then(pl.col("end_ns") + (pl.col("end_ns") - T0).floordiv(MS)
                                              .replace_strict(shift, default=0) * MS)
                                        .otherwise(pl.col("end_ns")))
    assert dp_end_votes(f, groups, pipes, pairs, MS) == {}
    # three of five steps clearly one way, one the other: the order stands, with its minority
    shift = {300 * k + 297: d for k, d in enumerate((25, 30, -40, 28, 3, 0))}
    f = pl.DataFrame(rows).with_columns(end_ns=pl.when(pl.col("src_addr").str.starts_with("a"))
                                        .then(pl.col("end_ns") + (pl.col("end_ns") - T0).floordiv(MS)
                                              .replace_strict(shift, default=0) * MS)
                                        .otherwise(pl.col("end_ns")))
    assert dp_end_votes(f, groups, pipes, pairs, MS) == {(0, 1): (3, 1), (1, 0): (1, 3)}
