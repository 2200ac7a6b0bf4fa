"""Fixed-seed structure-aware fuzz over the flow decoders (IPFIX, v9, v5, sFlow, pcap): 0 tracebacks.

The long run (>= 1,000,000 packets) is ``BENCH_FULL=1 python benchmarks/bench_input_fuzz.py``.
"""

from __future__ import annotations

import pytest

from tests.unit.collectors.flow_fuzz import run

PACKETS = 40_000


@pytest.mark.timeout(300)
def test_structure_aware_flow_fuzz_has_no_tracebacks_and_counts_bad_records():
    c = run(seed=20261203, packets=PACKETS)
    assert c.packets == PACKETS
    assert not c.tracebacks, c.tracebacks[:3]
    assert sum(c.records.values()) > 1000  # mutants still reach the column decoders
    assert sum(c.rejects.values()) > 1000 and len(c.rejects) > 30  # and the error paths, by many reasons
    assert c.pcap_files > 10 and any("snap length" in r for r in c.rejects)
    assert any("beyond the int" in r for r in c.rejects)  # huge values were counted, not wrapped
