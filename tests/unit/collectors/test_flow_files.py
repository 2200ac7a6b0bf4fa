"""Flow files through `rankscope ingest`: IPFIX files, pcap/pcapng, nfdump CSV/JSON, and broken files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from rankscope.collectors.flows.flow_files import tcp_flags_value
from rankscope.collectors.importers import contract
from rankscope.collectors.ingest import registry
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.store import Store

FIXTURES = Path(__file__).parent / "fixtures"
NETNS_GLOO = Path(__file__).resolve().parents[2] / "data" / "netns_gloo"
KEY = ["src_addr", "dst_addr", "protocol", "size_bytes", "num_packets"]


def _ingest(tmp_path, *names, **kw):
    store = Store(tmp_path / "st")
    summary = ingest(store, [FIXTURES / n if isinstance(n, str) else n for n in names],
                     opts=contract.ImportOptions(**kw))
    return store, summary


def test_detection():
    assert registry.detect(FIXTURES / "softflowd.ipfix") == "ipfix_file"
    assert registry.detect(FIXTURES / "softflowd_nf9.pcap") == "flow_pcap"
    assert registry.detect(FIXTURES / "nfdump_softflowd.csv") == "nfdump_csv"
    assert registry.detect(FIXTURES / "nfdump_softflowd.json") == "nfdump_json"


def test_ipfix_file_pcap_and_nfdump_agree(tmp_path):
    store, summary = _ingest(tmp_path, "softflowd.ipfix", "softflowd_ipfix.pcap", "nfdump_softflowd.csv",
                             "nfdump_softflowd.json", extra={"tz_offset_s": "0"})
    assert [f.status for f in summary.files] == ["ingested"] * 4, [f.error for f in summary.files]
    df = store.read("flow")
    assert set(df["job"]) == {"fabric"}  # flows default to the capture name 'fabric'
    by_format = {}
    for f in summary.files:
        assert f.records == {"flow": 11}
    for src, part in df.group_by("source"):
        by_format[src[0]] = part
    assert set(by_format) == {"ipfix", "nfdump"}
    ipfix = by_format["ipfix"].select(KEY).sort(KEY)
    nfdump = by_format["nfdump"].select(KEY).sort(KEY)
    assert ipfix.height == 22 and nfdump.height == 22
    assert ipfix.to_dicts() == nfdump.to_dicts()
    # The CSV's start has whole seconds only; the JSON's has milliseconds.
    csv = by_format["nfdump"].filter(pl.col("start_ns") % 1_000_000_000 == 0)
    assert csv.height >= 11


def test_pcapng_is_read_like_pcap(tmp_path):
    import dpkt

    out = tmp_path / "export.pcapng"
    with open(FIXTURES / "softflowd_nf9.pcap", "rb") as f, open(out, "wb") as g:
        w = dpkt.pcapng.Writer(g, linktype=dpkt.pcap.DLT_EN10MB)
        for ts, frame in dpkt.pcap.Reader(f):
            w.writepkt(frame, ts)
    store, summary = _ingest(tmp_path, out, job="leaf1")
    assert summary.files[0].format == "flow_pcap" and summary.files[0].status == "ingested"
    df = store.read("flow", "leaf1")
    assert df.filter(pl.col("dst_port") == 5001)["size_bytes"].to_list() == [238612]


def test_truncated_ipfix_file_keeps_whole_messages_and_counts_the_rest(tmp_path):
    data = (FIXTURES / "softflowd.ipfix").read_bytes()
    p = tmp_path / "cut.ipfix"
    p.write_bytes(data[:-30])
    store, summary = _ingest(tmp_path, p)
    res = summary.files[0]
    assert res.status == "ingested"
    assert res.rejects["ipfix file: message length runs past the end of the file"] == 1
    assert 0 < res.records["flow"] < 11


def test_broken_pcap_is_one_failed_file_with_a_named_reason(tmp_path):
    p = tmp_path / "broken.pcap"
    p.write_bytes(b"\xd4\xc3\xb2\xa1" + b"\x00" * 6)
    good = tmp_path / "good.pcap"
    shutil.copy(FIXTURES / "softflowd_nf5.pcap", good)
    _, summary = _ingest(tmp_path, p, good)
    bad, ok = summary.files
    assert bad.status == "failed" and "broken.pcap" in bad.error and "pcap" in bad.error
    assert ok.status == "ingested" and ok.records["flow"] == 4


def test_nfdump_csv_bad_rows_counted(tmp_path):
    lines = (FIXTURES / "nfdump_softflowd.csv").read_text().splitlines()
    lines.insert(2, "2026-12-02 13:40:42,oops")
    p = tmp_path / "nf.csv"
    p.write_text("\n".join(lines) + "\n")
    store, summary = _ingest(tmp_path, p)
    res = summary.files[0]
    assert res.format == "nfdump_csv"
    assert res.rejects["nfdump csv: wrong number of fields"] == 1
    assert res.records["flow"] == 11


def test_nfdump_json_of_flows_nfdump_metered_itself_loads_with_the_files_exporter(tmp_path):
    # nfpcapd (nfdump metering an interface) writes no router address: every record had been rejected
    # for a null exporter. A real capture of a 4-stage gloo pipeline (tests/data/netns_gloo/SOURCE.md)
    path = Path(__file__).resolve().parents[2] / "data" / "netns_gloo" / "pp4_nfpcapd.nfdump.json"
    assert registry.detect(path) == "nfdump_json"
    store, summary = _ingest(tmp_path, path, extra={"tz_offset_s": "0"})
    (f,) = summary.files
    assert f.status == "ingested" and f.records == {"flow": 49}, f
    df = store.read("flow")
    assert set(df["exporter"]) == {"file/0"}
    tcp = df.filter((pl.col("protocol") == 6) & pl.col("src_addr").str.starts_with("10.213."))
    assert tcp.height > 20 and (tcp["end_ns"] >= tcp["start_ns"]).all()
    # each link's record closes as the processes exit: '...AP.SF' (0x1B) on 24 of the 30, RST on 3
    assert (tcp["tcp_flags"] & 0x01 != 0).sum() == 24 and (tcp["tcp_flags"] & 0x04 != 0).sum() == 3
    # milliseconds, as nfdump prints them
    assert (tcp["start_ns"] % 1_000_000 == 0).all()


@pytest.mark.parametrize("spelling,value", [
    ("...AP.SF", 0x1B), ("........", 0), ("...A.R..", 0x14), ("CEUAPRSF", 0xFF),  # nfdump 1.7
    (".A..S.", 0x12), ("  0xc2", 0xC2),  # nfdump 1.6: six letters, hex above 63
    ("27", 27), ("0x112", 0x112),
    ("A.....S.", None), ("SA", None), ("...AP.SF.", None), ("0x", None), ("0x1000", None), ("", None),
    ("garbage", None), ("-1", None),
])
def test_nfdump_tcp_flags_spellings(spelling, value):
    assert tcp_flags_value(spelling) == value


def test_nfdump_json_tcp_flags_of_a_real_gloo_capture(tmp_path):
    """DP2 x PP2 x TP2 under nfpcapd (tests/data/netns_gloo/SOURCE.md): the gloo connections were closed
    at exit, so half the TCP records carry FIN; the others are the opening halves (SYN) cut by nfpcapd."""
    store, summary = _ingest(tmp_path, NETNS_GLOO / "dp2pp2tp2_nfpcapd.nfdump.json", extra={"tz_offset_s": "0"})
    (f,) = summary.files
    assert f.status == "ingested" and f.records == {"flow": 174}, f
    df = store.read("flow")
    tcp = df.filter(pl.col("protocol") == 6)
    assert dict(tcp.group_by("tcp_flags").len().rows()) == {
        0x02: 2, 0x11: 28, 0x12: 27, 0x14: 2, 0x19: 46, 0x1A: 47}  # as nfdump spelled them, e.g. '...AP..F'
    assert (tcp["tcp_flags"] & 0x01 != 0).sum() == 74
    assert df.filter(pl.col("protocol") == 58)["tcp_flags"].null_count() == 16  # nfdump prints none for ICMP


def test_nfdump_tcp_flags_bad_spelling_is_null_and_the_record_kept(tmp_path):
    base = {"type": "FLOW", "first": "2026-12-05T13:48:00.000", "last": "2026-12-05T13:48:01.000",
            "in_packets": 3, "in_bytes": 180, "proto": 6, "src_port": 1, "dst_port": 2,
            "src4_addr": "10.0.0.1", "dst4_addr": "10.0.0.2", "label": "<none>"}
    recs = [dict(base, tcp_flags=f) for f in ("...A...F", "0x12", "not flags", 99999)]
    p = tmp_path / "flows.json"
    p.write_text(json.dumps(recs, indent=1))
    store, summary = _ingest(tmp_path, p, extra={"tz_offset_s": "0"})
    (f,) = summary.files
    assert f.format == "nfdump_json" and f.status == "ingested" and f.records == {"flow": 4}, f
    assert store.read("flow")["tcp_flags"].to_list() == [0x11, 0x12, None, None]


def test_nfdump_csv_and_json_flags_match_the_ipfix_decoding_of_the_same_flows(tmp_path):
    store, _ = _ingest(tmp_path, "softflowd.ipfix", "nfdump_softflowd.csv", "nfdump_softflowd.json",
                       extra={"tz_offset_s": "0"})
    df = store.read("flow").filter(pl.col("protocol").is_in([6, 17]))  # ICMP: null in IPFIX and JSON, 0 in CSV

    def flags(source):
        return sorted(df.filter(pl.col("source") == source).select("src_addr", "protocol", "tcp_flags").rows())

    assert flags("ipfix") == [("10.67.0.1", 6, 0x1A), ("10.67.0.1", 17, 0), ("10.67.0.2", 6, 0x12)]
    assert flags("nfdump") == sorted(flags("ipfix") * 2)  # the CSV's rows and the JSON's
