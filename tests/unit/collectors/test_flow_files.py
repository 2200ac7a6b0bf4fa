"""Flow files through `rankscope ingest`: IPFIX files, pcap/pcapng, nfdump CSV/JSON, and broken files."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

from rankscope.collectors import formats
from rankscope.collectors.ingest import ingest
from rankscope.collectors.store import Store

FIXTURES = Path(__file__).parent / "fixtures"
KEY = ["src_addr", "dst_addr", "protocol", "size_bytes", "num_packets"]


def _ingest(tmp_path, *names, **kw):
    store = Store(tmp_path / "st")
    summary = ingest(store, [FIXTURES / n if isinstance(n, str) else n for n in names],
                     opts=formats.ImportOptions(**kw))
    return store, summary


def test_detection():
    assert formats.detect(FIXTURES / "softflowd.ipfix") == "ipfix_file"
    assert formats.detect(FIXTURES / "softflowd_nf9.pcap") == "flow_pcap"
    assert formats.detect(FIXTURES / "nfdump_softflowd.csv") == "nfdump_csv"
    assert formats.detect(FIXTURES / "nfdump_softflowd.json") == "nfdump_json"


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
    assert formats.detect(path) == "nfdump_json"
    store, summary = _ingest(tmp_path, path, extra={"tz_offset_s": "0"})
    (f,) = summary.files
    assert f.status == "ingested" and f.records == {"flow": 49}, f
    df = store.read("flow")
    assert set(df["exporter"]) == {"file/0"}
    tcp = df.filter((pl.col("protocol") == 6) & pl.col("src_addr").str.starts_with("10.213."))
    assert tcp.height > 20 and (tcp["end_ns"] >= tcp["start_ns"]).all()
    # milliseconds, as nfdump prints them
    assert (tcp["start_ns"] % 1_000_000 == 0).all()
