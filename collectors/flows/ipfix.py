"""IPFIX messages (RFC 7011): template, options template and data sets.

Templates and options templates are kept per (exporter address, observation
domain, template id); a template record with a field count of zero withdraws
one template (or, with id 2 / 3, all templates / options templates of the
domain); a template sent again under the same id replaces the old layout for
the data that follows. Options data sets update per-domain state rather than
producing flows: ``systemInitTimeMilliseconds`` (the base of
``flowStartSysUpTime``) and the sampling elements ``samplingInterval``,
``samplerRandomInterval`` and ``samplingPacketInterval`` (+ ``Space``), per
``selectorId``/``samplerId`` when the options record names one. Data sets are
queued as raw bytes per layout and decoded column-wise later
(:mod:`packet_columns`). Every malformed part is counted by reason on the
decoder; the rest of the message still decodes.
"""

from __future__ import annotations

import struct

import numpy as np

from rankscope.collectors.flows.packet_columns import (
    VARIABLE,
    Field,
    Layout,
    decode_fixed,
    decode_variable,
    layout_for,
    variable_columns,
)

HEADER = struct.Struct(">HHIII")  # version, length, export time, sequence, observation domain
SET_HEADER = struct.Struct(">HH")
FIELD = struct.Struct(">HH")


def parse_templates(body, options: bool, ipfix: bool = True) -> tuple[list[tuple[int, Layout | None]], str | None]:
    """Template records of one (options) template set.

    Returns [(template id, layout or None for a withdrawal)] and an error
    reason when the set is malformed (the records before it are kept).
    NetFlow v9 options templates give scope and option lengths in bytes and
    have no enterprise bit; their scope fields are skipped.
    """
    out: list[tuple[int, Layout | None]] = []
    pos, end = 0, len(body)
    head = 6 if options else 4
    while end - pos >= head:
        if ipfix:
            tid, count = FIELD.unpack_from(body, pos)
            scope = struct.unpack_from(">H", body, pos + 4)[0] if options and count else 0
            pos += head if count else 4
            if count == 0:
                out.append((tid, None))
                continue
            if options and (scope == 0 or scope > count):
                return out, "options template scope field count not in 1..field count"
        else:
            tid, first = FIELD.unpack_from(body, pos)
            if options:
                scope_len, opt_len = first, struct.unpack_from(">H", body, pos + 4)[0]
                if scope_len % 4 or opt_len % 4:
                    return out, "options template lengths not a multiple of 4"
                scope, count = scope_len // 4, (scope_len + opt_len) // 4
            else:
                scope, count = 0, first
            pos += head
        if tid < 256:
            return out, "template id below 256"
        fields = []
        for i in range(count):
            if end - pos < 4:
                return out, "template record overruns its set"
            element, length = FIELD.unpack_from(body, pos)
            pos += 4
            if ipfix and element & 0x8000:
                if end - pos < 4:
                    return out, "template record overruns its set"
                pos += 4  # enterprise number: vendor elements are skipped by length
                element = -1
            if not ipfix and i < scope:
                element = -1
            if length == 0 and not ipfix:
                return out, "template field of length 0"
            if length == VARIABLE and not ipfix:
                return out, "variable-length field in a NetFlow v9 template"
            fields.append(Field(element, length))
        layout = layout_for(fields, tid, scope)
        if layout.min_length == 0:
            return out, "template with zero-length records"
        out.append((tid, layout))
        if not ipfix and not options and end - pos < 4:
            break
    return out, None


def decode_options(layout: Layout, body) -> dict[int, np.ndarray]:
    """Columns of an options data set (few records; decoded at once)."""
    if layout.record_length is not None:
        n = len(body) // layout.record_length
        return decode_fixed(layout, bytes(body[:n * layout.record_length])) if n else {}
    values, n, _ = decode_variable(layout, body)
    return variable_columns(values) if n else {}


def parse_message(dec, data: bytes, addr: str) -> None:
    """Decode one IPFIX message into ``dec`` (a :class:`FlowDecoder`).

    The common case, a data set of a known fixed-length template, is queued
    right here (it is the per-datagram hot path of the collector).
    """
    if len(data) < HEADER.size:
        dec.reject("ipfix: message shorter than its 16-byte header", data)
        return
    _, length, export_s, _, domain = HEADER.unpack_from(data, 0)
    if length < HEADER.size or length > len(data):
        dec.reject("ipfix: message length field does not fit the datagram", data)
        return
    exporter = dec.exporter_id(addr, domain)
    templates = dec.templates
    ctx = None
    pos = HEADER.size
    while pos < length:
        if length - pos < 4:
            dec.reject("ipfix: truncated set header", data)
            return
        set_id, set_len = SET_HEADER.unpack_from(data, pos)
        if set_len < 4 or pos + set_len > length:
            dec.reject("ipfix: set length overruns the message", data)
            return
        if set_id >= 256:
            layout = templates.get(("ipfix", exporter, set_id))
            size = layout.record_length if layout is not None and not layout.scope_count else None
            if size:
                n = (set_len - 4) // size
                if n:
                    if ctx is None:
                        ctx = (exporter, export_s, dec.base_ms(exporter), dec.rates.get(exporter, 0), 0)
                    dec.pending.add_fixed(layout, data[pos + 4:pos + 4 + n * size], n, ctx)
            else:
                dec.data_set("ipfix", exporter, set_id, data[pos + 4:pos + set_len], export_s, dec.base_ms(exporter))
                ctx = None  # options data may have changed the sampling rate or time base
        elif set_id in (2, 3):
            found, err = parse_templates(memoryview(data)[pos + 4:pos + set_len], options=set_id == 3)
            for tid, layout in found:
                if layout is None and tid in (2, 3):
                    dec.withdraw_all("ipfix", exporter, options=tid == 3)
                else:
                    dec.set_template("ipfix", exporter, tid, layout)
            if err:
                dec.reject(f"ipfix: {err}", data)
        else:
            dec.reject("ipfix: reserved set id", data)
        pos += set_len
