"""IPFIX decoding: golden test on real softflowd bytes (checked against nfdump) and hand-built edge cases."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from rankscope.collectors.flows import flow_files
from rankscope.collectors.flows.flow_decoder import FlowDecoder
from tests.unit.collectors.flow_builders import (
    data_set,
    ipfix_message,
    ntp,
    options_template_set,
    template_set,
    u,
    v4,
    withdrawal_set,
)

FIXTURES = Path(__file__).parent / "fixtures"
BASIC = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]


def _decode(*messages, addr="192.0.2.1") -> tuple[pl.DataFrame, FlowDecoder]:
    dec = FlowDecoder()
    for m in messages:
        dec.feed(m, addr, 0)
    tables = dec.flush(final=True)
    return (pl.from_arrow(tables["flow"]) if "flow" in tables else pl.DataFrame()), dec


def _rec(src="10.0.0.1", dst="10.0.0.2", sport=1000, dport=2000, proto=6, octets=1500, pkts=3,
         start_ms=1_700_000_000_000, end_ms=1_700_000_000_500) -> bytes:
    return (v4(src) + v4(dst) + u(sport, 2) + u(dport, 2) + u(proto, 1) + u(octets, 8) + u(pkts, 8)
            + u(start_ms, 8) + u(end_ms, 8))


def test_softflowd_capture_matches_nfdump_decoding_of_the_same_bytes():
    data = (FIXTURES / "softflowd.ipfix").read_bytes()
    dec = FlowDecoder()
    for msg, _addr, ts in flow_files.ipfix_file_messages(data, dec):
        dec.feed(msg, "127.0.0.1", ts)
    ours = pl.from_arrow(dec.flush(final=True)["flow"])
    assert not dec.rejects
    theirs = flow_files.read_nfdump_json(FIXTURES / "nfdump_softflowd.json",
                                         (FIXTURES / "nfdump_softflowd.json").read_text(), {"tz_offset_s": "0"})
    # softflowd sends tcpControlBits in its TCP/UDP template only; nfdump prints none for ICMP: both null there
    cols = ["src_addr", "dst_addr", "protocol", "size_bytes", "num_packets", "start_ns", "end_ns", "tcp_flags"]
    a = ours.select(cols).sort(cols)
    b = theirs.select(cols).with_columns(pl.col("size_bytes", "num_packets").cast(pl.Int64)).sort(cols)
    assert a.height == 11
    assert a.to_dicts() == b.to_dicts()
    tcp = ours.filter(pl.col("protocol") == 6).sort("size_bytes", descending=True).row(0, named=True)
    assert (tcp["src_addr"], tcp["dst_addr"], tcp["dst_port"]) == ("10.67.0.1", "10.67.0.2", 5001)
    assert tcp["exporter"] == "127.0.0.1/0" and tcp["sampling_rate"] == 1 and tcp["source"] == "ipfix"
    assert tcp["tcp_flags"] == 0x1A  # nfdump: '...AP.S.'


def test_fixed_template_decodes_columns():
    msg = ipfix_message([template_set({256: BASIC}),
                         data_set(256, [_rec(), _rec(src="10.0.0.3", octets=9000, pkts=6)])])
    df, dec = _decode(msg)
    assert df["src_addr"].to_list() == ["10.0.0.1", "10.0.0.3"]
    assert df["size_bytes"].to_list() == [1500, 9000]
    assert df["num_packets"].to_list() == [3, 6]
    assert df["start_ns"][0] == 1_700_000_000_000 * 10**6 and df["end_ns"][0] == 1_700_000_000_500 * 10**6
    assert df["exporter"].unique().to_list() == ["192.0.2.1/7"]
    assert not dec.rejects


@pytest.mark.parametrize("length,wire,flags", [
    (1, 0x12, 0x12),  # SYN|ACK, reduced-size encoding
    (2, 0x0011, 0x11),  # FIN|ACK
    (2, 0x5012, 0x12),  # the data offset in the top 4 bits is ignored (RFC 7125)
    (2, 0x0118, 0x118),  # NS|ACK|PSH: the 16-bit encoding's ninth flag
])
def test_tcp_control_bits_become_tcp_flags(length, wire, flags):
    fields = BASIC + [(6, length)]
    df, dec = _decode(ipfix_message([template_set({256: fields}), data_set(256, [_rec() + u(wire, length)])]))
    assert df["tcp_flags"].to_list() == [flags]
    assert (df["src_port"][0], df["protocol"][0], df["size_bytes"][0]) == (1000, 6, 1500)
    assert not dec.rejects


def test_tcp_flags_are_null_without_tcp_control_bits_in_the_template():
    df, _ = _decode(ipfix_message([template_set({256: BASIC}), data_set(256, [_rec()])]))
    assert df["tcp_flags"].to_list() == [None]


def test_tcp_control_bits_in_a_variable_length_template():
    fields = [(8, 4), (12, 4), (82, 65535), (1, 8), (6, 2), (152, 8)]
    rec = v4("10.0.0.1") + v4("10.0.0.2") + bytes([3]) + b"eth" + u(100, 8) + u(0x5011, 2) + u(1_700_000_000_000, 8)
    df, dec = _decode(ipfix_message([template_set({256: fields}), data_set(256, [rec], pad_to=4)]))
    assert df["tcp_flags"].to_list() == [0x11] and not dec.rejects


def test_templates_are_per_domain_and_refresh_replaces_layout():
    t_a = template_set({256: BASIC})
    t_b = template_set({256: [(12, 4), (8, 4), (1, 4), (2, 4), (150, 4)]})  # same id, other domain/layout
    msgs = [ipfix_message([t_a], domain=1), ipfix_message([t_b], domain=2),
            ipfix_message([data_set(256, [_rec()])], domain=1),
            ipfix_message([data_set(256, [v4("10.9.9.9") + v4("10.8.8.8") + u(77, 4) + u(1, 4) + u(1_700_000_001, 4)])],
                          domain=2)]
    # Refresh in domain 1 with the layout of domain 2: later data uses the new layout.
    msgs += [ipfix_message([t_b], domain=1),
             ipfix_message([data_set(256, [v4("10.7.7.7") + v4("10.6.6.6") + u(55, 4) + u(1, 4) + u(1_700_000_002, 4)])],
                           domain=1)]
    df, dec = _decode(*msgs)
    got = {(r["exporter"], r["src_addr"], r["size_bytes"]) for r in df.iter_rows(named=True)}
    assert got == {("192.0.2.1/1", "10.0.0.1", 1500), ("192.0.2.1/2", "10.8.8.8", 77), ("192.0.2.1/1", "10.6.6.6", 55)}
    row = df.filter(pl.col("size_bytes") == 55).row(0, named=True)
    assert row["start_ns"] == row["end_ns"] == 1_700_000_002 * 10**9  # seconds, start copied to end


def test_withdrawal_makes_later_data_undecodable_and_counted():
    msgs = [ipfix_message([template_set({300: BASIC}), data_set(300, [_rec()])]),
            ipfix_message([withdrawal_set(300)]),
            ipfix_message([data_set(300, [_rec(), _rec()])])]
    df, dec = _decode(*msgs)
    assert df.height == 1
    assert dec.rejects["ipfix: data set for an unknown template"] == 1


def test_withdraw_all_templates_of_a_domain():
    msgs = [ipfix_message([template_set({300: BASIC, 301: BASIC})]), ipfix_message([withdrawal_set(2)]),
            ipfix_message([data_set(300, [_rec()]), data_set(301, [_rec()])])]
    df, dec = _decode(*msgs)
    assert df.is_empty()
    assert dec.rejects["ipfix: data set for an unknown template"] == 2


def test_data_before_template_waits_for_it():
    df, dec = _decode(ipfix_message([data_set(256, [_rec()])]), ipfix_message([template_set({256: BASIC})]))
    assert df["size_bytes"].to_list() == [1500]
    assert not dec.rejects


def test_enterprise_and_unknown_elements_are_skipped_by_length():
    fields = [(8, 4), (12, 4), (1, 8, 9), (100, 6, 32473), (1, 4), (2, 4), (999, 3), (152, 8)]
    rec = v4("10.0.0.1") + v4("10.0.0.2") + u(123456789, 8) + b"\xff" * 6 + u(4242, 4) + u(2, 4) + b"abc" + \
        u(1_700_000_000_000, 8)
    df, dec = _decode(ipfix_message([template_set({256: fields}), data_set(256, [rec])]))
    assert df["size_bytes"].to_list() == [4242]  # the enterprise element numbered 1 is not octetDeltaCount
    assert not dec.rejects


def test_variable_length_fields():
    fields = [(8, 4), (12, 4), (82, 65535), (1, 8), (2, 8), (96, 65535), (152, 8)]
    long_name = b"x" * 300
    recs = [v4("10.0.0.1") + v4("10.0.0.2") + bytes([3]) + b"eth" + u(100, 8) + u(1, 8) + bytes([255]) +
            u(len(long_name), 2) + long_name + u(1_700_000_000_000, 8),
            v4("10.0.0.3") + v4("10.0.0.4") + bytes([0]) + u(200, 8) + u(2, 8) + bytes([0]) + u(1_700_000_000_001, 8)]
    df, dec = _decode(ipfix_message([template_set({256: fields}), data_set(256, recs, pad_to=4)]))
    assert df["size_bytes"].to_list() == [100, 200]
    assert df["dst_addr"].to_list() == ["10.0.0.2", "10.0.0.4"]
    assert not dec.rejects


def test_reduced_size_encoding():
    fields = [(8, 4), (12, 4), (1, 3), (2, 2), (152, 8)]
    rec = v4("10.0.0.1") + v4("10.0.0.2") + u(0x0A0B0C, 3) + u(9, 2) + u(1_700_000_000_000, 8)
    df, _ = _decode(ipfix_message([template_set({256: fields}), data_set(256, [rec])]))
    assert df["size_bytes"].to_list() == [0x0A0B0C]


@pytest.mark.parametrize("start,end,encode", [
    ((150, 4), (151, 4), lambda ns: u(ns // 10**9, 4)),
    ((152, 8), (153, 8), lambda ns: u(ns // 10**6, 8)),
    ((154, 8), (155, 8), ntp),
    ((156, 8), (157, 8), ntp),
])
def test_absolute_time_fields(start, end, encode):
    t0, t1 = 1_700_000_123_000_000_000, 1_700_000_124_000_000_000
    fields = [(8, 4), (12, 4), (1, 4), start, end]
    rec = v4("10.0.0.1") + v4("10.0.0.2") + u(10, 4) + encode(t0) + encode(t1)
    df, _ = _decode(ipfix_message([template_set({256: fields}), data_set(256, [rec])]))
    assert abs(df["start_ns"][0] - t0) <= 1 and abs(df["end_ns"][0] - t1) <= 1


def test_sysuptime_relative_times_need_system_init_time():
    fields = [(8, 4), (12, 4), (1, 4), (22, 4), (21, 4)]
    rec = v4("10.0.0.1") + v4("10.0.0.2") + u(10, 4) + u(5_000, 4) + u(6_500, 4)
    data = ipfix_message([template_set({256: fields}), data_set(256, [rec])])
    df, dec = _decode(data)
    assert df.is_empty()
    assert dec.rejects["sysUpTime-relative time without systemInitTimeMilliseconds"] == 1
    init_ms = 1_699_999_000_000
    opts = ipfix_message([options_template_set(400, [(149, 4)], [(160, 8)]), data_set(400, [u(7, 4) + u(init_ms, 8)])])
    df, dec = _decode(opts, data)
    assert df["start_ns"][0] == (init_ms + 5_000) * 10**6 and df["end_ns"][0] == (init_ms + 6_500) * 10**6


def test_delta_microseconds_are_before_export_time():
    fields = [(8, 4), (12, 4), (1, 4), (158, 4), (159, 4)]
    rec = v4("10.0.0.1") + v4("10.0.0.2") + u(10, 4) + u(2_000_000, 4) + u(500_000, 4)
    df, _ = _decode(ipfix_message([template_set({256: fields}), data_set(256, [rec])], export_s=1_700_000_010))
    assert df["start_ns"][0] == 1_700_000_008 * 10**9 and df["end_ns"][0] == 1_700_000_009_500_000_000


@pytest.mark.parametrize("opt_fields,opt_values,rate", [
    ([(34, 4)], u(1000, 4), 1000),
    ([(50, 4)], u(512, 4), 512),
    ([(305, 4), (306, 4)], u(1, 4) + u(99, 4), 100),
])
def test_sampling_from_options_data(opt_fields, opt_values, rate):
    opts = ipfix_message([options_template_set(400, [(149, 4)], opt_fields), data_set(400, [u(7, 4) + opt_values])])
    data = ipfix_message([template_set({256: BASIC}), data_set(256, [_rec(octets=1500, pkts=3)])])
    df, _ = _decode(opts, data)
    row = df.row(0, named=True)
    assert row["sampling_rate"] == rate
    assert (row["size_bytes"], row["num_packets"]) == (1500, 3)  # as exported
    assert (row["est_size_bytes"], row["est_num_packets"]) == (1500 * rate, 3 * rate)


def test_sampling_per_selector_id():
    opts = ipfix_message([options_template_set(400, [(302, 2)], [(34, 4)]),
                          data_set(400, [u(1, 2) + u(10, 4), u(2, 2) + u(100, 4)])])
    fields = BASIC + [(302, 2)]
    data = ipfix_message([template_set({256: fields}), data_set(256, [_rec() + u(2, 2), _rec() + u(1, 2)])])
    df, _ = _decode(opts, data)
    assert df["sampling_rate"].to_list() == [100, 10]


@pytest.mark.parametrize("mutate,reason", [
    (lambda m: m[:10], "ipfix: message shorter than its 16-byte header"),
    (lambda m: m[:2] + u(len(m) + 40, 2) + m[4:], "ipfix: message length field does not fit the datagram"),
    (lambda m: m[:18] + u(9999, 2) + m[20:], "ipfix: set length overruns the message"),
    (lambda m: m[:16] + u(1, 2) + m[18:], "ipfix: reserved set id"),
])
def test_malformed_messages_are_counted_not_raised(mutate, reason):
    msg = ipfix_message([template_set({256: BASIC}), data_set(256, [_rec()])])
    _, dec = _decode(mutate(msg))
    assert dec.rejects[reason] == 1
    assert dec.samples[reason]


def test_good_sets_before_a_broken_one_still_decode():
    good = ipfix_message([template_set({256: BASIC}), data_set(256, [_rec()])])
    broken = good + b"\x01\x00\x00\x02"  # a set header with length 2 (< 4), inside the message length
    broken = broken[:2] + u(len(broken), 2) + broken[4:]
    df, dec = _decode(broken)
    assert df.height == 1
    assert dec.rejects["ipfix: set length overruns the message"] == 1
