"""How much a sampled capture's few packets can say about which links a job has.

Under packet sampling a link shows only when at least one of its packets was sampled. A job's links of
one kind carry about the same traffic, so the lightest link seen tells how many samples a link like it
gets; a link with as much traffic goes unseen with the Poisson chance of no sample at all. A grid read
from links of a few samples each may miss a link, and with it a stage or a member.

Measured on real captures (tests/data/netns_gloo, pmacct's sFlow probe on a 4-stage gloo pipeline that
moved 3.3 MB): at 1 packet in 512 the capture held 4 samples, one link had none, and the job read as a
3-stage pipeline at 0.99 (2 runs of 2); at 1 in 128, one run of 2 read two of its addresses as a job.
"""

from __future__ import annotations

import math

import polars as pl


def sampled_packets(edges: pl.DataFrame) -> dict[frozenset, int]:
    """Sampled payload packets (as exported, before scaling) per sampled link, both directions; empty
    when no link was sampled. Needs edges a, b, data_samples (fabric.pair_traffic.undirected_edges)."""
    if edges.is_empty() or "data_samples" not in edges.columns:
        return {}
    return {frozenset((a, b)): int(n) for a, b, n in edges.select("a", "b", "data_samples").iter_rows() if n}


def all_links_seen_chance(counts: dict[frozenset, int]) -> float:
    """The chance that no link as heavy as the lightest seen went unseen: 1 without sampling.

    The lightest link's count is the only hint of the rate, and a link is seen at all only with one
    sample or more, so its rate is taken one below its count (about the zero-truncated Poisson
    estimate for a few samples); each of as many links as were seen might have a twin that got none.
    """
    if not counts:
        return 1.0
    k = min(counts.values())
    miss = math.exp(-max(k - 1, 0))
    return (1.0 - miss) ** len(counts)
