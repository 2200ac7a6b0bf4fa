"""sFlow v5 datagrams from real agents (goflow2's decoder tests, BSD-3) decode completely."""

from pathlib import Path

import pytest

from rankscope.collectors.flows.flow_decoder import FlowDecoder

DATA = Path(__file__).resolve().parents[2] / "data" / "goflow2"


@pytest.mark.parametrize("name,flows,rate,first", [
    ("sflow_v5_sample.bin", 1, 2048, ("172.16.32.254", "172.16.32.241", 1194, 1043)),
    ("sflow_v5_expanded.bin", 5, 16383, ("185.59.220.147", "88.238.78.19", 1000100, 1000018)),
])
def test_real_agent_datagrams_decode_every_sample(name, flows, rate, first):
    d = FlowDecoder()
    d.feed((DATA / name).read_bytes(), "192.0.2.1", 10**18)
    out = d.flush(final=True)
    assert not d.rejects, dict(d.rejects)
    t = out["flow"] if hasattr(out["flow"], "num_rows") else out["flow"][0]
    assert t.num_rows == flows
    row = t.to_pylist()[0]
    assert (row["src_addr"], row["dst_addr"], row["input_if"], row["output_if"]) == first
    assert {r["sampling_rate"] for r in t.to_pylist()} == {rate}


def test_interface_index_all_ones_is_a_value_not_an_error():
    # 0xFFFFFFFF (and 0x3FFFFFFF after the format bits) mean "unknown or multiple interfaces" in sFlow
    data = bytearray((DATA / "sflow_v5_expanded.bin").read_bytes())
    # first sample: source id index 1000100, then rate, pool, drops, input format, input value 1000100
    i = data.find(bytes.fromhex("000f42a4"), data.find(bytes.fromhex("000f42a4"), 28) + 4)
    data[i:i + 4] = b"\xff\xff\xff\xff"
    d = FlowDecoder()
    d.feed(bytes(data), "192.0.2.1", 10**18)
    out = d.flush(final=True)
    assert not d.rejects
    t = out["flow"] if hasattr(out["flow"], "num_rows") else out["flow"][0]
    assert 0xFFFFFFFF in {r["input_if"] for r in t.to_pylist()} | {r["output_if"] for r in t.to_pylist()}
