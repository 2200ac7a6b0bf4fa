"""Flows from sampled captures and batched exporters: how finely their times order anything, which links
their samples show for sure, and how a few samples split between a link's directions."""

import numpy as np
import polars as pl

from tests.unit.analysis.flow_records import directed_edges


def test_batched_packet_samples_are_timed_no_finer_than_their_batches():
    from rankscope.analysis.fabric.clock import flow_resolution_ns, sample_batching_ns

    # sFlow-like: 20 batches a second apart of 5 samples each, and 80 more in 2 ms batches
    slow = np.repeat(np.arange(20) * 1_000_000_000, 5)
    fast = 30_000_000_000 + np.repeat(np.arange(20) * 2_000_000, 4)
    t = np.r_[slow, fast]
    assert sample_batching_ns(t, t) == 1_000_000_000  # over 5 % of the samples came a second after the batch before
    assert sample_batching_ns(fast, fast) == 2_000_000
    # flow records (start before end) and samples each timed on their own carry their own times
    assert sample_batching_ns(t, t + 1) == 0
    own = np.arange(100) * 1_234_567
    assert sample_batching_ns(own, own) == 0
    flows = pl.DataFrame({"exporter": ["sw/1"] * len(t), "start_ns": t, "end_ns": t})
    assert flow_resolution_ns(flows) == 1_000_000_000


def test_a_fabric_mixing_a_fine_exporter_and_a_batched_sflow_agent_reads_at_the_agent_s_batching():
    from rankscope.analysis.fabric.clock import flow_resolution_ns

    rng = np.random.default_rng(3)
    fine = np.sort(rng.integers(0, 10**10, 200))  # IPFIX, nanosecond clock
    batches = np.repeat(np.arange(40) * 1_000_000_000, 5)  # sFlow: 5 samples a datagram, one a second
    rows = pl.DataFrame({"exporter": ["ipfix/1"] * 200 + ["sflow/2"] * 200,
                         "start_ns": np.r_[fine, batches], "end_ns": np.r_[fine + 1_234_567, batches]})
    # a lag between two of the agent's samples orders nothing, whatever the IPFIX exporter beside it saw
    assert flow_resolution_ns(rows) == 1_000_000_000
    assert flow_resolution_ns(rows.filter(pl.col("exporter") == "ipfix/1")) == 1
    # a millisecond exporter beside a nanosecond one: the finer tick (records cut on an exporter's round
    # timer ticks may read as a coarse clock)
    ms = pl.DataFrame({"exporter": ["ms/3"] * 50, "start_ns": np.arange(50) * 7_000_000,
                       "end_ns": np.arange(50) * 7_000_000 + 2_000_000})
    assert flow_resolution_ns(ms) == 1_000_000
    assert flow_resolution_ns(pl.concat([rows.filter(pl.col("exporter") == "ipfix/1"), ms])) == 1


def test_a_pair_that_only_ever_carried_its_set_up_is_no_heavy_link():
    from rankscope.analysis.fabric.heavy_links import heavy_edges

    # 1-in-16 sampling scales a connection set-up (SYN, ACKs) to kilobytes: 0.3 % of a 1 MB link, above
    # the heavy fraction, but no payload
    edges = pl.DataFrame({"a": ["h1", "h1", "h2"], "b": ["h2", "h3", "h3"],
                          "bytes": [3_136.0, 1_036_800.0, 1_019_776.0],
                          "data_ab": [0.0, 520_000.0, 510_000.0], "data_ba": [0.0, 500_000.0, 490_000.0]})
    heavy = heavy_edges(edges)
    assert sorted(zip(heavy["a"], heavy["b"])) == [("h1", "h3"), ("h2", "h3")]
    # without payload columns the bytes decide, as before
    assert heavy_edges(edges.drop("data_ab", "data_ba")).height == 3


def test_a_link_seen_in_one_sample_is_not_heavy_next_to_links_seen_in_hundreds():
    from rankscope.analysis.fabric.heavy_links import heavy_edges
    from rankscope.analysis.fabric.pair_traffic import sampled_bytes_floor

    # 1 in 1,000 sampling: each ring link shows 1,000 payload samples (4 GB); one sampled packet between
    # two of its hosts scales to 12 MB, 0.3 % of a ring link, over the heavy fraction (0.2 %). A single
    # sample says only that the pair carried something (seed 3 of the dev corpus: a storage server's
    # single packets to five hosts of a 2,048-GPU job joined it to the job, which then fit no grid)
    ring = [(f"h{i}", f"h{i % 4 + 1}", 2e9, 2e9, 10 * i, 500 - i) for i in range(1, 5)]
    chord = [("h1", "h3", 1.2e7, 0.0, 50, None)]
    e = directed_edges(ring + chord).with_columns(data_samples=pl.Series([1000] * 4 + [1]))
    ring_links = {frozenset(r[:2]) for r in ring}
    assert {frozenset(x) for x in heavy_edges(e).select("a", "b").iter_rows()} == ring_links
    # the same bytes counted packet by packet (unsampled: 0 samples), or in 40 samples, are heavy
    for n in (0, 40):
        heavy = heavy_edges(e.with_columns(data_samples=pl.Series([1000] * 4 + [n])))
        assert {frozenset(x) for x in heavy.select("a", "b").iter_rows()} != ring_links
    floor = pl.select(sampled_bytes_floor(pl.Series([0, 1, 3, 100]))).to_series().to_list()
    assert floor[0] == 1.0 and floor[1] < 0.06 and 0.2 < floor[2] < 0.35 and 0.8 < floor[3] < 0.9


def test_links_seen_in_a_few_samples_leave_room_for_unseen_ones():
    from rankscope.analysis.fabric.pair_traffic import pair_traffic, undirected_edges
    from rankscope.analysis.strategy.flows.sample_counts import (
        all_links_seen_chance,
        sampled_packets,
    )

    rows = [("a", "b", 1, 512), ("b", "a", 1, 512), ("b", "c", 1, 512), ("c", "b", 1, 512), ("c", "d", 1, 512)]
    f = pl.DataFrame(rows, schema=["src_addr", "dst_addr", "num_packets", "sampling_rate"], orient="row").with_columns(
        exporter=pl.lit("sw/1"), src_port=pl.lit(40000), dst_port=pl.lit(4791), protocol=pl.lit(17),
        size_bytes=pl.lit(1518), start_ns=pl.lit(0), end_ns=pl.lit(0))

    def edges(flows):
        return undirected_edges(pair_traffic(flows).pairs)

    counts = sampled_packets(edges(f))
    assert counts == {frozenset("ab"): 2, frozenset("bc"): 2, frozenset("cd"): 1}
    assert all_links_seen_chance(counts) == 0.0  # a link seen once says nothing of its rate
    two = all_links_seen_chance({frozenset("ab"): 2, frozenset("bc"): 2})
    assert 0.35 < two < 0.45  # (1 - e^-1)^2
    assert all_links_seen_chance({frozenset("ab"): 400, frozenset("bc"): 900}) > 0.999
    # unsampled records: nothing to scale
    assert sampled_packets(edges(f.with_columns(sampling_rate=pl.lit(1)))) == {}


def test_a_few_payload_samples_split_by_chance_are_not_read_as_one_way():
    from rankscope.analysis.fabric.pair_traffic import undirected_edges

    def sym(ab, ba, samples_ab, samples_ba):
        pairs = pl.DataFrame({"src": ["x", "y"], "dst": ["y", "x"], "bytes": [ab, ba], "num_records": [1, 1],
                              "first_ns": [0, 0], "last_ns": [1, 1], "data_bytes": [ab, ba],
                              "first_data_ns": [0, 0], "last_data_ns": [1, 1],
                              "data_samples": [samples_ab, samples_ba], "exporter": ["e", "e"]})
        return undirected_edges(pairs)["data_symmetry"][0]

    # a pipeline link under 1-in-128 sFlow: 5 samples one way, 2 the other
    assert sym(5 * 1448 * 128, 2 * 1448 * 128, 5, 2) >= 0.5
    # 400 samples one way and none back: one-way whatever the sampling
    assert sym(400 * 1448 * 16, 0, 400, 0) < 0.05
    # unsampled records keep the bytes' own symmetry
    assert sym(5_000_000, 2_000_000, 0, 0) == 0.4
