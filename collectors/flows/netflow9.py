"""NetFlow v9 export packets (RFC 3954).

Same template machinery as IPFIX (:mod:`ipfix`, :mod:`packet_columns`): field
type numbers equal the IPFIX element ids rankscope reads. Differences handled
here: a 20-byte header with a record count instead of a length, flowset id 0
for templates and 1 for options templates (scope and option lengths in bytes,
scope fields skipped), and times ``FIRST_SWITCHED``/``LAST_SWITCHED`` relative
to the exporter's uptime, placed on the epoch with the header's ``sys_uptime``
and ``unix_secs``. Templates are kept per (exporter address, source id).

``unix_secs`` is whole seconds, so one packet's ``unix_secs*1000 - sys_uptime`` is the boot time
minus up to a second (the fraction of a second when the packet left). An exporter's boot time is the
latest such value over its packets (any packet sent just before a second ticks over is within a few ms
of it); records take it at flush as a time base learnt late (FlowDecoder.note_boot_ms), so the records of
one exporter share one base, and not one base per packet that jitters by up to a second.
"""

from __future__ import annotations

import struct

from rankscope.collectors.flows.ipfix import SET_HEADER, parse_templates

HEADER = struct.Struct(">HHIIII")  # version, count, sys_uptime ms, unix_secs, sequence, source id


def parse_packet(dec, data: bytes, addr: str) -> None:
    """Decode one NetFlow v9 packet into ``dec`` (a FlowDecoder)."""
    if len(data) < HEADER.size:
        dec.reject("netflow9: packet shorter than its 20-byte header", data)
        return
    _, _, uptime_ms, unix_s, _, source_id = HEADER.unpack_from(data, 0)
    exporter = dec.exporter_id(addr, source_id)
    dec.note_boot_ms(exporter, unix_s * 1000 - uptime_ms)
    mv = memoryview(data)
    pos, end = HEADER.size, len(data)
    while end - pos >= 4:
        set_id, set_len = SET_HEADER.unpack_from(data, pos)
        if set_len < 4 or pos + set_len > end:
            dec.reject("netflow9: flowset length overruns the packet", data)
            return
        body = mv[pos + 4:pos + set_len]
        if set_id in (0, 1):
            templates, err = parse_templates(body, options=set_id == 1, ipfix=False)
            for tid, layout in templates:
                dec.set_template("netflow9", exporter, tid, layout)
            if err:
                dec.reject(f"netflow9: {err}", data)
        elif set_id >= 256:
            dec.data_set("netflow9", exporter, set_id, body, unix_s, -1)  # the exporter's boot time, at flush
        else:
            dec.reject("netflow9: reserved flowset id", data)
        pos += set_len


def looks_like_stream(head: bytes) -> bool:
    """Whether a file starts as NetFlow v9 export packets written back to back (see :func:`stream_packets`)."""
    if len(head) < HEADER.size + 4 or head[:2] != b"\x00\x09":
        return False
    set_id, set_len = SET_HEADER.unpack_from(head, HEADER.size)
    return (set_id in (0, 1) or set_id >= 256) and set_len >= 4


def stream_packets(data: bytes, dec):
    """Yield (packet, exporter, time) of NetFlow v9 export packets written back to back (as nfcapd's raw
    dumps and the validation corpus's flows.nf9 hold them).

    v9 has no packet length: a packet ends after ``count`` records, which can be counted only with the
    templates. But a packet's flowsets never carry the ids 2-255 (reserved), so a flowset boundary that
    reads 0x0009 is the next packet's header: packets are split there, templates or not. Bytes that fit
    neither are counted as rejects and end the file.
    """
    pos, end = 0, len(data)
    while pos < end:
        if end - pos < HEADER.size or data[pos:pos + 2] != b"\x00\x09":
            dec.reject("netflow9 file: bytes after the last packet are not a NetFlow v9 packet", data[pos:pos + 32])
            return
        nxt = pos + HEADER.size
        while end - nxt >= 4 and data[nxt:nxt + 2] != b"\x00\x09":
            set_len = SET_HEADER.unpack_from(data, nxt)[1]
            if set_len < 4 or nxt + set_len > end:
                dec.reject("netflow9 file: flowset length runs past the end of the file", data[pos:pos + 32])
                return
            nxt += set_len
        yield data[pos:nxt], "file", 0
        pos = nxt
