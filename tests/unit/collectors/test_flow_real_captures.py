"""Real exporters' datagrams (goflow2's BSD-3 test data, tests/data/goflow2/SOURCE.md): every record decodes.

The NetFlow v9 template and its data are in separate captures, as in rotated
collector files; ingested together (either order) or in two ingests, all 21
data records decode.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.store import Store

DATA = Path(__file__).parents[2] / "data" / "goflow2"


@pytest.mark.parametrize("order", [("nf9-template.pcap", "nf9-data.pcap"), ("nf9-data.pcap", "nf9-template.pcap")])
def test_v9_template_and_data_captures_ingested_together_decode_every_record(tmp_path, order):
    store = Store(tmp_path / "st")
    summary = ingest(store, [DATA / n for n in order])
    assert summary.count("failed") == 0 and not summary.rejects, summary.rejects
    df = store.read("flow")
    assert df.height == 21
    assert set(df["exporter"]) == {"198.51.100.9/256"}
    assert df["size_bytes"].sum() > 0 and df["num_packets"].min() >= 1
    # the router's clock: header unix_secs 2021-11-09 16:36:56 UTC, flows up to 40 s earlier
    assert df["end_ns"].max() <= 1636475816 * 10**9 and df["start_ns"].min() >= 1636475776 * 10**9
    assert (df["end_ns"] >= df["start_ns"]).all()


def test_v5_capture_decodes_every_record(tmp_path):
    store = Store(tmp_path / "st")
    summary = ingest(store, [DATA / "nf5.pcap"])
    assert not summary.rejects
    df = store.read("flow")
    assert df.height == 6
    assert df["input_if"].to_list()[0] == 9  # goflow2's own assertion on this packet
    # each record's tcp_flags byte (offset 37), read from the capture by hand
    assert sorted(df["tcp_flags"].to_list()) == [0x12, 0x16, 0x1B, 0x1B, 0x1B, 0x1B]


def test_sflow_capture_decodes_every_flow_sample(tmp_path):
    """1 compact sample (ICMP, VLAN 32) + 5 expanded samples (1500-byte-class TCP frames, rate 16383)."""
    store = Store(tmp_path / "st")
    summary = ingest(store, [DATA / "sflow.pcap"])
    assert not summary.rejects, summary.rejects
    df = store.read("flow")
    assert df.height == 6
    icmp = df.filter(df["protocol"] == 1)
    assert icmp.height == 1 and icmp["sampling_rate"][0] == 2048 and icmp["vlan"][0] == 32
    tcp = df.filter(df["protocol"] == 6)
    assert tcp.height == 5 and set(tcp["sampling_rate"]) == {16383}
    assert set(tcp["tcp_flags"]) == {0x10} and icmp["tcp_flags"][0] is None  # bulk data segments: ACK only


FIXTURES = Path(__file__).parent / "fixtures"


def _split(src: Path, out: Path, groups: list[list[int]]) -> list[Path]:
    import dpkt

    with open(src, "rb") as f:
        packets = list(dpkt.pcap.Reader(f))
    paths = []
    for k, idx in enumerate(groups):
        p = out / f"part{k}.pcap"
        with open(p, "wb") as f:
            w = dpkt.pcap.Writer(f)
            for i in idx:
                w.writepkt(packets[i][1], ts=packets[i][0])
        paths.append(p)
    return paths


@pytest.mark.parametrize("name", ["softflowd_ipfix.pcap", "softflowd_nf9.pcap"])
@pytest.mark.parametrize("separate", [False, True])
def test_real_softflowd_capture_split_across_files_decodes_like_the_whole(tmp_path, name, separate):
    """softflowd sends its templates in the first datagram only: files after it hold data sets only."""
    whole = Store(tmp_path / "whole")
    ingest(whole, [FIXTURES / name])
    want = whole.read("flow").drop("source").sort("start_ns", "src_addr", "dst_addr", "src_port")
    assert want.height > 0
    d = tmp_path / "split"
    d.mkdir()
    data_only, with_templates = _split(FIXTURES / name, d, [[1, 2], [0]])
    store = Store(tmp_path / "st")
    if separate:  # the data file is ingested (and held) before the template file even exists in the store
        s1, s2 = ingest(store, [data_only]), ingest(store, [with_templates])
        assert s1.count("failed") == s2.count("failed") == 0
    else:
        assert ingest(store, [data_only, with_templates]).count("failed") == 0
    got = store.read("flow").drop("source").sort("start_ns", "src_addr", "dst_addr", "src_port")
    assert got.height == want.height
    assert got.equals(want)
