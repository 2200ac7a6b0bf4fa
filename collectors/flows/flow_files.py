"""Flow export files: RFC 5655 IPFIX files, pcap/pcapng of export traffic, nfdump CSV and JSON.

IPFIX files are IPFIX messages back to back; each message's length field
finds the next. Captures (read with ``dpkt``) are walked packet by packet:
every UDP payload, IPv4 or IPv6 over Ethernet, Linux cooked capture (v1/v2),
raw IP or loopback, goes to the same :class:`FlowDecoder` the live collector
uses, with the packet's source address as the exporter and its capture time
(sFlow rows take it as their time). nfdump's ``-o csv`` and ``-o json``
outputs are tables already; their times are in the local time of the machine
that ran nfdump (``--opt tz_offset_s=N`` overrides), the CSV's start has
whole-second resolution and nfdump keeps no observation domain (exporter is
``router/0``).
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import struct
import time
from pathlib import Path

import polars as pl

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.flows.flow_decoder import FlowDecoder
from rankscope.collectors.flows.packet_columns import TCP_FLAG_BITS

PCAP_MAGICS = (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
NFDUMP_CSV_HEADER = "ts,te,td,sa,da,sp,dp,pr"
PROTOCOLS = {"ICMP": 1, "IGMP": 2, "TCP": 6, "UDP": 17, "GRE": 47, "ESP": 50, "AH": 51, "ICMP6": 58,
             "SCTP": 132}
NFDUMP_FLAG_LETTERS = "FSRPAUEC"
"""nfdump's letter for each TCP flag bit, lowest first: it prints them highest first ('...AP.SF')."""
_HEX_FLAGS = re.compile(r"0[xX]([0-9a-fA-F]{1,4})")
_DECIMAL = re.compile(r"[0-9]{1,5}")


# ------------------------------------------------------------------ IPFIX files
def looks_like_ipfix_file(head: bytes) -> bool:
    if len(head) < 16 or head[:2] != b"\x00\x0a":
        return False
    length = struct.unpack_from(">H", head, 2)[0]
    return 16 <= length and (length >= len(head) or head[length:length + 2] in (b"\x00\x0a", b""))


def ipfix_file_messages(data: bytes, dec: FlowDecoder):
    """Yield (message, exporter, time) of an RFC 5655 file; a broken length stops there (counted)."""
    pos = 0
    while pos < len(data):
        if len(data) - pos < 16 or data[pos:pos + 2] != b"\x00\x0a":
            dec.reject("ipfix file: bytes after the last message are not an IPFIX message", data[pos:pos + 32])
            return
        length = struct.unpack_from(">H", data, pos + 2)[0]
        if length < 16 or pos + length > len(data):
            dec.reject("ipfix file: message length runs past the end of the file", data[pos:pos + 32])
            return
        yield data[pos:pos + length], "file", 0
        pos += length


def ipfix_stream_messages(path: Path, dec: FlowDecoder):
    """:func:`ipfix_file_messages` reading the file as it goes (same messages, same rejects)."""
    with open(path, "rb") as f:
        while head := f.read(16):
            if len(head) < 16 or head[:2] != b"\x00\x0a":
                dec.reject("ipfix file: bytes after the last message are not an IPFIX message",
                           (head + f.read(16))[:32])
                return
            length = struct.unpack_from(">H", head, 2)[0]
            body = f.read(max(length - 16, 16)) if length < 16 else f.read(length - 16)
            if length < 16 or len(body) < length - 16:
                dec.reject("ipfix file: message length runs past the end of the file", (head + body)[:32])
                return
            yield head + body, "file", 0


def ipfix_file_self_contained(path: Path) -> set[int] | None:
    """Observation domains of an RFC 5655 file that withdraw no template and whose every data set comes after
    its (options) template in the file: their records decode alike whatever templates earlier files left
    (the Ray ingest decodes such files ahead of those: collectors.ingest.staged). None when the file is not
    whole (a broken message or set: the decoder's reading of it is then left to decide)."""
    from rankscope.collectors.flows.ipfix import HEADER, SET_HEADER, parse_templates

    defined: set[tuple[int, int]] = set()
    seen: set[int] = set()
    dirty: set[int] = set()
    with open(path, "rb") as f:
        while head := f.read(16):
            length = struct.unpack_from(">H", head, 2)[0] if len(head) == 16 else 0
            if head[:2] != b"\x00\x0a" or length < 16:
                return None
            body = f.read(length - 16)
            if len(body) < length - 16:
                return None
            domain = HEADER.unpack_from(head)[4]
            seen.add(domain)
            pos = 0
            while len(body) - pos >= 4:
                sid, slen = SET_HEADER.unpack_from(body, pos)
                if slen < 4 or pos + slen > len(body):
                    return None
                if sid in (2, 3):
                    records, error = parse_templates(body[pos + 4:pos + slen], options=sid == 3)
                    if error:
                        return None
                    dirty.update(domain for _, layout in records if layout is None)  # a withdrawal
                    defined.update((domain, tid) for tid, _ in records)
                elif sid >= 256 and (domain, sid) not in defined:
                    dirty.add(domain)  # decoded with a template an earlier file sent
                pos += slen
    return seen - dirty


# ----------------------------------------------------------------- captures
def _udp_payload(frame: bytes, linktype: int):
    """(source address, payload) of a UDP datagram in a captured frame, or None."""
    import dpkt

    try:
        if linktype == dpkt.pcap.DLT_EN10MB:
            ip = dpkt.ethernet.Ethernet(frame).data
        elif linktype == dpkt.pcap.DLT_LINUX_SLL:
            ip = dpkt.sll.SLL(frame).data
        elif linktype == 276:  # DLT_LINUX_SLL2
            ip = dpkt.sll2.SLL2(frame).data
        elif linktype in (dpkt.pcap.DLT_RAW, 101, 228, 229):
            ip = dpkt.ip.IP(frame) if frame[:1] and frame[0] >> 4 == 4 else dpkt.ip6.IP6(frame)
        elif linktype in (dpkt.pcap.DLT_NULL, dpkt.pcap.DLT_LOOP):
            ip = dpkt.loopback.Loopback(frame).data
        else:
            return None
    except (dpkt.UnpackError, struct.error, IndexError, ValueError):
        return None
    if isinstance(ip, dpkt.ip.IP):
        src = socket.inet_ntoa(ip.src)
    elif isinstance(ip, dpkt.ip6.IP6):
        src = socket.inet_ntop(socket.AF_INET6, ip.src)
    else:
        return None
    udp = ip.data
    if not isinstance(udp, dpkt.udp.UDP):
        return None
    return src, bytes(udp.data)


MAX_SNAPLEN = 262_144
"""libpcap's largest snap length: a record claiming more is corrupt (never allocated)."""


def _pcap_records(f, dec: FlowDecoder):
    """(time s, frame) of a classic pcap, read with length checks before any allocation."""
    head = f.read(24)
    big = head[:4] in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d")
    nano = head[:4] in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    e = ">" if big else "<"
    snaplen, linktype = struct.unpack_from(e + "II", head, 16)
    limit = max(65_535, min(snaplen, MAX_SNAPLEN))
    record = struct.Struct(e + "IIII")
    yield linktype & 0xFFFF
    index = 0
    while h := f.read(16):
        index += 1
        if len(h) < 16:
            dec.reject("capture: truncated packet record (capture cut short)")
            return
        sec, frac, incl, _ = record.unpack(h)
        if incl > limit:
            dec.reject(f"capture: packet record length beyond the snap length {limit:,} (corrupt capture: "
                       "the rest of the file is skipped)", h)
            return
        frame = f.read(incl)
        if len(frame) < incl:
            dec.reject("capture: truncated packet record (capture cut short)")
            return
        yield sec + frac * (1e-9 if nano else 1e-6), frame


class _Clamped:
    """A file whose reads never ask for more than is left (a corrupt length cannot allocate gigabytes)."""

    def __init__(self, f):
        self._f = f
        self._size = os.fstat(f.fileno()).st_size

    def read(self, n: int = -1) -> bytes:
        left = max(0, self._size - self._f.tell())
        return self._f.read(left if n is None or n < 0 else min(n, left))

    def __getattr__(self, name):
        return getattr(self._f, name)


def capture_datagrams(path: Path, dec: FlowDecoder):
    """Yield (payload, source address, capture time ns) of every UDP datagram in a pcap/pcapng file."""
    import dpkt

    with open(path, "rb") as f:
        magic = f.read(4)
        f.seek(0)
        if len(magic) < 4 or os.fstat(f.fileno()).st_size < (28 if magic == PCAPNG_MAGIC else 24):
            raise InputFormatError(path, "file header", "a pcap or pcapng capture", got="a file shorter than its header")
        if magic == PCAPNG_MAGIC:
            try:
                reader = dpkt.pcapng.Reader(_Clamped(f))
            except (ValueError, dpkt.UnpackError, struct.error) as e:
                raise InputFormatError(path, "file header", "a pcapng capture", got=str(e)) from e
            linktype, packets = reader.datalink(), iter(reader)
        else:
            packets = _pcap_records(f, dec)
            linktype = next(packets)
        try:
            for ts, frame in packets:
                got = _udp_payload(frame, linktype)
                if got is None:
                    dec.reject("capture: packet is not UDP over IP")
                    continue
                yield got[1], got[0], int(ts * 1e9)
        except (ValueError, dpkt.UnpackError, struct.error):
            dec.reject("capture: truncated packet record (capture cut short)")


# ------------------------------------------------------------------- nfdump
def _tz_offset_s(opts_extra: dict) -> int:
    if "tz_offset_s" in opts_extra:
        try:
            return int(opts_extra["tz_offset_s"])
        except ValueError:
            raise InputFormatError(None, None, "--opt tz_offset_s=<integer seconds>",
                                   got=opts_extra["tz_offset_s"]) from None
    return time.localtime().tm_gmtoff


def _protocol(col: pl.Expr) -> pl.Expr:
    txt = col.cast(pl.String).str.strip_chars()
    return pl.coalesce(txt.cast(pl.Int32, strict=False),
                       txt.str.to_uppercase().replace_strict(PROTOCOLS, default=None, return_dtype=pl.Int32))


def tcp_flags_value(text: str) -> int | None:
    """TCP flags as nfdump spells them, as a number; None for anything nfdump does not write.

    nfdump 1.7 writes 8 positions, 'CEUAPRSF' with '.' for an unset flag; 1.6 wrote the low 6
    ('UAPRSF') and hex ('0xc2') when a higher flag was set; a JSON number is taken as it is.
    """
    t = text.strip()
    if m := _HEX_FLAGS.fullmatch(t):
        value = int(m[1], 16)
    elif _DECIMAL.fullmatch(t):
        value = int(t)
    elif 0 < len(t) <= len(NFDUMP_FLAG_LETTERS) and all(
            c in (".", NFDUMP_FLAG_LETTERS[i]) for i, c in enumerate(reversed(t))):
        value = sum(1 << i for i, c in enumerate(reversed(t)) if c != ".")
    else:
        return None
    return value if value <= TCP_FLAG_BITS else None  # beyond NS: not TCP flags


def _tcp_flags(df: pl.DataFrame, name: str) -> pl.Expr:
    """nfdump's flags column as tcp_flags; a spelling :func:`tcp_flags_value` does not know is null for
    that record (the rest of the record is still good), and a file without the column gives nulls."""
    if name not in df.columns:
        return pl.lit(None, pl.Int32)
    # a capture prints few distinct spellings: each is parsed once
    spellings = df[name].drop_nulls().unique().to_list()
    return pl.col(name).replace_strict({s: tcp_flags_value(s) for s in spellings}, default=None,
                                       return_dtype=pl.Int32)


def read_nfdump_csv(path: Path, text: str, extra: dict) -> tuple[pl.DataFrame, int]:
    """nfdump ``-o csv`` rows as flow columns; returns (frame, rows rejected by field count)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith(NFDUMP_CSV_HEADER):
        raise InputFormatError(path, "line 1", f"an nfdump CSV header starting {NFDUMP_CSV_HEADER!r}",
                               got=lines[0][:80] if lines else "empty file")
    width = lines[0].count(",")
    body = [lines[0]]
    bad = 0
    for line in lines[1:]:
        if not line.strip() or line.startswith("Summary"):
            break  # nfdump appends a summary block after an empty line
        if line.count(",") != width:
            bad += 1
            continue
        body.append(line)
    df = pl.read_csv(io.StringIO("\n".join(body)), infer_schema=False)
    off = _tz_offset_s(extra) * 1_000_000_000
    ts = pl.col("ts").str.strip_chars().str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="ns")
    start = ts.cast(pl.Int64) - off
    dur = (pl.col("td").str.strip_chars().cast(pl.Float64, strict=False) * 1e9).round().cast(pl.Int64)
    out = df.select(
        exporter=pl.col("ra").str.strip_chars() + "/0",
        src_addr=pl.col("sa").str.strip_chars(), dst_addr=pl.col("da").str.strip_chars(),
        src_port=pl.col("sp").cast(pl.Int32, strict=False), dst_port=pl.col("dp").cast(pl.Int32, strict=False),
        protocol=_protocol(pl.col("pr")),
        size_bytes=pl.col("ibyt"), num_packets=pl.col("ipkt"),
        start_ns=start, end_ns=start + dur,
        input_if=pl.col("in"), output_if=pl.col("out"),
        vlan=pl.col("svln") if "svln" in df.columns else pl.lit(None),
        tcp_flags=_tcp_flags(df, "flg"), source=pl.lit("nfdump"))
    return out, bad


def read_nfdump_json(path: Path, text: str, extra: dict) -> pl.DataFrame:
    """nfdump ``-o json`` records (type FLOW) as flow columns."""
    try:
        records = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputFormatError(path, f"line {e.lineno}", "nfdump JSON (a list of flow objects)", got=e.msg) from e
    if not isinstance(records, list):
        raise InputFormatError(path, None, "a JSON list of nfdump records", got=type(records).__name__)
    rows = [r for r in records if isinstance(r, dict) and r.get("type", "FLOW") == "FLOW"]
    if not rows:
        return pl.DataFrame()
    keys = ("first", "last", "src4_addr", "dst4_addr", "src6_addr", "dst6_addr", "src_port", "dst_port", "proto",
            "in_bytes", "in_packets", "ip4_router", "ip6_router", "input_snmp", "output_snmp", "src_vlan",
            "sampled", "export_sysid", "tcp_flags")
    df = pl.DataFrame({k: [None if r.get(k) is None else str(r.get(k)) for r in rows] for k in keys},
                      schema={k: pl.String for k in keys})
    off = _tz_offset_s(extra) * 1_000_000_000

    def t(c):
        return pl.col(c).str.to_datetime("%Y-%m-%dT%H:%M:%S%.f", strict=False, time_unit="ns").cast(pl.Int64) - off

    return df.select(
        # flows nfdump made itself (nfpcapd metering an interface) carry no router address: the exporter is
        # then the file's own, told apart by nfdump's exporter id as an IPFIX file's are by their domain
        exporter=pl.coalesce(pl.coalesce("ip4_router", "ip6_router") + "/0",
                             "file/" + pl.col("export_sysid").fill_null("0")),
        src_addr=pl.coalesce("src4_addr", "src6_addr"), dst_addr=pl.coalesce("dst4_addr", "dst6_addr"),
        src_port="src_port", dst_port="dst_port", protocol=_protocol(pl.col("proto")),
        size_bytes="in_bytes", num_packets="in_packets", start_ns=t("first"), end_ns=t("last"),
        input_if="input_snmp", output_if="output_snmp", vlan="src_vlan",
        # nfdump prints tcp_flags for every record but ICMP ones: those get null
        tcp_flags=_tcp_flags(df, "tcp_flags"), source=pl.lit("nfdump"))
