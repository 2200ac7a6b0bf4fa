"""Real exporters' datagrams (goflow2's BSD-3 test data, tests/data/goflow2/SOURCE.md): every record decodes.

The NetFlow v9 template and its data are in separate captures, as in rotated
collector files; ingested together (either order) or in two ingests, all 21
data records decode.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rankscope.collectors.ingest import ingest
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
