"""Ranks per address from connection counts (synthetic flow tables with known placement)."""

import polars as pl
import pytest

from rankscope.analysis.strategy.flows.ranks_per_address import (
    RanksPerAddress,
    RanksPerAddressConfig,
    degrees_with_hidden_ranks,
    ranks_per_address,
)
from rankscope.collectors.errors import ConfigError

A, B, C, D = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"
PAIRS = [(A, B), (C, D), (A, C), (B, D)]  # a 2 x 2 address grid


def rows(conns, protocol=6):
    """conns: (src, sport, dst, dport, bytes); each gives both directions (data one way, ACKs back)."""
    out = []
    for s, sp, d, dp, b in conns:
        out.append(dict(src_addr=s, src_port=sp, dst_addr=d, dst_port=dp, protocol=protocol, size_bytes=b))
        out.append(dict(src_addr=d, src_port=dp, dst_addr=s, dst_port=sp, protocol=protocol, size_bytes=b // 30))
    return pl.DataFrame(out, schema_overrides={"src_port": pl.Int32, "dst_port": pl.Int32, "protocol": pl.Int32})


def grid_conns(ranks_per_addr, data=50_000_000, setup=300):
    """Every rank at one address talks to its same-position peer at each neighbour; all rank pairs
    also hold a tiny full-mesh connection (barriers), as gloo's default group does."""
    conns = []
    for i, (x, y) in enumerate(PAIRS):
        for r in range(ranks_per_addr):
            conns.append((x, 40000 + 100 * i + r, y, 50000 + 100 * i + r, data * (1 + 0.02 * r)))
            for q in range(ranks_per_addr):
                conns.append((x, 41000 + 100 * i + 10 * r + q, y, 51000 + 100 * i + 10 * r + q, setup))
    return conns


@pytest.mark.parametrize("k", [1, 2, 4])
def test_ranks_per_address_is_the_data_connections_per_pair(k):
    rpa = ranks_per_address(rows(grid_conns(k)), PAIRS)
    assert (rpa.ranks, rpa.hidden_factor, rpa.basis) == (k, k, "tcp_connections")
    assert set(rpa.pair_counts.values()) == {k}
    world, tp, _ = degrees_with_hidden_ranks(4, 2, 2, rpa)
    assert (world, tp) == (4 * k, k)


def test_pairs_that_disagree_give_none():
    conns = [c for c in grid_conns(2) if not (c[0] == A and c[2] == B and c[1] % 10 == 1 and c[4] > 1000)]
    rpa = ranks_per_address(rows(conns), PAIRS)
    assert rpa.ranks is None and "disagree" in rpa.why
    assert rpa.pair_counts[f"{A}|{B}"] == 1 and rpa.pair_counts[f"{C}|{D}"] == 2


def test_several_sockets_to_one_listening_port_are_not_ranks():
    # one rank pair, four sockets (NCCL socket transport style): one port at the listening end
    conns = [(A, 40000 + s, B, 29999, 10_000_000) for s in range(4)]
    rpa = ranks_per_address(rows(conns), [(A, B)])
    assert rpa.ranks is None and rpa.hidden_factor is None
    assert "share ports" in rpa.why


def test_no_clear_gap_between_data_and_other_connections_gives_none():
    conns = [(A, 40000, B, 50000, 10_000_000), (A, 40001, B, 50001, 10_000_000), (A, 40002, B, 50002, 2_000_000)]
    rpa = ranks_per_address(rows(conns), [(A, B)])
    assert rpa.ranks is None and "no clear split" in rpa.why


def test_udp_source_ports_count_queue_pairs_one_is_one_rank():
    conns = [(x, 49152 + i, y, 4791, 10_000_000) for i, (x, y) in enumerate(PAIRS)]
    rpa = ranks_per_address(rows(conns, protocol=17), PAIRS)
    assert (rpa.ranks, rpa.basis) == (1, "roce_source_ports")
    world, tp, note = degrees_with_hidden_ranks(8, 2, 2, rpa)
    assert (world, tp) == (8, 2)


def test_no_ports_at_all_gives_tp_null_not_the_address_reading():
    conns = [(x, 49152 + i, y, 4791, 10_000_000) for i, (x, y) in enumerate(PAIRS)]
    f = rows(conns, protocol=17).with_columns(src_port=pl.lit(None, pl.Int32), dst_port=pl.lit(None, pl.Int32))
    rpa = ranks_per_address(f, PAIRS)
    assert (rpa.ranks, rpa.basis) == (None, "none")
    world, tp, note = degrees_with_hidden_ranks(8, 2, 2, rpa)
    assert (world, tp) == (8, None) and "unknown" in note


def roce(qps_per_pair):
    out = []
    for x, y in PAIRS:
        for s, d in ((x, y), (y, x)):
            for q in range(qps_per_pair):
                out.append(dict(src_addr=s, dst_addr=d, src_port=49152 + q, dst_port=4791, protocol=17,
                                size_bytes=5_000_000, dst_qp=hash((s, d, q)) % 2**24))
    return pl.DataFrame(out, schema_overrides={"src_port": pl.Int32, "dst_port": pl.Int32, "protocol": pl.Int32})


def test_roce_one_queue_pair_per_pair_is_one_rank():
    rpa = ranks_per_address(roce(1), PAIRS)
    assert (rpa.ranks, rpa.basis) == (1, "roce_dst_qp")


def test_roce_several_queue_pairs_is_a_hidden_factor_and_tp_is_null_not_one():
    rpa = ranks_per_address(roce(2), PAIRS)
    assert (rpa.ranks, rpa.hidden_factor) == (None, 2)
    world, tp, _ = degrees_with_hidden_ranks(4, 2, 2, rpa)
    assert tp is None


def test_sampled_bytes_are_used_when_present():
    f = rows(grid_conns(2)).with_columns(est_bytes=pl.col("size_bytes") * 100.0)
    assert ranks_per_address(f, PAIRS).ranks == 2


def test_empty_inputs_and_bad_config():
    assert ranks_per_address(pl.DataFrame(), PAIRS).ranks is None
    assert ranks_per_address(rows(grid_conns(1)), []).ranks is None
    with pytest.raises(ConfigError, match="equal_share_ratio"):
        RanksPerAddressConfig(equal_share_ratio=1.0)
    with pytest.raises(ConfigError, match="setup_gap_ratio"):
        RanksPerAddressConfig(setup_gap_ratio=0.5)
    assert isinstance(ranks_per_address(rows(grid_conns(1)), PAIRS), RanksPerAddress)


def test_infer_flows_reports_tp_from_ranks_per_address():
    from rankscope.analysis.strategy.flows.infer import infer_flows

    # A,B hold stage 0 and C,D stage 1 (DP pairs A-B, C-D carry gradients; PP pairs A-C, B-D activations);
    # two ranks per address, each with its own connection to its peer; TCP, millisecond clock
    t0, ms = 1_764_000_000_000_000_000, 1_000_000
    out = []
    for i, (x, y) in enumerate(PAIRS):
        size = 40_000_000 if i < 2 else 2_000_000
        for r in range(2):
            for step in range(5):
                for s, sp, d, dp_ in ((x, 40000 + 10 * i + r, y, 50000 + 10 * i + r),
                                      (y, 50000 + 10 * i + r, x, 40000 + 10 * i + r)):
                    out.append(dict(exporter="sw/0", src_addr=s, dst_addr=d, src_port=sp, dst_port=dp_, protocol=6,
                                    size_bytes=size, num_packets=size // 1448, sampling_rate=1,
                                    start_ns=t0 + step * 500 * ms, end_ns=t0 + (step * 500 + 200) * ms))
    f = pl.DataFrame(out, schema_overrides={"src_port": pl.Int32, "dst_port": pl.Int32, "protocol": pl.Int32})
    s = infer_flows(f).strategy
    assert (s.dp, s.pp, s.tp, s.world_size) == (2, 2, 2, 8)
    assert s.flows.ranks_per_address["ranks"] == 2
    assert sorted(map(sorted, s.dp_groups)) == [[A, B], [C, D]]
    # no lag and two-way links: the DP/PP swap explains the traffic as well, and the report says so
    assert s.flows.ambiguous and s.confidence <= 0.5


def test_roce_odd_queue_pair_count_is_one_rank_even_count_lists_candidates():
    rpa = ranks_per_address(roce(3), PAIRS)
    assert (rpa.ranks, rpa.hidden_factor) == (1, 3)
    rpa = ranks_per_address(roce(4), PAIRS)
    assert (rpa.ranks, rpa.candidates) == (None, [1, 2, 4])
    _, tp, note = degrees_with_hidden_ranks(8, 2, 2, rpa)
    assert tp is None and "[2, 4, 8]" in note


def test_roce_count_needs_enough_sampled_packets():
    thin = roce(1).with_columns(num_packets=pl.lit(5, pl.Int64))
    assert ranks_per_address(thin, PAIRS).ranks is None
    assert ranks_per_address(roce(1).with_columns(num_packets=pl.lit(500, pl.Int64)), PAIRS).ranks == 1


def test_a_stray_tcp_connection_does_not_outvote_the_roce_transport():
    stray = rows([(A, 41000, B, 50000, 3_000)])
    f = pl.concat([roce(1), stray], how="diagonal_relaxed")
    assert ranks_per_address(f, PAIRS).basis == "roce_dst_qp"
