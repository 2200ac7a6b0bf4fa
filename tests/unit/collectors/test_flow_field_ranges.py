"""Every field's full range: 0xFFFFFFFF is a value, not an error; what cannot be stored is counted.

Each information element the decoders read is sent at the top of its wire
range, through the decoder, the schema validation and (for sFlow and v5/v9
captures) a real ingest into a store, and read back exactly.
"""

from __future__ import annotations

import struct

import dpkt
import pyarrow as pa
import pytest

from rankscope.collectors.flows import ipfix_elements as ie
from rankscope.collectors.flows.flow_decoder import FlowDecoder
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.schema import validate
from rankscope.collectors.store import Store
from tests.unit.collectors.flow_builders import (
    data_set,
    ethernet_ipv4_udp,
    ipfix_message,
    nf5_packet,
    nf9_packet,
    nf9_template,
    sflow_datagram,
    template_set,
    u,
    v4,
)

U32 = 0xFFFFFFFF
I64_MAX = (1 << 63) - 1


def _decode(*datagrams, addr="192.0.2.1", ts=1):
    dec = FlowDecoder()
    for d in datagrams:
        dec.feed(d, addr, ts)
    out = {}
    for kind, t in dec.flush(final=True).items():
        v = validate(t.append_column("job", pa.array(["j"] * t.num_rows)), kind)
        assert not v.rejects, v.rejects
        out[kind] = v.table.to_pylist()
    return out, dec.rejects


def _ingest_pcap(tmp_path, payloads, src="198.51.100.3", dport=6343):
    p = tmp_path / "cap.pcap"
    with open(p, "wb") as f:
        w = dpkt.pcap.Writer(f)
        for i, d in enumerate(payloads):
            w.writepkt(ethernet_ipv4_udp(src, "192.0.2.1", 50000, dport, d), ts=1_700_000_000 + i)
    store = Store(tmp_path / "st")
    summary = ingest(store, [p])
    assert summary.count("failed") == 0, [f.error for f in summary.files]
    return store, summary


def test_ipfix_every_element_at_its_32_bit_or_natural_maximum():
    fields, rec = [], b""
    for e, (_, kind) in ie.ELEMENTS.items():
        if kind == "ntp" or e in (22, 21, 152, 153, 158, 159, 156, 157, 154, 155, 160, 34, 50, 305, 306, 302, 48):
            continue  # times and sampling: own tests below
        n = {"ipv4": 4, "ipv6": 16}.get(kind, 2 if e in (7, 11, 58, 243) else 1 if e in (4, 5, 6) else 4)
        fields.append((e, n))
        rec += b"\xff" * n
    fields.append((150, 4))
    rec += b"\xff" * 4  # flowStartSeconds 0xFFFFFFFF: the year 2106, inside int64 nanoseconds
    out, rejects = _decode(ipfix_message([template_set({256: fields}), data_set(256, [rec])]))
    assert not rejects
    (row,) = out["flow"]
    assert row["size_bytes"] == U32 and row["num_packets"] == U32
    assert row["input_if"] == U32 and row["output_if"] == U32
    assert (row["src_port"], row["dst_port"], row["protocol"], row["vlan"]) == (65535, 65535, 255, 65535)
    assert row["tcp_flags"] == 0xFF
    assert row["src_addr"] == "255.255.255.255"
    assert row["start_ns"] == U32 * 10**9


@pytest.mark.parametrize("element,length", [(1, 8), (2, 8), (10, 8), (14, 8), (7, 4), (4, 8), (6, 8), (152, 8),
                                            (159, 8)])
def test_ipfix_values_beyond_their_column_are_counted_not_wrapped(element, length):
    base = [(8, 4), (12, 4), (1, 4)] if element != 1 else [(8, 4), (12, 4)]
    fields = base + [(element, length)]
    good = v4("10.0.0.1") + v4("10.0.0.2") + (u(100, 4) if element != 1 else b"")
    top_fits = I64_MAX if element in (1, 2, 10, 14) else 7  # the largest stored value, or a small one
    msg = ipfix_message([template_set({256: fields}),
                         data_set(256, [good + b"\xff" * length, good + u(top_fits, length)])])
    out, rejects = _decode(msg)
    name = ie.ELEMENTS[element][0]
    assert sum(n for r, n in rejects.items() if r.startswith(name)) == 1, rejects
    assert len(out["flow"]) == 1


def test_estimates_saturate_instead_of_wrapping():
    fields = [(8, 4), (12, 4), (1, 8), (34, 4)]
    rec = v4("10.0.0.1") + v4("10.0.0.2") + u(I64_MAX, 8) + u(U32, 4)
    out, _ = _decode(ipfix_message([template_set({256: fields}), data_set(256, [rec])]))
    (row,) = out["flow"]
    assert row["sampling_rate"] == U32 and row["est_size_bytes"] == I64_MAX


def test_netflow9_and_v5_at_their_maxima(tmp_path):
    fields = [(8, 4), (12, 4), (10, 4), (14, 4), (1, 4), (2, 4), (7, 2), (11, 2), (4, 1), (22, 4), (21, 4)]
    rec = v4("10.0.0.1") + v4("10.0.0.2") + b"\xff" * (4 * 4 + 2 + 2 + 1) + u(1000, 4) + u(1000, 4)
    v9 = nf9_packet([nf9_template({300: fields}), data_set(300, [rec], pad_to=4)], uptime_ms=U32,
                    unix_s=1_700_000_000)
    v5 = nf5_packet([{"src": "10.0.0.3", "dst": "10.0.0.4", "in": 65535, "out": 65535, "packets": U32,
                      "bytes": U32, "first": 0, "last": U32, "sport": 65535, "dport": 65535, "proto": 255}],
                    uptime_ms=U32, unix_s=U32, unix_ns=999_999_999, sampling=0xFFFF)
    store, summary = _ingest_pcap(tmp_path, [v9, v5], dport=2055)
    assert not summary.rejects, summary.rejects
    df = store.read("flow").sort("source")
    v5row, v9row = df.row(0, named=True), df.row(1, named=True)
    assert (v9row["input_if"], v9row["output_if"], v9row["size_bytes"], v9row["num_packets"]) == (U32,) * 4
    assert (v5row["input_if"], v5row["size_bytes"], v5row["num_packets"], v5row["protocol"]) == (65535, U32, U32, 255)
    assert v5row["sampling_rate"] == 0x3FFF  # mode bits set, interval 16383


def _sflow_all_ones_sample(frame: bytes) -> bytes:
    def rec(fmt, body):
        return struct.pack(">II", fmt, len(body)) + body + b"\0" * (-len(body) % 4)

    recs = [rec(1, struct.pack(">IIII", 1, U32, U32, len(frame)) + frame), rec(1001, struct.pack(">IIII", *[U32] * 4))]
    # expanded flow sample: seq, source type/index, rate, pool, drops, input fmt/value, output fmt/value
    body = struct.pack(">IIIIIIIIIII", *[U32] * 10, len(recs)) + b"".join(recs)
    return struct.pack(">II", 3, len(body)) + body


def _sflow_all_ones_counters() -> bytes:
    c = struct.pack(">IIQIIQIIIIIIQIIIIII", U32, U32, I64_MAX, U32, U32, I64_MAX, *[U32] * 6, I64_MAX, *[U32] * 6)
    rec = struct.pack(">II", 1, len(c)) + c
    body = struct.pack(">IIII", U32, U32, U32, 1) + rec
    return struct.pack(">II", 4, len(body)) + body


def test_sflow_0xffffffff_everywhere_is_stored_exactly(tmp_path):
    """The reporter's failure: ArrowInvalid 'Value 4294967295 too large' on a real sFlow capture."""
    frame = ethernet_ipv4_udp("10.1.0.1", "10.1.0.2", 65535, 65535, b"\0" * 16)
    store, summary = _ingest_pcap(tmp_path, [sflow_datagram([_sflow_all_ones_sample(frame),
                                                             _sflow_all_ones_counters()], sub_agent=U32)])
    assert not summary.rejects, summary.rejects
    row = store.read("flow").row(0, named=True)
    assert (row["input_if"], row["output_if"], row["vlan"], row["sampling_rate"], row["size_bytes"]) == (U32,) * 5
    assert row["exporter"] == f"192.0.2.9/{U32}" and row["est_size_bytes"] == I64_MAX  # U32 * U32 saturates
    cnt = store.read("interface_counter").row(0, named=True)
    assert cnt["if_index"] == U32 and cnt["in_octets"] == I64_MAX and cnt["in_errors"] == U32


def test_sflow_64_bit_counter_beyond_int64_is_counted():
    c = struct.pack(">IIQIIQIIIIIIQIIIIII", 1, 6, 1 << 63, 1, 1, 5, *[0] * 6, 6, *[0] * 6)
    body = struct.pack(">III", 1, 1, 1) + struct.pack(">II", 1, len(c)) + c
    dec = FlowDecoder()
    dec.feed(sflow_datagram([struct.pack(">II", 2, len(body)) + body]), "192.0.2.1", 1)
    assert not dec.flush(final=True) and dec.rejects["sflow: 64-bit counter beyond the int64 range"] == 1
