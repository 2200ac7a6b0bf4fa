"""NetFlow v5 export packets: a 24-byte header and up to 30 fixed 48-byte records.

The record is described as a fixed :class:`Layout` with IPFIX element ids, so
it decodes column-wise like any template. Times (``first``/``last``) are
exporter uptime in ms, placed on the epoch with the header's ``sys_uptime``,
``unix_secs`` and ``unix_nsecs``; the header's sampling interval (mode in the
top two bits) becomes the sampling rate. Exporter is ``addr/engine_type.engine_id``
folded into one number (engine_type * 256 + engine_id).
"""

from __future__ import annotations

import struct

from rankscope.collectors.flows.packet_columns import Field, Layout

HEADER = struct.Struct(">HHIIIIBBH")  # version, count, uptime ms, secs, nsecs, sequence, engine type/id, sampling
RECORD_LENGTH = 48
MAX_RECORDS = 30

LAYOUT = Layout([Field(e, n) for e, n in (
    (8, 4), (12, 4), (-1, 4), (10, 2), (14, 2), (2, 4), (1, 4), (22, 4), (21, 4), (7, 2), (11, 2),
    (-1, 1), (6, 1), (4, 1), (5, 1), (-1, 2), (-1, 2), (-1, 1), (-1, 1), (-1, 2))], template_id=5)


def parse_packet(dec, data: bytes, addr: str) -> None:
    """Decode one NetFlow v5 packet into ``dec`` (a FlowDecoder)."""
    if len(data) < HEADER.size:
        dec.reject("netflow5: packet shorter than its 24-byte header", data)
        return
    _, count, uptime_ms, secs, nsecs, _, etype, eid, sampling = HEADER.unpack_from(data, 0)
    if not 1 <= count <= MAX_RECORDS:
        dec.reject("netflow5: record count not in 1..30", data)
        return
    if len(data) < HEADER.size + count * RECORD_LENGTH:
        dec.reject("netflow5: packet shorter than its record count says", data)
        return
    exporter = dec.exporter_index(f"{addr}/{etype * 256 + eid}")
    interval = sampling & 0x3FFF
    rate = interval if (sampling >> 14) and interval > 1 else 1
    base_ms = secs * 1000 + nsecs // 1_000_000 - uptime_ms
    ctx = (exporter, secs, base_ms, rate, 2)
    body = data[HEADER.size:HEADER.size + count * RECORD_LENGTH]
    dec.pending.add_fixed(LAYOUT, body, count, ctx)
