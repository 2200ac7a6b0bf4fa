"""Flow records written as RFC 5655 IPFIX files, column-wise: what an exporter's collector would have saved.

For benchmarks that must decode exporter files rather than find records already in a store
(benchmarks/bench_ray_capture.py). Records become fixed-layout data records of two templates (with and
without tcpControlBits, as flows without TCP carry none), packed with numpy structured arrays, many records
per message: no Python work per record, so 100 M records encode in minutes. Times go as
flowStart/EndNanoseconds (NTP format, rounded up so that the decoder's floor gives the nanosecond back),
addresses as IPv4. The exporter becomes the file's observation domain: decoded, its name is ``file/<domain>``.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import polars as pl

NTP_UNIX_OFFSET_S = 2_208_988_800
RECORDS_PER_MESSAGE = 1000
"""45-46 bytes a record: a message of 1000 stays under IPFIX's 65,535-byte limit."""
TID_FLAGS, TID_PLAIN = 256, 257
_FIELDS = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (156, 8), (157, 8)]
_DTYPE = [("src", ">u4"), ("dst", ">u4"), ("sport", ">u2"), ("dport", ">u2"), ("proto", "u1"), ("octets", ">u8"),
          ("packets", ">u8"), ("start", ">u8"), ("end", ">u8")]
TEMPLATES = {TID_FLAGS: [*_FIELDS, (6, 1)], TID_PLAIN: _FIELDS}
DTYPES = {TID_FLAGS: np.dtype([*_DTYPE, ("flags", "u1")]), TID_PLAIN: np.dtype(_DTYPE)}
_HEADER = np.dtype([("version", ">u2"), ("length", ">u2"), ("export_s", ">u4"), ("seq", ">u4"), ("domain", ">u4"),
                    ("set_id", ">u2"), ("set_length", ">u2")])


def ipv4_u32(col: pl.Series) -> np.ndarray:
    """Dotted IPv4 text as big-endian-ready unsigned 32-bit numbers."""
    parts = col.str.split_exact(".", 3).struct.unnest().cast(pl.UInt32)
    a, b, c, d = (parts[name].to_numpy() for name in parts.columns)
    return (a << 24) | (b << 16) | (c << 8) | d


def ntp_u64(ns: np.ndarray) -> np.ndarray:
    """Epoch nanoseconds as NTP timestamps; the fraction rounded up, so floor(frac * 1e9 / 2^32) is ns again."""
    ns = ns.astype(np.int64)
    sec = (ns // 1_000_000_000 + NTP_UNIX_OFFSET_S).astype(np.uint64)
    frac = ((ns % 1_000_000_000).astype(np.uint64) << np.uint64(32)) + np.uint64(999_999_999)
    return (sec << np.uint64(32)) | (frac // np.uint64(1_000_000_000))


def records(flow: pl.DataFrame) -> dict[int, np.ndarray]:
    """Template id -> packed data records of the flow rows (columns of the flow kind) that use it."""
    out = {}
    for tid, rows in ((TID_FLAGS, flow.filter(pl.col("tcp_flags").is_not_null())),
                      (TID_PLAIN, flow.filter(pl.col("tcp_flags").is_null()))):
        rec = np.zeros(rows.height, DTYPES[tid])
        rec["src"], rec["dst"] = ipv4_u32(rows["src_addr"]), ipv4_u32(rows["dst_addr"])
        for name, col in (("sport", "src_port"), ("dport", "dst_port"), ("proto", "protocol"),
                          ("octets", "size_bytes"), ("packets", "num_packets")):
            rec[name] = rows[col].fill_null(0).to_numpy()
        rec["start"], rec["end"] = ntp_u64(rows["start_ns"].to_numpy()), ntp_u64(rows["end_ns"].to_numpy())
        if tid == TID_FLAGS:
            rec["flags"] = rows["tcp_flags"].to_numpy()
        out[tid] = rec
    return out


def template_message(domain: int, export_s: int) -> bytes:
    """One message of both templates for an observation domain (sent first in every file, as exporters do)."""
    body = b"".join(struct.pack(">HH", tid, len(fields)) + b"".join(struct.pack(">HH", e, n) for e, n in fields)
                    for tid, fields in TEMPLATES.items())
    return struct.pack(">HHIIIHH", 10, 20 + len(body), export_s, 0, domain, 2, 4 + len(body)) + body


def data_messages(rec: np.ndarray, tid: int, domain: int, seq0: int = 0) -> bytes:
    """The records as messages of RECORDS_PER_MESSAGE data records (the last one shorter), back to back;
    each message's export time is its last record's end second."""
    n, size = len(rec), rec.dtype.itemsize
    if n == 0:
        return b""
    starts = np.arange(0, n, RECORDS_PER_MESSAGE)
    counts = np.minimum(RECORDS_PER_MESSAGE, n - starts)
    head = np.zeros(len(starts), _HEADER)
    head["version"], head["domain"], head["set_id"] = 10, domain, tid
    head["length"] = 20 + counts * size
    head["set_length"] = 4 + counts * size
    head["seq"] = seq0 + starts
    head["export_s"] = (rec["end"][starts + counts - 1] >> np.uint64(32)) - np.uint64(NTP_UNIX_OFFSET_S)
    raw = rec.view(np.uint8).reshape(n, size)
    full = n // RECORDS_PER_MESSAGE
    out = np.concatenate([head[:full].view(np.uint8).reshape(full, 20),
                          raw[:full * RECORDS_PER_MESSAGE].reshape(full, RECORDS_PER_MESSAGE * size)], axis=1).tobytes()
    if full < len(starts):
        out += head[full:].tobytes() + raw[full * RECORDS_PER_MESSAGE:].tobytes()
    return out


def write_file(path: Path, domains: list[tuple[int, pl.DataFrame]]) -> int:
    """An RFC 5655 file of each (observation domain, flow rows): the domain's templates, then its records;
    the number of records written."""
    written = 0
    with open(path, "wb") as f:
        for domain, flow in domains:
            first = int(flow["start_ns"].min() // 1_000_000_000) if flow.height else 0
            f.write(template_message(domain, first))
            seq = 0
            for tid, rec in records(flow).items():
                f.write(data_messages(rec, tid, domain, seq))
                seq += len(rec)
            written += flow.height
    return written
