"""Corrupt capture lengths: a clear per-file reject, never a traceback or a giant allocation."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import dpkt

from rankscope.collectors.flows.flow_decoder import FlowDecoder
from rankscope.collectors.flows.flow_files import capture_datagrams
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.store import Store
from tests.unit.collectors.flow_builders import ethernet_ipv4_udp, nf5_packet

HUGE = 0xF0000000
V5 = nf5_packet([{"src": "10.0.0.1", "dst": "10.0.0.2", "packets": 1, "bytes": 100, "first": 1, "last": 2,
                  "sport": 1, "dport": 2, "proto": 6}], uptime_ms=10, unix_s=1_700_000_000)


def _pcap(path: Path, good: int, big: bool = False) -> Path:
    e = ">" if big else "<"
    out = struct.pack(e + "IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    frame = ethernet_ipv4_udp("198.51.100.1", "192.0.2.1", 5000, 2055, V5)
    for i in range(good):
        out += struct.pack(e + "IIII", 1_700_000_000 + i, 0, len(frame), len(frame)) + frame
    out += struct.pack(e + "IIII", 1_700_000_100, 0, HUGE, HUGE) + b"\0" * 64
    path.write_bytes(out)
    return path


def test_huge_incl_len_after_good_packets_keeps_them_and_counts_the_rest(tmp_path):
    store = Store(tmp_path / "st")
    s = ingest(store, [_pcap(tmp_path / "a.pcap", good=3)])
    f = s.files[0]
    assert f.status == "ingested" and f.records == {"flow": 3}
    (reason,) = [r for r in f.rejects if "snap length" in r]
    assert f.rejects[reason] == 1 and "corrupt capture" in reason


def test_huge_incl_len_first_is_a_clear_per_file_failure_and_other_files_still_ingest(tmp_path):
    bad = _pcap(tmp_path / "bad.pcap", good=0, big=True)
    good = _pcap(tmp_path / "good.pcap", good=2)
    s = ingest(Store(tmp_path / "st"), [bad, good])
    by = {Path(f.path).name: f for f in s.files}
    assert by["bad.pcap"].status == "failed" and not by["bad.pcap"].unexpected
    assert "bad.pcap" in by["bad.pcap"].error and "snap length" in by["bad.pcap"].error
    assert by["good.pcap"].records == {"flow": 2}


def test_no_allocation_follows_a_corrupt_length(tmp_path):
    for name, path in (("pcap", _pcap(tmp_path / "c.pcap", good=1)), ("pcapng", _pcapng_huge_block(tmp_path))):
        dec = FlowDecoder()
        tracemalloc.start()
        for payload, addr, ts in capture_datagrams(path, dec):
            dec.feed(payload, addr, ts)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 16 << 20, (name, peak)
        assert sum(dec.rejects.values()) >= 1, name


def _pcapng_huge_block(tmp_path: Path) -> Path:
    p = tmp_path / "d.pcapng"
    with open(p, "wb") as f:
        w = dpkt.pcapng.Writer(f)
        w.writepkt(ethernet_ipv4_udp("198.51.100.1", "192.0.2.1", 5000, 2055, V5), ts=1_700_000_000)
    data = p.read_bytes() + struct.pack("<II", 6, HUGE) + b"\0" * 64  # an enhanced packet block claiming 4 GB
    p.write_bytes(data)
    return p
