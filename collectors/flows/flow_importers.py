"""Importers (``rankscope ingest``) for flow export files; registered in collectors/formats.py.

``ipfix_file`` (RFC 5655), ``netflow9_file`` (NetFlow v9 packets back to back), ``flow_pcap`` (pcap/pcapng of IPFIX, NetFlow or
sFlow export traffic), ``nfdump_csv`` and ``nfdump_json``. Binary inputs go
through the same :class:`FlowDecoder` as the live collector and come out in
batches of at most ``CHUNK_RECORDS`` records, so a large capture never sits
in memory whole; undecodable parts are counted by reason with a hex sample.
"""

from __future__ import annotations

from pathlib import Path

from rankscope.collectors.flows import flow_files, netflow9, template_state
from rankscope.collectors.flows.flow_decoder import FlowDecoder
from rankscope.collectors.importers.contract import (
    ImportBatch,
    ImportOptions,
    check_size,
    is_gzip,
    open_maybe_gzip,
)

CHUNK_RECORDS = 32_768
"""Records decoded before they are handed on as one batch (ingest validates and writes each batch on its
own, so this, not the file's size, bounds an import's memory: about 1 KB a record while it is held)."""


def _batch(dec: FlowDecoder, final: bool, reported: dict) -> ImportBatch:
    batch = ImportBatch()
    for kind, table in dec.flush(final=final).items():
        batch.add(kind, table)
    for reason, n in dec.rejects.items():
        new = n - reported.get(reason, 0)
        if new:
            batch.reject(reason, dec.samples.get(reason, [None])[0], count=new)
            reported[reason] = n
    return batch


def _decode(datagrams, dec: FlowDecoder):
    reported: dict = {}
    for payload, addr, ts in datagrams:
        dec.feed(payload, addr, ts)
        if dec.buffered_records >= CHUNK_RECORDS:
            yield _batch(dec, False, reported)
    last = _batch(dec, True, reported)
    if dec.hold_waiting:
        # Data sets whose template has not come yet stay in the store's template state
        # (decoded by the file that brings it); noted, not rejected.
        last.notes["flow_sets_held_for_template"] = dec.held_sets
        template_state.remember(dec)
    yield last


class _IpfixFile:
    name = "ipfix_file"
    source = "ipfix"

    def sniff(self, path: Path, head: bytes) -> bool:
        return flow_files.looks_like_ipfix_file(head)

    def read(self, path: Path, opts: ImportOptions):
        dec = template_state.new_decoder()
        if not is_gzip(path):
            # read message by message: a plain file's memory is one message plus a batch of records
            check_size(path)
            return _decode(flow_files.ipfix_stream_messages(path, dec), dec)
        with open_maybe_gzip(path) as f:
            data = f.read()
        return _decode(flow_files.ipfix_file_messages(data, dec), dec)


class _Netflow9File:
    name = "netflow9_file"
    source = "netflow9"

    def sniff(self, path: Path, head: bytes) -> bool:
        return netflow9.looks_like_stream(head)

    def read(self, path: Path, opts: ImportOptions):
        dec = template_state.new_decoder()
        check_size(path)
        with open_maybe_gzip(path) as f:
            data = f.read()
        return _decode(netflow9.stream_packets(data, dec), dec)


class _FlowCapture:
    name = "flow_pcap"
    source = "ipfix"

    def sniff(self, path: Path, head: bytes) -> bool:
        return head[:4] in flow_files.PCAP_MAGICS or head[:4] == flow_files.PCAPNG_MAGIC

    def read(self, path: Path, opts: ImportOptions):
        dec = template_state.new_decoder()
        return _decode(flow_files.capture_datagrams(path, dec), dec)


class _NfdumpCsv:
    name = "nfdump_csv"
    source = "nfdump"

    def sniff(self, path: Path, head: bytes) -> bool:
        return head.startswith(flow_files.NFDUMP_CSV_HEADER.encode())

    def read(self, path: Path, opts: ImportOptions) -> ImportBatch:
        with open_maybe_gzip(path) as f:
            text = f.read().decode("utf-8", "replace")
        df, bad = flow_files.read_nfdump_csv(path, text, opts.extra)
        batch = ImportBatch()
        batch.add("flow", df)
        if bad:
            batch.reject("nfdump csv: wrong number of fields", count=bad)
        return batch


class _NfdumpJson:
    name = "nfdump_json"
    source = "nfdump"

    def sniff(self, path: Path, head: bytes) -> bool:
        start = head.lstrip()[:1]
        return start == b"[" and b'"type"' in head[:4096] and (b'"in_bytes"' in head or b"_router" in head)

    def read(self, path: Path, opts: ImportOptions) -> ImportBatch:
        with open_maybe_gzip(path) as f:
            text = f.read().decode("utf-8", "replace")
        batch = ImportBatch()
        batch.add("flow", flow_files.read_nfdump_json(path, text, opts.extra))
        return batch


IPFIX_FILE = _IpfixFile()
NETFLOW9_FILE = _Netflow9File()
FLOW_PCAP = _FlowCapture()
NFDUMP_CSV = _NfdumpCsv()
NFDUMP_JSON = _NfdumpJson()
