"""REAL interop: a DP2 x PP2 gloo job in 4 network namespaces, softflowd IPFIX -> rankscope collect flows.

Per directed endpoint pair, the bytes softflowd exported (IP bytes: payload
plus TCP/IP headers and ACKs) must match what the job's own comm records say
it sent. Tolerance: 0.95 <= flow bytes / payload bytes <= 1.15. Headers are
52 of every ~1500 bytes (3.5%), ACKs and gloo's own message headers add a
little more, and connection set-up and barriers weigh most on the small
pipeline pairs; measured ratios on this machine were 1.04-1.12 with 8 KiB
activations, so the helper sends 32 KiB ones (--microbatch-size 32). The lower
bound leaves room for packets softflowd's capture misses on a loaded 2-core
machine: one clean-clone CI run measured 0.999 on one pair (the others
1.016-1.070), which a bound of 1.00 failed. The rendezvous
store traffic (master port) must be in the store and tell itself apart by
its port.
"""

from __future__ import annotations

import polars as pl
import pytest

from tests.integration.netns_job import expected_directed_bytes, netns_skip_reason, shared_netns_run

pytestmark = [pytest.mark.netns, pytest.mark.torchjob, pytest.mark.slow]

LOW, HIGH = 0.95, 1.15


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    return shared_netns_run(tmp_path_factory.mktemp("interop"))


def _flows(capture):
    from rankscope.collectors.store import Store

    return Store(capture.store).read("flow", capture.flow_job)


def test_flow_bytes_match_comm_records_per_endpoint_pair(capture):
    flows = _flows(capture)
    assert flows.height > 0, capture.collector_output
    rank_of = capture.endpoints
    mp = capture.master_port
    job_flows = flows.filter((flows["src_port"] != mp) & (flows["dst_port"] != mp)
                             & flows["src_addr"].is_in(list(rank_of)) & flows["dst_addr"].is_in(list(rank_of)))
    measured = {}
    for row in job_flows.group_by("src_addr", "dst_addr").agg(b=pl.col("size_bytes").sum()).iter_rows(named=True):
        measured[(rank_of[row["src_addr"]], rank_of[row["dst_addr"]])] = row["b"]
    expected = expected_directed_bytes(capture.comm)
    assert len(expected) == 8, expected  # DP pairs 0<->1, 2<->3 and PP pairs 0<->2, 1<->3, both ways
    ratios = {pair: measured.get(pair, 0) / want for pair, want in expected.items()}
    print("flow/payload ratio per directed rank pair:", {p: round(r, 3) for p, r in sorted(ratios.items())})
    bad = {p: round(r, 3) for p, r in ratios.items() if not LOW <= r <= HIGH}
    assert not bad, f"flow/payload ratios outside [{LOW}, {HIGH}]: {bad}; all: {ratios}"
    # Pairs the job never addressed directly carry only connection set-up and barriers.
    smallest = min(expected.values())
    quiet = {p: b for p, b in measured.items() if p not in expected and b > 0.05 * smallest}
    assert not quiet, f"unexpected traffic between ranks without comm records: {quiet}"


def test_rendezvous_traffic_is_kept_and_distinguishable(capture):
    flows = _flows(capture)
    mp, master = capture.master_port, capture.master_addr
    rdzv = flows.filter((flows["src_port"] == mp) | (flows["dst_port"] == mp))
    assert rdzv.height > 0
    # Every rendezvous flow touches the master's store port, and every other node talks to it.
    to_master = rdzv.filter((rdzv["dst_addr"] == master) & (rdzv["dst_port"] == mp))
    assert set(to_master["src_addr"]) == set(capture.endpoints) - {master}
    assert (rdzv.filter(rdzv["src_port"] == mp)["src_addr"] == master).all()
    assert (rdzv["protocol"] == 6).all()
    # Store traffic is small next to the training traffic.
    assert rdzv["size_bytes"].sum() < 0.05 * flows["size_bytes"].sum()


def test_collector_lost_nothing(capture):
    from rankscope.collectors.store import Store

    entries = [m for m in Store(capture.store).manifest() if m.format == "collect-flows"]
    assert len(entries) == 1
    e = entries[0]
    assert e.notes["kernel_drops"] == 0
    assert e.notes["datagrams"] > 0
    assert not e.rejects, e.rejects
    assert e.records["flow"] == Store(capture.store).count("flow")
