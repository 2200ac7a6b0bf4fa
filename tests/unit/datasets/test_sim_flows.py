"""The flow exporter model: active/idle timeouts, byte conservation, several jobs on one fabric."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest

from rankscope.collectors.schema import validate
from rankscope.collectors.store import Store
from rankscope.datasets.sim.network.flow_export import HEADER_BYTES, flow_records
from rankscope.datasets.simulator import Fault, SimConfig, simulate_fabric, write_store


def _records(t0, t1, nbytes, active_s=1.0, idle_s=15.0, qps=1):
    n = len(t0)
    tr = pl.DataFrame({"src_addr": [167772161] * n, "dst_addr": [167772162] * n, "conn": [1] * n,
                       "t0": t0, "t1": t1, "bytes": nbytes, "qps": [qps] * n, "sport": [50000] * n,
                       "dport": [4791] * n, "protocol": [17] * n, "exporter": ["10.255.0.1/0"] * n})
    return pl.from_arrow(flow_records(tr, capture="fabric", epoch_ns=0, active_timeout_s=active_s,
                                      idle_timeout_s=idle_s, sampling=1, mtu=4096, exporter_offsets={},
                                      rng=np.random.default_rng(0)))


def test_one_long_transfer_is_split_by_the_active_timeout():
    # 3.5 s transfer of 35 MB: records start at 0, 1, 2, 3 s; bytes in proportion to time
    f = _records([0], [3_500_000_000], [35_000_000]).sort("start_ns")
    assert f["start_ns"].to_list() == [0, 1_000_000_000, 2_000_000_000, 3_000_000_000]
    assert f["end_ns"].to_list() == [1_000_000_000, 2_000_000_000, 3_000_000_000, 3_500_000_000]
    payload = f["size_bytes"] - HEADER_BYTES * f["num_packets"]
    assert payload.sum() == 35_000_000 and f["num_packets"].sum() == math.ceil(35_000_000 / 4096)
    assert abs(payload[0] / 10_000_000 - 1) < 1e-3 and abs(payload[3] / 5_000_000 - 1) < 1e-3


def test_idle_gap_closes_the_record_and_next_packet_opens_one():
    # transfers at 0-0.1 s and 0.5-0.6 s: same record with idle 1 s, two records with idle 0.2 s
    t0, t1, b = [0, 500_000_000], [100_000_000, 600_000_000], [4096 * 10, 4096 * 10]
    assert _records(t0, t1, b, idle_s=1.0).height == 1
    two = _records(t0, t1, b, idle_s=0.2).sort("start_ns")
    assert two["start_ns"].to_list() == [0, 500_000_000] and two["end_ns"].to_list() == [100_000_000, 600_000_000]
    assert (two["num_packets"] == 10).all()


def test_after_the_active_timeout_the_next_record_starts_at_the_next_packet():
    # 0-0.9 s then 1.2-1.3 s (gap shorter than idle): second record starts at 1.2 s, not 1.0 s
    f = _records([0, 1_200_000_000], [900_000_000, 1_300_000_000], [9000, 1000]).sort("start_ns")
    assert f["start_ns"].to_list() == [0, 1_200_000_000]
    assert f["end_ns"].to_list() == [900_000_000, 1_300_000_000]


def test_queue_pairs_split_bytes_over_source_ports():
    f = _records([0], [1000], [4096 * 8 + 1], qps=4)
    assert f["src_port"].sort().to_list() == [50000, 50001, 50002, 50003]
    assert (f["size_bytes"] - HEADER_BYTES * f["num_packets"]).sum() == 4096 * 8 + 1
    assert f["num_packets"].sum() == 9


def test_two_jobs_on_one_fabric_with_background(tmp_path):
    a = SimConfig(job="a", dp=4, pp=1, tp=1, gpus_per_host=2, steps=3, microbatches=2, layers=4,
                  gemm_records=False)
    b = SimConfig(job="b", dp=2, pp=2, tp=1, gpus_per_host=2, steps=3, microbatches=2, layers=4,
                  gemm_records=False, faults=(Fault("slow-link", {"rank": 1}),))
    fab = simulate_fabric([a, b], background=True, capture="fab")
    ta, tb = fab.truth["jobs"]["a"], fab.truth["jobs"]["b"]
    assert not set(ta["endpoints"].values()) & set(tb["endpoints"].values())
    assert set(ta["hosts"]) == {"host0000", "host0001"} and set(tb["hosts"]) == {"host0002", "host0003"}
    flow = pl.from_arrow(fab.flow)
    assert not validate(fab.flow, "flow").rejects
    assert set(flow["job"]) == {"fab"}
    assert set(flow["protocol"]) == {6, 17}
    tcp = flow.filter(pl.col("protocol") == 6)
    assert {2049, 29500} <= set(tcp["dst_port"]) | set(tcp["src_port"])
    assert {e["kind"] for e in fab.truth["background"]} == {"storage", "checkpoint", "rendezvous"}
    roce = set(flow.filter(pl.col("protocol") == 17)["src_addr"])
    assert roce & set(ta["endpoints"].values()) and roce & set(tb["endpoints"].values())
    out = write_store(fab, tmp_path / "st")
    st = Store(out)
    assert st.jobs() == ["a", "b", "fab"]
    assert st.count("flow", "fab") == fab.flow.num_rows and st.count("comm_op", "a") > 0
    truth = json.loads((out / "truth.json").read_text())
    assert truth["capture"] == "fab" and set(truth["jobs"]) == {"a", "b"}
    assert truth["jobs"]["b"]["faults"][0]["kind"] == "communication"


@pytest.mark.parametrize("transport", ["roce", "tcp"])
def test_a_late_ring_member_opens_its_own_links_late_and_its_peers_open_on_time(transport):
    """A ring member's first chunk is its own data: links open when both ends can take part (RoCE: the
    writer waits for the reader's posted buffers) or when the sender arrives (TCP: into the socket
    buffer), not when the last member of the collective arrives."""
    from rankscope.datasets.simulator import Realism, simulate

    cfg = SimConfig(job="w", dp=4, pp=1, gpus_per_host=1, steps=4, seed=3, algorithm="ring", idle_timeout_s=0.01,
                    faults=(Fault("slow-worker", {"rank": 2, "factor": 2.0}),), realism=Realism(transport=transport))
    res = simulate(cfg)
    ep = res.truth["endpoints"]
    f = pl.from_arrow(res.tables["flow"]).filter(pl.col("size_bytes") > 1e6)
    first = {(a, b): s for a, b, s in f.group_by("src_addr", "dst_addr").agg(pl.col("start_ns").min()).iter_rows()}
    t0 = min(first.values())
    late = {k for k, s in first.items() if s - t0 > 100_000_000}
    ring = [(ep[str(i)], ep[str((i + 1) % 4)]) for i in range(4)]
    slow_out, slow_in = ring[2], ring[1]
    assert slow_out in late
    assert (slow_in in late) == (transport == "roce")
    assert ring[0] not in late and ring[3] not in late
