"""The graph of address pairs: endpoint order, connected components, links without some endpoints."""

from __future__ import annotations

import functools
import ipaddress

import numpy as np
import polars as pl


@functools.lru_cache(maxsize=1 << 16)
def address_key(addr: str):
    """Sort key that orders IPv4/IPv6 numerically and anything else after, by text.

    Cached: sorting member lists asks again for the same few thousand endpoints (110k parses at 4,096 GPUs).
    """
    try:
        ip = ipaddress.ip_address(addr)
        return (ip.version, int(ip), "")
    except ValueError:
        return (9, 0, addr)


def components(nodes: list[str], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Component label of each node for undirected edges given as node indices (scipy csgraph)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(nodes)
    m = coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n))
    return connected_components(m, directed=False)[1]


def links_without(edges: pl.DataFrame, nodes) -> pl.DataFrame:
    """The links (edges a, b) with neither end among ``nodes``."""
    nodes = list(nodes)
    return edges.filter(~pl.col("a").is_in(nodes) & ~pl.col("b").is_in(nodes)) if nodes else edges
