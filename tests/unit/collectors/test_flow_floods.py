"""The two floods that grew collector memory without bound: empty data sets for an unknown template
(they counted 0 bytes against the 4 MiB hold limit) and a new observation domain in every message."""

from __future__ import annotations

from rankscope.collectors.flows.flow_decoder import HELD_SET_OVERHEAD, FlowDecoder
from tests.unit.collectors.flow_builders import data_set, ipfix_message, template_set

FIELDS = [(8, 4), (12, 4), (1, 4)]


def test_empty_data_sets_count_against_the_hold_limit():
    dec = FlowDecoder(max_waiting_bytes=64 << 10)
    empty = data_set(999, [])
    msg = ipfix_message([empty] * 200)
    for _ in range(100):  # 20,000 empty sets for a template that never comes
        dec.feed(msg, "192.0.2.1", 0)
    held = sum(len(v) for v in dec.waiting.values())
    assert dec.waiting_bytes <= 64 << 10
    assert held <= (64 << 10) // HELD_SET_OVERHEAD
    assert dec.rejects["ipfix: data set for an unknown template (waiting buffer full)"] == 20_000 - held


def test_a_new_domain_in_every_message_is_capped_and_idle_exporters_are_dropped():
    dec = FlowDecoder(max_exporters=1000, exporter_ttl_s=0.0)  # every exporter idle at the next flush
    for d in range(5000):
        dec.feed(ipfix_message([template_set({256: FIELDS})], domain=d), "192.0.2.1", 0)
        if d % 500 == 499:
            dec.flush()  # what a collector's roll does
        assert len(dec.exporters) <= 1000 and len(dec.templates) <= 1000


def test_a_full_table_of_active_exporters_rejects_newcomers_by_name():
    dec = FlowDecoder(max_exporters=10, exporter_ttl_s=3600.0)
    for d in range(25):
        dec.feed(ipfix_message([template_set({256: FIELDS})], domain=d), "192.0.2.1", 0)
    dec.flush()
    assert len(dec.exporters) == 10
    (reason,) = [r for r in dec.rejects if r.startswith("exporter table full")]
    assert dec.rejects[reason] == 15


def test_state_of_a_busy_exporter_survives_compaction():
    dec = FlowDecoder(max_exporters=4, exporter_ttl_s=3600.0)
    dec.feed(ipfix_message([template_set({256: FIELDS})], domain=1), "192.0.2.1", 0)
    dec.feed(ipfix_message([template_set({256: FIELDS})], domain=2), "192.0.2.1", 0)
    dec.flush()  # 2 of 4 slots used: compaction runs, nobody idle, nothing dropped
    rec = bytes([10, 0, 0, 1, 10, 0, 0, 2, 0, 0, 5, 220])
    dec.feed(ipfix_message([data_set(256, [rec])], domain=2), "192.0.2.1", 0)
    out = dec.flush(final=True)
    assert not dec.rejects and out["flow"].num_rows == 1
