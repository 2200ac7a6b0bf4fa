"""NetFlow v9 and v5: golden tests on real softflowd captures and hand-built edge cases."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from rankscope.collectors.flows import flow_files
from rankscope.collectors.flows.flow_decoder import FlowDecoder
from tests.unit.collectors.flow_builders import (
    data_set,
    nf5_packet,
    nf9_options_template,
    nf9_packet,
    nf9_template,
    u,
    v4,
)

FIXTURES = Path(__file__).parent / "fixtures"


def _capture(name: str) -> tuple[pl.DataFrame, FlowDecoder]:
    dec = FlowDecoder()
    for payload, addr, ts in flow_files.capture_datagrams(FIXTURES / name, dec):
        dec.feed(payload, addr, ts)
    return pl.from_arrow(dec.flush(final=True)["flow"]), dec


def _decode(*packets) -> tuple[pl.DataFrame, FlowDecoder]:
    dec = FlowDecoder()
    for p in packets:
        dec.feed(p, "198.51.100.1", 0)
    t = dec.flush(final=True)
    return (pl.from_arrow(t["flow"]) if "flow" in t else pl.DataFrame()), dec


def test_softflowd_netflow9_golden():
    df, dec = _capture("softflowd_nf9.pcap")
    assert not dec.rejects
    tcp = df.filter((pl.col("protocol") == 6) & (pl.col("dst_port") == 5001)).row(0, named=True)
    # Values as softflowd exported them (checked by hand against the raw record bytes).
    assert (tcp["src_addr"], tcp["dst_addr"], tcp["size_bytes"], tcp["num_packets"]) == \
        ("10.67.0.1", "10.67.0.2", 238612, 161)
    assert tcp["source"] == "netflow9" and tcp["exporter"] == "127.0.0.1/0"
    assert tcp["tcp_flags"] == 0x1A  # SYN|PSH|ACK, as in the record's TCP_FLAGS byte
    assert 0 < tcp["end_ns"] - tcp["start_ns"] < 10**9
    assert 1_796_000_000 * 10**9 < tcp["start_ns"] < 1_797_000_000 * 10**9  # Dec 2026, when it was captured


def test_softflowd_netflow5_golden():
    df, dec = _capture("softflowd_nf5.pcap")
    assert not dec.rejects
    assert df.height == 4
    tcp = df.filter(pl.col("dst_port") == 5001).row(0, named=True)
    assert (tcp["size_bytes"], tcp["num_packets"], tcp["protocol"]) == (237112, 160, 6)
    udp = df.filter(pl.col("protocol") == 17).row(0, named=True)
    assert (udp["dst_port"], udp["size_bytes"], udp["num_packets"]) == (9999, 640, 5)
    assert tcp["source"] == "netflow5"
    assert tcp["tcp_flags"] == 0x1A and udp["tcp_flags"] == 0  # byte 37 of each record, read by hand


def test_netflow9_times_are_placed_on_the_epoch_with_the_header():
    fields = [(8, 4), (12, 4), (1, 4), (2, 4), (22, 4), (21, 4), (7, 2), (11, 2), (4, 1)]
    rec = v4("10.0.0.1") + v4("10.0.0.2") + u(3000, 4) + u(2, 4) + u(9_000, 4) + u(9_800, 4) + u(1, 2) + \
        u(2, 2) + u(17, 1)
    pkt = nf9_packet([nf9_template({260: fields}), data_set(260, [rec], pad_to=4)], uptime_ms=10_000,
                     unix_s=1_700_000_000)
    df, dec = _decode(pkt)
    assert not dec.rejects
    assert df["start_ns"][0] == (1_700_000_000_000 - 10_000 + 9_000) * 10**6
    assert df["end_ns"][0] == (1_700_000_000_000 - 10_000 + 9_800) * 10**6
    assert df["exporter"][0] == "198.51.100.1/3"


def test_netflow9_records_share_their_exporters_boot_time():
    """unix_secs is whole seconds: packets sent 0.9 s and 0.1 s into a second give boot times 0.8 s apart.
    Both records must be placed on the latest one (the exporter's boot time, to the packets' precision),
    so that records exported 2.2 s apart keep their true 0.5 s distance."""
    fields = [(8, 4), (12, 4), (1, 4), (2, 4), (22, 4), (21, 4), (7, 2), (11, 2), (4, 1)]
    boot_ms = 1_700_000_000_000 - 50_000

    def pkt(first_ms: int, sent_ms: int) -> bytes:
        rec = v4("10.0.0.1") + v4("10.0.0.2") + u(3000, 4) + u(2, 4) + u(first_ms, 4) + u(first_ms + 10, 4) + \
            u(1, 2) + u(2, 2) + u(17, 1)
        unix_ms = boot_ms + sent_ms
        return nf9_packet([nf9_template({260: fields}), data_set(260, [rec], pad_to=4)], uptime_ms=sent_ms,
                          unix_s=unix_ms // 1000)

    df, dec = _decode(pkt(40_000, 49_900), pkt(40_500, 52_100))  # the second sent 0.1 s into its second
    assert not dec.rejects
    start = sorted(df["start_ns"].to_list())
    assert start[1] - start[0] == 500 * 10**6
    assert start[0] == (boot_ms - 100 + 40_000) * 10**6  # 0.1 s below the boot time: all the header can tell


def test_netflow9_options_sampling_and_scope_fields_skipped():
    # Scope type 1 (System) must not be read as element 1 (octets).
    opts = nf9_options_template(300, [(1, 4)], [(34, 4), (49, 1)])
    opt_data = data_set(300, [u(0xDEAD, 4) + u(250, 4) + u(2, 1)], pad_to=4)
    fields = [(8, 4), (12, 4), (1, 4), (2, 4), (22, 4), (21, 4)]
    rec = v4("10.0.0.1") + v4("10.0.0.2") + u(1000, 4) + u(4, 4) + u(1, 4) + u(2, 4)
    pkt = nf9_packet([opts, opt_data, nf9_template({260: fields}), data_set(260, [rec])], 10_000, 1_700_000_000)
    df, dec = _decode(pkt)
    row = df.row(0, named=True)
    assert (row["sampling_rate"], row["size_bytes"], row["est_size_bytes"], row["est_num_packets"]) == \
        (250, 1000, 250_000, 1000)


def test_netflow9_malformed_flowset_counted():
    pkt = nf9_packet([nf9_template({260: [(8, 4)]})], 1, 1)
    bad = pkt[:22] + u(5000, 2) + pkt[24:]
    _, dec = _decode(bad)
    assert dec.rejects["netflow9: flowset length overruns the packet"] == 1


def test_netflow5_sampling_and_times():
    recs = [dict(src="10.0.0.1", dst="10.0.0.2", sport=5, dport=6, proto=6, packets=10, bytes=15000,
                 first=4_000, last=4_900)]
    pkt = nf5_packet(recs, uptime_ms=5_000, unix_s=1_700_000_000, unix_ns=250_000_000,
                     sampling=(1 << 14) | 64)
    df, dec = _decode(pkt)
    row = df.row(0, named=True)
    assert (row["sampling_rate"], row["est_size_bytes"]) == (64, 15000 * 64)
    assert row["start_ns"] == (1_700_000_000_250 - 5_000 + 4_000) * 10**6
    assert row["exporter"] == "198.51.100.1/258"  # engine type 1, engine id 2
    assert (row["input_if"], row["output_if"]) == (1, 2)


def test_netflow5_count_beyond_packet_counted():
    recs = [dict(src="10.0.0.1", dst="10.0.0.2", sport=5, dport=6, proto=6, packets=1, bytes=1, first=1, last=1)]
    pkt = nf5_packet(recs, 5_000, 1_700_000_000)
    _, dec = _decode(pkt[:2] + u(3, 2) + pkt[4:])
    assert dec.rejects["netflow5: packet shorter than its record count says"] == 1


def test_netflow9_tcp_flags_field_and_its_absence():
    with_flags = [(8, 4), (12, 4), (1, 4), (2, 4), (4, 1), (6, 1)]
    without = [(8, 4), (12, 4), (1, 4), (2, 4), (4, 1)]
    base = v4("10.0.0.1") + v4("10.0.0.2") + u(3000, 4) + u(2, 4) + u(6, 1)
    pkt = nf9_packet([nf9_template({260: with_flags, 261: without}),
                      data_set(260, [base + u(0x12, 1), base + u(0x11, 1)], pad_to=4),
                      data_set(261, [base], pad_to=4)], uptime_ms=10_000, unix_s=1_700_000_000)
    df, dec = _decode(pkt)
    assert not dec.rejects
    assert sorted(df["tcp_flags"].to_list(), key=str) == [17, 18, None]
    assert df["protocol"].to_list() == [6, 6, 6] and df["size_bytes"].to_list() == [3000] * 3


def test_netflow5_tcp_flags_byte():
    recs = [dict(src="10.0.0.1", dst="10.0.0.2", sport=5, dport=6, proto=6, packets=1, bytes=60, first=1, last=1,
                 tcp_flags=0x12, tos=0xB8),
            dict(src="10.0.0.2", dst="10.0.0.1", sport=6, dport=5, proto=6, packets=1, bytes=60, first=1, last=1,
                 tcp_flags=0x11)]
    df, dec = _decode(nf5_packet(recs, 5_000, 1_700_000_000))
    assert not dec.rejects
    assert df["tcp_flags"].to_list() == [0x12, 0x11]
    # the bytes either side (pad1, prot, tos) stay where they were
    assert df["protocol"].to_list() == [6, 6] and df["src_port"].to_list() == [5, 6]


def test_netflow9_packets_back_to_back_are_split_at_the_next_header():
    """A raw v9 dump (flows.nf9): no packet length, so packets split where a flowset would start with
    0x0009, a reserved flowset id; a template-less packet splits the same way, and trailing bytes are
    counted."""
    from rankscope.collectors.flows import netflow9

    fields = [(8, 4), (12, 4), (1, 4), (2, 4), (22, 4), (21, 4), (7, 2), (11, 2), (4, 1)]
    rec = v4("10.0.0.1") + v4("10.0.0.2") + u(3000, 4) + u(2, 4) + u(9_000, 4) + u(9_800, 4) + u(1, 2) + \
        u(2, 2) + u(17, 1)
    first = nf9_packet([nf9_template({260: fields}), data_set(260, [rec], pad_to=4)], uptime_ms=10_000,
                       unix_s=1_700_000_000)
    second = nf9_packet([data_set(260, [rec, rec], pad_to=4)], uptime_ms=11_000, unix_s=1_700_000_001)
    assert netflow9.looks_like_stream(first) and not netflow9.looks_like_stream(b"\x00\x0a" + first[2:])
    dec = FlowDecoder()
    packets = [p for p, _, _ in netflow9.stream_packets(first + second + b"\x01\x02\x03", dec)]
    assert packets == [first, second]
    assert dec.rejects["netflow9 file: bytes after the last packet are not a NetFlow v9 packet"] == 1
    df, dec = _decode(*packets)
    assert df.height == 3 and not dec.rejects


def test_the_validation_v8_raw_dump_decodes_as_its_generator_wrote_it():
    import json

    import pytest

    from rankscope.collectors.flows import netflow9

    case = Path(__file__).resolve().parents[4] / "shared" / "validation" / "flows" / "V8-128-slowgpu-v9"
    if not (case / "flows.nf9").exists():
        pytest.skip("../shared/validation is not present")
    dec = FlowDecoder()
    for p, addr, ts in netflow9.stream_packets((case / "flows.nf9").read_bytes(), dec):
        dec.feed(p, addr, ts)
    df = pl.from_arrow(dec.flush(final=True)["flow"])
    want = json.loads((case / "expect_flows.json").read_text())
    assert not dec.rejects and dec.datagrams == 1544
    assert (df.height, int(df["size_bytes"].sum()), int(df["num_packets"].sum())) == \
        (want["records"], want["octets_raw"], want["packets_raw"])
