"""sFlow v5 datagrams: flow samples into ``flow`` rows, counter samples into ``interface_counter``.

A flow sample's raw packet header record is decoded down to the transport:
Ethernet (with 802.1Q/802.1ad tags), IPv4/IPv6, TCP/UDP ports, TCP flags, and for
RoCEv2 (UDP destination port 4791) the InfiniBand base transport header's
opcode and destination queue pair. Each sample becomes one flow row of one
packet (``size_bytes`` = the sampled frame's length) with the sample's
sampling rate; sFlow carries no per-sample time, so rows get the time the
datagram was received (live) or captured (pcap). Generic interface counter
records (0:1) become ``interface_counter`` rows. Samples are few per datagram
(a switch sends sampled packets, not every packet), so they are parsed in
Python; malformed parts are counted by reason and the rest still decodes.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import time

import numpy as np
import pyarrow as pa

from rankscope.collectors.flows.packet_columns import TCP_FLAG_BITS, scaled_estimate

ROCE_PORT = 4791
_U32 = struct.Struct(">I")
_FLOW = struct.Struct(">IIIIIIII")
_FLOW_X = struct.Struct(">IIIIIIIIIII")
_COUNTER_IF = struct.Struct(">IIQIIQIIIIIIQIIIIII")
_RAW = struct.Struct(">IIII")
_SWITCH = struct.Struct(">IIII")
_IPV4_DATA = struct.Struct(">II4s4sIIII")

FLOW_COLUMNS = ("exporter", "src_addr", "dst_addr", "src_port", "dst_port", "protocol", "size_bytes",
                "sampling_rate", "start_ns", "dst_qp", "ib_opcode", "vlan", "input_if", "output_if", "tcp_flags")


def parse_datagram(dec, data: bytes, addr: str, recv_ns: int) -> None:
    """Decode one sFlow v5 datagram into ``dec`` (a FlowDecoder)."""
    if len(data) < 28:
        dec.reject("sflow: datagram shorter than its header", data)
        return
    addr_type = _U32.unpack_from(data, 4)[0]
    if addr_type == 1:
        agent, pos = socket.inet_ntoa(data[8:12]), 12
    elif addr_type == 2 and len(data) >= 40:
        agent, pos = str(ipaddress.IPv6Address(data[8:24])), 24
    else:
        dec.reject("sflow: unknown agent address type", data)
        return
    if len(data) < pos + 16:
        dec.reject("sflow: datagram shorter than its header", data)
        return
    sub_agent, _, _, num_samples = struct.unpack_from(">IIII", data, pos)
    pos += 16
    exporter = f"{agent}/{sub_agent}"
    when = recv_ns or time.time_ns()
    for _ in range(num_samples):
        if len(data) - pos < 8:
            dec.reject("sflow: sample header overruns the datagram", data)
            return
        fmt, length = struct.unpack_from(">II", data, pos)
        body = data[pos + 8:pos + 8 + length]
        if len(body) < length:
            dec.reject("sflow: sample overruns the datagram", data)
            return
        pos += 8 + length
        if fmt in (1, 3):
            _flow_sample(dec, body, fmt == 3, exporter, when, data)
        elif fmt in (2, 4):
            _counter_sample(dec, body, fmt == 4, exporter, when, data)
        # other formats (vendor samples) are skipped by their length


def _records(body: bytes, pos: int, count: int):
    for _ in range(count):
        if len(body) - pos < 8:
            yield None, None
            return
        fmt, length = struct.unpack_from(">II", body, pos)
        rec = body[pos + 8:pos + 8 + length]
        if len(rec) < length:
            yield None, None
            return
        pos += 8 + ((length + 3) & ~3)
        yield fmt, rec


def _flow_sample(dec, body: bytes, expanded: bool, exporter: str, when: int, data: bytes) -> None:
    if expanded:
        if len(body) < _FLOW_X.size:
            dec.reject("sflow: flow sample shorter than its header", data)
            return
        _, _, _, rate, _, _, _, in_if, _, out_if, count = _FLOW_X.unpack_from(body, 0)
        pos = _FLOW_X.size
    else:
        if len(body) < _FLOW.size:
            dec.reject("sflow: flow sample shorter than its header", data)
            return
        _, _, rate, _, _, in_if, out_if, count = _FLOW.unpack_from(body, 0)
        in_if, out_if, pos = in_if & 0x3FFFFFFF, out_if & 0x3FFFFFFF, _FLOW.size
    row = None
    vlan = None
    for fmt, rec in _records(body, pos, count):
        if fmt is None:
            dec.reject("sflow: flow record overruns its sample", data)
            break
        if fmt == 1 and len(rec) >= _RAW.size:
            proto, frame_len, _, hlen = _RAW.unpack_from(rec, 0)
            parsed = decode_header(proto, rec[16:16 + hlen])
            if parsed is None:
                dec.reject("sflow: sampled header is not Ethernet/IP", data)
            else:
                row = (frame_len, *parsed)
        elif fmt == 3 and len(rec) >= _IPV4_DATA.size and row is None:
            length, proto, src, dst, sport, dport, flags, _ = _IPV4_DATA.unpack_from(rec, 0)
            # a 32-bit field: beyond tcpControlBits' flag bits it is not flags (nor fits the int32 column)
            flags = flags if proto == 6 and flags <= TCP_FLAG_BITS else None
            row = (length, socket.inet_ntoa(src), socket.inet_ntoa(dst), sport, dport, proto, None, None, None,
                   flags)
        elif fmt == 1001 and len(rec) >= _SWITCH.size:
            vlan = _SWITCH.unpack_from(rec, 0)[0]
    if row is None:
        dec.reject("sflow: flow sample without a decodable packet header", data)
        return
    frame_len, src, dst, sport, dport, proto, qp, opcode, hdr_vlan, flags = row
    dec.sflow_rows.append((exporter, src, dst, sport, dport, proto, frame_len, max(rate, 1), when, qp, opcode,
                           hdr_vlan if hdr_vlan is not None else vlan, in_if, out_if, flags))


def decode_header(proto: int, h: bytes):
    """(src, dst, sport, dport, ip protocol, dst_qp, ib_opcode, vlan, tcp flags) of a sampled header, or None."""
    vlan = None
    if proto == 1:  # Ethernet
        if len(h) < 14:
            return None
        etype, pos = struct.unpack_from(">H", h, 12)[0], 14
        while etype in (0x8100, 0x88A8) and len(h) >= pos + 4:
            vlan = struct.unpack_from(">H", h, pos)[0] & 0x0FFF
            etype, pos = struct.unpack_from(">H", h, pos + 2)[0], pos + 4
    elif proto in (11, 12):
        etype, pos = (0x0800 if proto == 11 else 0x86DD), 0
    else:
        return None
    if etype == 0x0800 and len(h) >= pos + 20:
        ihl = (h[pos] & 0x0F) * 4
        ip_proto = h[pos + 9]
        src, dst = socket.inet_ntoa(h[pos + 12:pos + 16]), socket.inet_ntoa(h[pos + 16:pos + 20])
        l4 = pos + max(ihl, 20)
    elif etype == 0x86DD and len(h) >= pos + 40:
        ip_proto = h[pos + 6]
        src = str(ipaddress.IPv6Address(h[pos + 8:pos + 24]))
        dst = str(ipaddress.IPv6Address(h[pos + 24:pos + 40]))
        l4 = pos + 40
    else:
        return None
    sport = dport = qp = opcode = None
    if ip_proto in (6, 17) and len(h) >= l4 + 4:
        sport, dport = struct.unpack_from(">HH", h, l4)
        if ip_proto == 17 and dport == ROCE_PORT and len(h) >= l4 + 8 + 8:
            bth = l4 + 8
            opcode = h[bth]
            qp = int.from_bytes(h[bth + 5:bth + 8], "big")
    flags = _tcp_flags(h, l4) if ip_proto == 6 else None
    return src, dst, sport, dport, ip_proto, qp, opcode, vlan, flags


def _tcp_flags(h: bytes, tcp: int) -> int | None:
    """The one sampled segment's flags, laid out as in tcpControlBits; None when the sampled header was cut
    before them (a sample is one packet: these are its flags, not a flow's OR)."""
    if len(h) < tcp + 14:
        return None
    # NS is the low bit of the data-offset byte; CWR..FIN are the byte after it
    return ((h[tcp + 12] & 0x01) << 8) | h[tcp + 13]


def _counter_sample(dec, body: bytes, expanded: bool, exporter: str, when: int, data: bytes) -> None:
    head = 16 if expanded else 12
    if len(body) < head:
        dec.reject("sflow: counter sample shorter than its header", data)
        return
    count = _U32.unpack_from(body, head - 4)[0]
    for fmt, rec in _records(body, head, count):
        if fmt is None:
            dec.reject("sflow: counter record overruns its sample", data)
            return
        if fmt == 1 and len(rec) >= _COUNTER_IF.size:
            v = _COUNTER_IF.unpack_from(rec, 0)
            if max(v[2], v[5], v[12]) >= 1 << 63:
                dec.reject("sflow: 64-bit counter beyond the int64 range", data)
                continue
            # ifIndex, speed, in octets/ucast/discards/errors, out octets/ucast/discards/errors
            dec.counter_rows.append((exporter, v[0], when, v[2], v[5], v[12], v[6], v[13], v[10], v[17],
                                     v[9], v[16]))


def flow_table(rows: list[tuple]) -> pa.Table:
    cols = dict(zip(FLOW_COLUMNS, zip(*rows)))
    n = len(rows)
    # Every sFlow field is an unsigned 32-bit value (0xFFFFFFFF included), so int64 columns hold them all.
    rate = np.array(cols["sampling_rate"], np.int64)
    size = np.array(cols["size_bytes"], np.int64)
    ones = pa.array([1] * n, pa.int64())
    return pa.table({
        "exporter": pa.array(cols["exporter"], pa.string()),
        "src_addr": pa.array(cols["src_addr"], pa.string()), "dst_addr": pa.array(cols["dst_addr"], pa.string()),
        "src_port": pa.array(cols["src_port"], pa.int32()), "dst_port": pa.array(cols["dst_port"], pa.int32()),
        "protocol": pa.array(cols["protocol"], pa.int32()),
        "size_bytes": size, "num_packets": ones,
        "start_ns": pa.array(cols["start_ns"], pa.int64()), "end_ns": pa.array(cols["start_ns"], pa.int64()),
        "sampling_rate": rate, "source": pa.array(["sflow"] * n, pa.string()),
        "est_size_bytes": scaled_estimate(size, rate), "est_num_packets": rate,
        "dst_qp": pa.array(cols["dst_qp"], pa.int64()), "ib_opcode": pa.array(cols["ib_opcode"], pa.int32()),
        "vlan": pa.array(cols["vlan"], pa.int64()),
        "input_if": pa.array(cols["input_if"], pa.int64()), "output_if": pa.array(cols["output_if"], pa.int64()),
        "tcp_flags": pa.array(cols["tcp_flags"], pa.int32()),
    })


COUNTER_COLUMNS = ("exporter", "if_index", "time_ns", "speed_bps", "in_octets", "out_octets", "in_packets",
                   "out_packets", "in_errors", "out_errors", "in_discards", "out_discards")


def counter_table(rows: list[tuple]) -> pa.Table:
    cols = dict(zip(COUNTER_COLUMNS, zip(*rows)))
    out = {k: pa.array(v, pa.string() if k == "exporter" else pa.int64()) for k, v in cols.items()}
    out["source"] = pa.array(["sflow"] * len(rows), pa.string())
    return pa.table(out)
