"""Column-wise decoding of flow records laid out by a template.

A template (IPFIX, NetFlow v9, or the fixed NetFlow v5 record) becomes a
:class:`Layout`: a numpy structured dtype with one big-endian field per element
rankscope reads, at its byte offset, and every other element skipped. The data
sets of many messages that share one layout are joined and decoded with one
``np.frombuffer``; times, addresses and sampling are then converted as whole
columns. Only templates with variable-length fields fall back to a Python loop
per record (exporters rarely send them for flow records).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections import Counter

import numpy as np
import pyarrow as pa

from rankscope.collectors.flows import ipfix_elements as ie
from rankscope.collectors.record_class import record

VARIABLE = 65535
_INT_FORMATS = {1: ">u1", 2: ">u2", 4: ">u4", 8: ">u8"}


@record
class Field:
    """One template field; ``element`` is -1 for fields rankscope skips (enterprise, scope)."""

    element: int
    length: int


class Layout:
    """A template's record layout, ready for column-wise decoding (identity-hashed)."""

    __slots__ = ("fields", "template_id", "scope_count", "record_length", "min_length", "dtype", "elements")

    def __init__(self, fields: list[Field], template_id: int, scope_count: int = 0):
        self.fields = tuple(fields)
        self.template_id = template_id
        self.scope_count = scope_count
        variable = any(f.length == VARIABLE for f in fields)
        self.min_length = sum(1 if f.length == VARIABLE else f.length for f in fields)
        self.record_length = None if variable else self.min_length
        self.elements: dict[int, tuple[str, int]] = {}
        names, formats, offsets, off = [], [], [], 0
        for f in fields:
            kind = ie.kind_of(f.element) if f.element not in ie.NOT_DECODED else None
            fmt = _element_format(kind, f.length)
            if fmt is not None and f.element not in self.elements:
                self.elements[f.element] = (f"e{f.element}", f.length)
                if not variable:
                    names.append(f"e{f.element}")
                    formats.append(fmt)
                    offsets.append(off)
            off += 0 if f.length == VARIABLE else f.length
        self.dtype = None if variable or not self.min_length else np.dtype(
            {"names": names, "formats": formats, "offsets": offsets, "itemsize": self.min_length})

    def __repr__(self) -> str:
        return f"Layout(template {self.template_id}, {len(self.fields)} fields, length {self.record_length})"


_LAYOUTS: dict[tuple, Layout] = {}
_MAX_CACHED_LAYOUTS = 4096


def layout_for(fields: list[Field], template_id: int, scope_count: int = 0) -> Layout:
    """A Layout, shared between identical templates (exporters resend theirs every few seconds)."""
    key = (tuple(fields), template_id, scope_count)
    layout = _LAYOUTS.get(key)
    if layout is None:
        if len(_LAYOUTS) >= _MAX_CACHED_LAYOUTS:
            _LAYOUTS.clear()  # bounded: garbage templates (fuzzing, broken exporters) cannot grow it
        layout = _LAYOUTS[key] = Layout(fields, template_id, scope_count)
    return layout


def _element_format(kind: str | None, length: int):
    if kind is None or length == VARIABLE:
        return None
    if kind == "ipv4":
        return ">u4" if length == 4 else None
    if kind == "ipv6":
        return "V16" if length == 16 else None
    if kind == "ntp":
        return ">u8" if length == 8 else None
    if 1 <= length <= 8:  # reduced-size encoding (RFC 7011 6.2) keeps the value, big-endian
        return _INT_FORMATS.get(length, ("u1", (length,)))
    return None


def _as_u64(col: np.ndarray) -> np.ndarray:
    if col.ndim == 2:  # reduced-size integer of 3, 5, 6 or 7 bytes
        out = np.zeros(col.shape[0], dtype=np.uint64)
        for i in range(col.shape[1]):
            out = (out << np.uint64(8)) | col[:, i].astype(np.uint64)
        return out
    # Native byte order at the field's own width: later casts are then cheap.
    return col.astype(col.dtype.newbyteorder("=")) if col.dtype.kind == "u" else col


def decode_fixed(layout: Layout, data: bytes) -> dict[int, np.ndarray]:
    """Element id -> column, for whole records of a fixed layout packed back to back."""
    arr = np.frombuffer(data, dtype=layout.dtype, count=len(data) // layout.record_length)
    return {e: (arr[name] if ie.kind_of(e) == "ipv6" else _as_u64(arr[name]))
            for e, (name, _) in layout.elements.items()}


def decode_variable(layout: Layout, data: bytes | memoryview) -> tuple[dict[int, list], int, bool]:
    """Records of a layout with variable-length fields, one at a time (RFC 7011 7).

    Returns (element id -> values, record count, True when the set overran).
    Trailing bytes shorter than the minimal record are padding.
    """
    values: dict[int, list] = {e: [] for e in layout.elements}
    pos, end, n = 0, len(data), 0
    while end - pos >= max(layout.min_length, 1):
        rec: dict[int, bytes] = {}
        for f in layout.fields:
            length = f.length
            if length == VARIABLE:
                if pos >= end:
                    return values, n, True
                length = data[pos]
                pos += 1
                if length == 255:
                    if pos + 2 > end:
                        return values, n, True
                    length = struct.unpack_from(">H", data, pos)[0]
                    pos += 2
            if pos + length > end:
                return values, n, True
            if f.element in values and f.element not in rec:
                rec[f.element] = bytes(data[pos:pos + length])
            pos += length
        for e, col in values.items():
            col.append(rec.get(e))
        n += 1
    return values, n, False


def variable_columns(values: dict[int, list]) -> dict[int, np.ndarray]:
    """Turn decode_variable's byte strings into the same columns decode_fixed gives."""
    out = {}
    for e, col in values.items():
        kind = ie.kind_of(e)
        if kind == "ipv6":
            out[e] = np.array([v if v is not None and len(v) == 16 else bytes(16) for v in col], dtype="V16")
        elif kind == "ipv4":
            out[e] = np.array([int.from_bytes(v, "big") if v is not None and len(v) == 4 else 0
                               for v in col], dtype=np.uint64)
        else:
            out[e] = np.array([int.from_bytes(v[:8], "big") if v else 0 for v in col], dtype=np.uint64)
    return out


# ------------------------------------------------------------ accumulation
class Pending:
    """Data records waiting to be turned into a table, grouped by layout.

    Context per chunk (one data set): exporter index, export time (s), the
    epoch milliseconds at which the exporter's sysUpTime was zero (-1 when
    unknown), the sampling rate in force (0 = unknown) and the source index.
    """

    def __init__(self):
        self.fixed: dict[Layout, tuple[list, list, list]] = {}
        self.decoded: list[tuple[Layout, dict[int, np.ndarray], int, tuple]] = []
        self.records = 0

    def add_fixed(self, layout: Layout, data, n: int, ctx: tuple) -> None:
        parts, counts, ctxs = self.fixed.setdefault(layout, ([], [], []))
        parts.append(data)
        counts.append(n)
        ctxs.append(ctx)
        self.records += n

    def add_decoded(self, layout: Layout, cols: dict[int, np.ndarray], n: int, ctx: tuple) -> None:
        self.decoded.append((layout, cols, n, ctx))
        self.records += n

    def drain(self):
        """Yield (layout, columns, n, context columns) and empty the buffer."""
        fixed, decoded = self.fixed, self.decoded
        self.fixed, self.decoded, self.records = {}, [], 0
        for layout, (parts, counts, ctxs) in fixed.items():
            cols = decode_fixed(layout, b"".join(parts))
            yield layout, cols, sum(counts), _repeat_ctx(ctxs, counts)
        for layout, cols, n, ctx in decoded:
            yield layout, cols, n, _repeat_ctx([ctx], [n])


def _repeat_ctx(ctxs: list[tuple], counts: list[int]) -> dict[str, np.ndarray]:
    c = np.asarray(ctxs, dtype=np.int64).reshape(len(ctxs), -1)
    k = np.asarray(counts)
    return {name: np.repeat(c[:, i], k) for i, name in enumerate(("exporter", "export_s", "base_ms", "rate",
                                                                   "source"))}


# ----------------------------------------------------------- flow columns
def ipv4_strings(col: np.ndarray) -> pa.Array:
    # Hash-encode first: a fabric has few endpoints, so only the distinct ones are formatted.
    enc = pa.array(col.astype(np.uint32, copy=False)).dictionary_encode()
    texts = pa.array([socket.inet_ntoa(int(u).to_bytes(4, "big")) for u in enc.dictionary.to_numpy()],
                     pa.string())
    return texts.take(enc.indices)


def ipv6_strings(col: np.ndarray) -> pa.Array:
    raw = np.ascontiguousarray(col).view(np.uint8)
    arr = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(col), [None, pa.py_buffer(raw.tobytes())])
    enc = arr.dictionary_encode()
    texts = pa.array([str(ipaddress.IPv6Address(u)) for u in enc.dictionary.to_pylist()], pa.string())
    return texts.take(enc.indices)


def _first(cols: dict, ids: tuple[int, ...]):
    for i in ids:
        if i in cols:
            return i, cols[i]
    return None, None


INT64_MAX = np.iinfo(np.int64).max
INT32_MAX = np.iinfo(np.int32).max
TCP_FLAG_BITS = 0x0FFF
"""The flag bits of tcpControlBits (NS 0x100 and up to FIN 0x01): RFC 7125 leaves the TCP header's data
offset in the top 4 bits of its 16-bit encoding and tells collectors to ignore them."""
_NS_PER_UNIT = {152: 1_000_000, 153: 1_000_000, 150: 1_000_000_000, 151: 1_000_000_000, 158: 1000, 159: 1000}


def _time_ns(element: int, v: np.ndarray, ctx: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(epoch ns, mask of values whose time does not fit int64 nanoseconds, i.e. after 2262)."""
    if element in (154, 155, 156, 157):
        v = v.astype(np.uint64)
        sec = (v >> np.uint64(32)).astype(np.int64) - ie.NTP_UNIX_OFFSET_S
        frac = ((v & np.uint64(0xFFFFFFFF)) * np.uint64(1_000_000_000)) >> np.uint64(32)
        return sec * 1_000_000_000 + frac.astype(np.int64), np.zeros(len(v), bool)
    u = v.astype(np.uint64)
    if element in (21, 22):  # base_ms is below year 2500 (checked where it is set): no int64 overflow here
        total_ms = ctx["base_ms"] + np.minimum(u, np.uint64(1 << 53)).astype(np.int64)
        over = total_ms > INT64_MAX // 1_000_000
        return np.where(over, 0, total_ms) * 1_000_000, over
    scale = _NS_PER_UNIT[element]
    over = u > np.uint64(INT64_MAX // scale)
    ns = np.where(over, 0, u).astype(np.int64) * scale
    if element in (158, 159):  # microseconds before export
        return ctx["export_s"] * 1_000_000_000 - ns, over
    return ns, over


def _checked(col, name: str, limit: int, keep: np.ndarray, rejects: Counter) -> np.ndarray:
    """An unsigned element column as int64; rows whose value exceeds ``limit`` (the column's type) are
    counted and dropped rather than wrapped into a wrong number."""
    u = col.astype(np.uint64, copy=False)
    over = u > np.uint64(limit)
    if over.any():
        count = int((over & keep).sum())
        if count:
            rejects[f"{name} beyond the {'int64' if limit == INT64_MAX else 'int32'} column"] += count
        keep &= ~over
        u = np.where(over, 0, u)
    return u.astype(np.int64)


def scaled_estimate(value: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """value * sampling rate, saturated at 2^63-1 instead of wrapping (rate >= 1)."""
    over = value > INT64_MAX // rate
    return np.where(over, INT64_MAX, value * np.where(over, 1, rate))


def flow_columns(cols: dict[int, np.ndarray], n: int, ctx: dict[str, np.ndarray], exporters: list[str],
                 sources: list[str], selector_rates: dict[tuple[int, int], int],
                 rejects: Counter) -> pa.Table | None:
    """Flow-kind columns from decoded elements; rows that cannot be placed in time are counted out.

    Needs: element columns (decode_fixed / variable_columns) and the context
    columns of :class:`Pending`. Returns a table with the flow kind's column
    names (job left null for the caller) or None when no row is usable.
    """
    if n == 0:
        return None
    keep = np.ones(n, dtype=bool)
    if ie.SRC_V4 in cols or ie.DST_V4 in cols:
        src = ipv4_strings(cols.get(ie.SRC_V4, np.zeros(n, np.uint32)))
        dst = ipv4_strings(cols.get(ie.DST_V4, np.zeros(n, np.uint32)))
    elif ie.SRC_V6 in cols or ie.DST_V6 in cols:
        src = ipv6_strings(cols.get(ie.SRC_V6, np.zeros(n, "V16")))
        dst = ipv6_strings(cols.get(ie.DST_V6, np.zeros(n, "V16")))
    else:
        rejects["flow record without IP addresses"] += n
        return None
    start_e, start_v = _first(cols, ie.START_TIMES)
    end_e, end_v = _first(cols, ie.END_TIMES)
    start = end = None
    for e, v in ((start_e, start_v), (end_e, end_v)):
        if e is None:
            continue
        t, over = _time_ns(e, v, ctx)
        if (over & keep).any():
            rejects[f"{ie.ELEMENTS[e][0]} beyond the int64 nanosecond range"] += int((over & keep).sum())
            keep &= ~over
        if e == start_e:
            start = t
        else:
            end = t
    for e in (start_e, end_e):
        if e in (21, 22):
            unknown = ctx["base_ms"] < 0
            if unknown.any():
                rejects["sysUpTime-relative time without systemInitTimeMilliseconds"] += int((unknown & keep).sum())
                keep &= ~unknown
    if start is None and end is None:
        start = end = ctx["export_s"] * 1_000_000_000
    start = end if start is None else start
    end = start if end is None else end
    rate = ctx["rate"].copy()
    sel_e, sel_v = _first(cols, ie.SELECTOR)
    if sel_e is not None and selector_rates:
        for (exp, sel), r in selector_rates.items():
            rate[(ctx["exporter"] == exp) & (sel_v == sel)] = r
    samp_e, samp_v = _first(cols, ie.SAMPLING)
    if samp_e is not None:
        rec_rate = np.minimum(samp_v.astype(np.uint64), np.uint64(1 << 32)).astype(np.int64)
        if samp_e == 305 and 306 in cols:
            rec_rate = np.where(rec_rate > 0, (rec_rate + cols[306].astype(np.int64)) // np.maximum(rec_rate, 1), 0)
        rate = np.where(rec_rate > 0, rec_rate, rate)
    rate = np.where(rate > 0, rate, 1)
    oct_e, octets = _first(cols, ie.OCTETS)
    pkt_e, packets = _first(cols, ie.PACKETS)
    if octets is None:
        rejects["flow record without an octet count"] += int(keep.sum())
        return None
    size = _checked(octets, ie.ELEMENTS[oct_e][0], INT64_MAX, keep, rejects)
    pkts = _checked(packets, ie.ELEMENTS[pkt_e][0], INT64_MAX, keep, rejects) if packets is not None else None
    vlan_e, vlan = _first(cols, ie.VLAN)

    def i32(e):
        return None if e not in cols else _checked(cols[e], ie.ELEMENTS[e][0], INT32_MAX, keep, rejects)

    def i64(e):
        return None if e not in cols else _checked(cols[e], ie.ELEMENTS[e][0], INT64_MAX, keep, rejects)

    sport, dport, proto = i32(7), i32(11), i32(4)
    flags = i32(6)  # tcpControlBits; NetFlow v9 TCP_FLAGS and the v5 record's byte share the id
    in_if, out_if = i64(10), i64(14)
    vlan = None if vlan is None else _checked(vlan, ie.ELEMENTS[vlan_e][0], INT64_MAX, keep, rejects)
    table = pa.table({
        "exporter": pa.array(exporters, pa.string()).take(pa.array(ctx["exporter"].astype(np.int32))),
        "src_addr": src, "dst_addr": dst,
        "src_port": _opt_i32(sport, n), "dst_port": _opt_i32(dport, n),
        "protocol": _opt_i32(proto, n),
        "size_bytes": size, "num_packets": pkts if pkts is not None else pa.nulls(n, pa.int64()),
        "start_ns": start.astype(np.int64), "end_ns": end.astype(np.int64),
        "sampling_rate": rate.astype(np.int64),
        "source": pa.array(sources, pa.string()).take(pa.array(ctx["source"].astype(np.int32))),
        "est_size_bytes": scaled_estimate(size, rate),
        "est_num_packets": scaled_estimate(pkts, rate) if pkts is not None else pa.nulls(n, pa.int64()),
        "vlan": _opt_i64(vlan, n),
        "input_if": _opt_i64(in_if, n), "output_if": _opt_i64(out_if, n),
        "tcp_flags": _opt_i32(None if flags is None else flags & TCP_FLAG_BITS, n),
    })
    return table if keep.all() else table.filter(pa.array(keep))


def _opt_i32(col, n: int):
    """Values already checked against the int32 range (see _checked)."""
    if col is None:
        return pa.nulls(n, pa.int32())
    return col.astype(np.int32)


def _opt_i64(col, n: int):
    return pa.nulls(n, pa.int64()) if col is None else col.astype(np.int64)
