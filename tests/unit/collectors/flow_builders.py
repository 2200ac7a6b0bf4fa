"""Hand-built flow export packets for decoder tests (IPFIX, NetFlow v9/v5, sFlow v5)."""

from __future__ import annotations

import socket
import struct


def ipfix_message(sets: list[bytes], domain: int = 7, export_s: int = 1_700_000_000, seq: int = 0) -> bytes:
    body = b"".join(sets)
    return struct.pack(">HHIII", 10, 16 + len(body), export_s, seq, domain) + body


def _set(set_id: int, body: bytes, pad_to: int = 1) -> bytes:
    if pad_to > 1 and len(body) % pad_to:
        body += b"\0" * (pad_to - len(body) % pad_to)
    return struct.pack(">HH", set_id, 4 + len(body)) + body


def field_specs(fields) -> bytes:
    """fields: (element, length) or (element, length, enterprise)."""
    out = b""
    for f in fields:
        if len(f) == 3:
            out += struct.pack(">HHI", f[0] | 0x8000, f[1], f[2])
        else:
            out += struct.pack(">HH", f[0], f[1])
    return out


def template_set(templates: dict[int, list]) -> bytes:
    return _set(2, b"".join(struct.pack(">HH", tid, len(f)) + field_specs(f) for tid, f in templates.items()))


def withdrawal_set(tid: int, options: bool = False) -> bytes:
    return _set(3 if options else 2, struct.pack(">HH", tid, 0))


def options_template_set(tid: int, scope: list, fields: list) -> bytes:
    return _set(3, struct.pack(">HHH", tid, len(scope) + len(fields), len(scope)) + field_specs(scope + fields))


def data_set(tid: int, records: list[bytes], pad_to: int = 1) -> bytes:
    return _set(tid, b"".join(records), pad_to)


def v4(addr: str) -> bytes:
    return socket.inet_aton(addr)


def u(value: int, n: int) -> bytes:
    return value.to_bytes(n, "big")


def ntp(ns: int) -> bytes:
    sec, rem = divmod(ns, 1_000_000_000)
    return struct.pack(">II", sec + 2_208_988_800, (rem << 32) // 1_000_000_000 + (1 if rem else 0))


def nf9_packet(flowsets: list[bytes], uptime_ms: int, unix_s: int, source_id: int = 3) -> bytes:
    return struct.pack(">HHIIII", 9, len(flowsets), uptime_ms, unix_s, 0, source_id) + b"".join(flowsets)


def nf9_template(templates: dict[int, list]) -> bytes:
    return _set(0, b"".join(struct.pack(">HH", tid, len(f)) + field_specs(f) for tid, f in templates.items()))


def nf9_options_template(tid: int, scope: list, fields: list) -> bytes:
    return _set(1, struct.pack(">HHH", tid, 4 * len(scope), 4 * len(fields)) + field_specs(scope + fields), 4)


def nf5_packet(records: list[dict], uptime_ms: int, unix_s: int, unix_ns: int = 0, sampling: int = 0) -> bytes:
    head = struct.pack(">HHIIIIBBH", 5, len(records), uptime_ms, unix_s, unix_ns, 0, 1, 2, sampling)
    body = b""
    for r in records:
        body += struct.pack(">4s4s4sHHIIIIHHBBBBHHBBH", v4(r["src"]), v4(r["dst"]), v4("0.0.0.0"), r.get("in", 1),
                            r.get("out", 2), r["packets"], r["bytes"], r["first"], r["last"], r["sport"],
                            r["dport"], 0, r.get("tcp_flags", 0x18), r["proto"], r.get("tos", 0), 0, 0, 24, 24, 0)
    return head + body


def ethernet_ipv4_udp(src: str, dst: str, sport: int, dport: int, payload: bytes, vlan: int | None = None) -> bytes:
    eth = b"\x02\0\0\0\0\1" + b"\x02\0\0\0\0\2"
    if vlan is not None:
        eth += struct.pack(">HH", 0x8100, vlan)
    eth += struct.pack(">H", 0x0800)
    udp = struct.pack(">HHHH", sport, dport, 8 + len(payload), 0) + payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, v4(src), v4(dst))
    return eth + ip + udp


def tcp_header(sport: int, dport: int, flags: int = 0x18) -> bytes:
    """20 bytes; ``flags`` as in tcpControlBits (NS 0x100 goes to the data-offset byte)."""
    return struct.pack(">HHIIBBHHH", sport, dport, 1, 0, 0x50 | (flags >> 8 & 1), flags & 0xFF, 1000, 0, 0)


def ethernet_ipv4_tcp(src: str, dst: str, sport: int, dport: int, flags: int = 0x18) -> bytes:
    eth = b"\x02\0\0\0\0\1" + b"\x02\0\0\0\0\2" + struct.pack(">H", 0x0800)
    tcp = tcp_header(sport, dport, flags)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0, v4(src), v4(dst))
    return eth + ip + tcp


def ethernet_ipv6_tcp(src: str, dst: str, sport: int, dport: int, flags: int = 0x18) -> bytes:
    eth = b"\x02\0\0\0\0\1" + b"\x02\0\0\0\0\2" + struct.pack(">H", 0x86DD)
    tcp = tcp_header(sport, dport, flags)
    ip6 = struct.pack(">IHBB16s16s", 6 << 28, len(tcp), 6, 64, socket.inet_pton(socket.AF_INET6, src),
                      socket.inet_pton(socket.AF_INET6, dst))
    return eth + ip6 + tcp


def bth(opcode: int, dst_qp: int) -> bytes:
    return struct.pack(">BBHB", opcode, 0x40, 0xFFFF, 0) + dst_qp.to_bytes(3, "big") + struct.pack(">I", 7)


def _record(fmt: int, body: bytes) -> bytes:
    pad = (-len(body)) % 4
    return struct.pack(">II", fmt, len(body)) + body + b"\0" * pad


def sflow_flow_sample(header: bytes, frame_length: int, rate: int, in_if: int = 5, out_if: int = 6,
                      switch_vlan: int | None = None) -> bytes:
    recs = [_record(1, struct.pack(">IIII", 1, frame_length, 4, len(header)) + header)]
    if switch_vlan is not None:
        recs.append(_record(1001, struct.pack(">IIII", switch_vlan, 0, switch_vlan, 0)))
    body = struct.pack(">IIIIIIII", 1, 0x00000005, rate, rate * 10, 0, in_if, out_if, len(recs)) + b"".join(recs)
    return struct.pack(">II", 1, len(body)) + body


def sflow_ipv4_sample(src: str, dst: str, sport: int, dport: int, proto: int, tcp_flags: int, length: int,
                      rate: int) -> bytes:
    """A flow sample whose only record is a sampled IPv4 record (0:3), no raw header."""
    rec = _record(3, struct.pack(">II4s4sIIII", length, proto, v4(src), v4(dst), sport, dport, tcp_flags, 0))
    body = struct.pack(">IIIIIIII", 1, 0x00000005, rate, rate * 10, 0, 5, 6, 1) + rec
    return struct.pack(">II", 1, len(body)) + body


def sflow_counter_sample(if_index: int, speed: int, in_octets: int, out_octets: int) -> bytes:
    rec = struct.pack(">IIQIIQIIIIIIQIIIIII", if_index, 6, speed, 1, 3, in_octets, 10, 0, 0, 1, 2, 0,
                      out_octets, 20, 0, 0, 3, 4, 0)
    body = struct.pack(">III", 1, if_index, 1) + _record(1, rec)
    return struct.pack(">II", 2, len(body)) + body


def sflow_datagram(samples: list[bytes], agent: str = "192.0.2.9", sub_agent: int = 1) -> bytes:
    return struct.pack(">II4sIIII", 5, 1, v4(agent), sub_agent, 1, 1000, len(samples)) + b"".join(samples)


def seed_datagrams(fixtures) -> list[bytes]:
    """Real softflowd datagrams (IPFIX, v9, v5) plus a hand-built sFlow one: seeds for mutation fuzzing."""
    import dpkt

    out = []
    for name in ("softflowd_ipfix.pcap", "softflowd_nf9.pcap", "softflowd_nf5.pcap"):
        with open(fixtures / name, "rb") as f:
            for _, frame in dpkt.pcap.Reader(f):
                out.append(bytes(dpkt.ethernet.Ethernet(frame).data.data.data))
    frame = ethernet_ipv4_udp("10.1.0.1", "10.1.0.2", 49152, 4791, bth(0x0A, 0x12345) + b"\0" * 16, vlan=42)
    out.append(sflow_datagram([sflow_flow_sample(frame, 4158, 4096), sflow_counter_sample(3, 10**9, 5, 6)]))
    return out


def mutate(seeds: list[bytes], count: int, seed: int = 0):
    """Yield ``count`` mutated copies of the seeds: flipped bytes, cuts, inserted junk, spliced headers."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for i in range(count):
        base = bytearray(seeds[i % len(seeds)])
        op = rng.integers(0, 5)
        if op == 0:  # flip a few bytes
            for pos in rng.integers(0, len(base), size=rng.integers(1, 6)):
                base[pos] = rng.integers(0, 256)
        elif op == 1:  # cut
            base = base[: rng.integers(0, len(base))]
        elif op == 2:  # insert junk
            pos = rng.integers(0, len(base))
            base[pos:pos] = rng.bytes(int(rng.integers(1, 40)))
        elif op == 3:  # set a 16-bit length/count field to an extreme
            pos = rng.integers(0, max(1, len(base) - 1))
            base[pos:pos + 2] = bytes(rng.choice([b"\x00\x00", b"\xff\xff", b"\x00\x04", b"\x01\x00"]))
        else:  # splice two datagrams
            other = seeds[rng.integers(0, len(seeds))]
            base = base[: rng.integers(0, len(base))] + other[rng.integers(0, len(other)):]
        yield bytes(base)


def flood_empty_sets(index: int, sets: int = 340) -> bytes:
    """An IPFIX message of ``sets`` empty data sets for templates never sent (the 858 MB flood)."""
    body = b"".join(struct.pack(">HH", 256 + (index * sets + k) % 60000, 4) for k in range(sets))
    return ipfix_message([body], domain=1, seq=index)


def flood_new_domain(index: int) -> bytes:
    """An IPFIX message from an observation domain never seen before: a template and a data set."""
    fields = [(8, 4), (12, 4), (1, 4)] + [(210, 4)] * 20  # paddingOctets: a biggish template
    rec = v4("10.0.0.1") + v4("10.0.0.2") + u(100, 4) + b"\0" * 80
    return ipfix_message([template_set({256: fields}), data_set(257, [rec] * 10)], domain=index + 1000, seq=index)
