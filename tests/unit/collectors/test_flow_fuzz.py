"""Fuzzing the flow decoders: random and mutated datagrams never raise and never hang.

A small count runs here; ``BENCH_FULL=1 python benchmarks/bench_flow_decode.py``
runs 1,000,000 mutated datagrams.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankscope.collectors.flows.flow_decoder import FlowDecoder
from rankscope.collectors.schema import validate
from tests.unit.collectors.flow_builders import mutate, seed_datagrams

FIXTURES = Path(__file__).parent / "fixtures"
PREFIXES = [b"\x00\x0a", b"\x00\x09", b"\x00\x05", b"\x00\x00\x00\x05", b""]


def _check_output(dec: FlowDecoder) -> int:
    rows = 0
    for kind, table in dec.flush(final=True).items():
        v = validate(table.append_column("job", __import__("pyarrow").array(["f"] * table.num_rows)), kind)
        rows += v.table.num_rows
    return rows


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(prefix=st.sampled_from(PREFIXES), body=st.binary(max_size=600))
def test_random_datagrams_never_raise(prefix, body):
    dec = FlowDecoder()
    dec.feed(prefix + body, "192.0.2.1", 1)
    _check_output(dec)
    assert dec.datagrams == 1


@settings(max_examples=100, deadline=2000)
@given(chunks=st.lists(st.binary(min_size=4, max_size=120), min_size=1, max_size=8))
def test_random_sets_after_a_valid_ipfix_header(chunks):
    import struct

    dec = FlowDecoder()
    for c in chunks:
        dec.feed(struct.pack(">HHIII", 10, 16 + len(c), 1, 0, 1) + c, "192.0.2.1", 1)
    _check_output(dec)


@pytest.mark.timeout(120)
def test_mutated_real_datagrams_never_raise_or_hang():
    seeds = seed_datagrams(FIXTURES)
    dec = FlowDecoder()
    for s in seeds:  # learn the real templates first, so mutated data sets reach the column decoder
        dec.feed(s, "127.0.0.1", 1)
    t = time.perf_counter()
    n = 0
    for i, pkt in enumerate(mutate(seeds, 5000, seed=7)):
        dec.feed(pkt, "127.0.0.1", 1)
        n += 1
        if i % 500 == 0:
            _check_output(dec)
    _check_output(dec)
    elapsed = time.perf_counter() - t
    assert dec.datagrams == len(seeds) + n
    assert sum(dec.rejects.values()) > 0  # the mutations did hit the error paths
    assert elapsed < 110, f"5000 mutated datagrams took {elapsed:.1f} s"  # a hang would not end at all
