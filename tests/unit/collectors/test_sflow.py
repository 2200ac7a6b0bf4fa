"""sFlow v5: flow samples (Ethernet/VLAN, IPv4/IPv6, TCP/UDP, RoCEv2 BTH) and counter samples."""

from __future__ import annotations

import polars as pl

from rankscope.collectors.flows.flow_decoder import FlowDecoder
from tests.unit.collectors.flow_builders import (
    bth,
    ethernet_ipv4_tcp,
    ethernet_ipv4_udp,
    ethernet_ipv6_tcp,
    sflow_counter_sample,
    sflow_datagram,
    sflow_flow_sample,
    sflow_ipv4_sample,
)

WHEN = 1_700_000_000_123_456_789


def _decode(*datagrams):
    dec = FlowDecoder()
    for d in datagrams:
        dec.feed(d, "203.0.113.5", WHEN)
    return dec.flush(final=True), dec


def test_rocev2_sample_gives_queue_pair_opcode_and_vlan():
    frame = ethernet_ipv4_udp("10.1.0.1", "10.1.0.2", 49152, 4791, bth(0x0A, 0x12345) + b"\0" * 32, vlan=42)
    tables, dec = _decode(sflow_datagram([sflow_flow_sample(frame, frame_length=4158, rate=4096)]))
    row = pl.from_arrow(tables["flow"]).row(0, named=True)
    assert not dec.rejects
    assert (row["src_addr"], row["dst_addr"], row["src_port"], row["dst_port"], row["protocol"]) == \
        ("10.1.0.1", "10.1.0.2", 49152, 4791, 17)
    assert (row["dst_qp"], row["ib_opcode"], row["vlan"]) == (0x12345, 0x0A, 42)
    assert (row["size_bytes"], row["num_packets"], row["sampling_rate"]) == (4158, 1, 4096)
    assert (row["est_size_bytes"], row["est_num_packets"]) == (4158 * 4096, 4096)
    assert row["start_ns"] == row["end_ns"] == WHEN
    assert (row["exporter"], row["source"]) == ("192.0.2.9/1", "sflow")
    assert (row["input_if"], row["output_if"]) == (5, 6)
    assert row["tcp_flags"] is None  # UDP: no TCP flags to carry


def test_ipv6_tcp_sample_and_switch_vlan_record():
    frame = ethernet_ipv6_tcp("2001:db8::1", "2001:db8::2", 40000, 29500)
    tables, _ = _decode(sflow_datagram([sflow_flow_sample(frame, 1514, 1000, switch_vlan=7)]))
    row = pl.from_arrow(tables["flow"]).row(0, named=True)
    assert (row["src_addr"], row["dst_addr"], row["dst_port"], row["protocol"]) == \
        ("2001:db8::1", "2001:db8::2", 29500, 6)
    assert row["dst_qp"] is None and row["vlan"] == 7
    assert row["tcp_flags"] == 0x18  # PSH|ACK, the builder's segment


def test_counter_sample_becomes_interface_counter():
    tables, _ = _decode(sflow_datagram([sflow_counter_sample(17, 100_000_000_000, 10**12, 2 * 10**12)]))
    row = pl.from_arrow(tables["interface_counter"]).row(0, named=True)
    assert (row["if_index"], row["speed_bps"], row["in_octets"], row["out_octets"]) == \
        (17, 100_000_000_000, 10**12, 2 * 10**12)
    assert (row["in_discards"], row["in_errors"], row["out_discards"], row["out_errors"]) == (1, 2, 3, 4)
    assert row["time_ns"] == WHEN and row["exporter"] == "192.0.2.9/1"


def test_mixed_datagram_and_truncation_counted():
    frame = ethernet_ipv4_udp("10.1.0.1", "10.1.0.2", 1, 2, b"x" * 10)
    good = sflow_datagram([sflow_flow_sample(frame, 100, 10), sflow_counter_sample(1, 10, 1, 1)])
    tables, dec = _decode(good, good[:-20])
    assert tables["flow"].num_rows == 2  # the truncated copy still gave its flow sample
    assert tables["interface_counter"].num_rows == 1
    assert dec.rejects["sflow: sample overruns the datagram"] == 1


def test_non_ip_header_counted():
    arp = b"\xff" * 6 + b"\x02\0\0\0\0\1" + b"\x08\x06" + b"\0" * 28
    tables, dec = _decode(sflow_datagram([sflow_flow_sample(arp, 60, 10)]))
    assert "flow" not in tables
    assert dec.rejects["sflow: sampled header is not Ethernet/IP"] == 1


def test_tcp_samples_give_their_segments_flags():
    frames = [ethernet_ipv4_tcp("10.1.0.1", "10.1.0.2", 40000, 29500, flags=0x12),
              ethernet_ipv6_tcp("2001:db8::1", "2001:db8::2", 29500, 40000, flags=0x11),
              ethernet_ipv4_tcp("10.1.0.2", "10.1.0.1", 29500, 40000, flags=0x110)]  # NS|ACK
    tables, dec = _decode(sflow_datagram([sflow_flow_sample(f, 1514, 100) for f in frames]))
    df = pl.from_arrow(tables["flow"])
    assert not dec.rejects
    assert df["tcp_flags"].to_list() == [0x12, 0x11, 0x110]
    assert df["src_port"].to_list() == [40000, 29500, 29500] and df["protocol"].to_list() == [6, 6, 6]


def test_tcp_flags_null_for_udp_and_for_a_header_cut_before_them():
    udp = ethernet_ipv4_udp("10.1.0.1", "10.1.0.2", 1, 2, b"x" * 20)
    cut = ethernet_ipv4_tcp("10.1.0.1", "10.1.0.2", 40000, 29500, flags=0x12)[:14 + 20 + 13]  # up to the flags
    tables, dec = _decode(sflow_datagram([sflow_flow_sample(udp, 100, 10), sflow_flow_sample(cut, 1514, 10)]))
    df = pl.from_arrow(tables["flow"])
    assert not dec.rejects
    assert df["tcp_flags"].to_list() == [None, None]
    assert df["dst_port"].to_list() == [2, 29500]  # the cut header still gives its ports


def test_sampled_ipv4_record_carries_tcp_flags():
    samples = [sflow_ipv4_sample("10.1.0.1", "10.1.0.2", 40000, 29500, 6, 0x11, 1514, 100),
               sflow_ipv4_sample("10.1.0.1", "10.1.0.2", 1, 2, 17, 0x11, 100, 100),  # not TCP: not flags
               sflow_ipv4_sample("10.1.0.1", "10.1.0.2", 40000, 29500, 6, 0xFFFFFFFF, 1514, 100)]
    tables, dec = _decode(sflow_datagram(samples))
    df = pl.from_arrow(tables["flow"])
    assert not dec.rejects
    assert df["tcp_flags"].to_list() == [0x11, None, None]
    assert df["size_bytes"].to_list() == [1514, 100, 1514]
