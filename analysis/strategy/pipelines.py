"""Pipelines from comm_op p2p records: the connected parts of the send/recv graph, ordered first stage to last.

The stage order comes from the first p2p op of each rank on each edge: the first message on a pipeline
edge is always a forward activation, so the rank whose first op towards its peer is a ``send`` is
upstream. Each side is read on its own clock only. A component whose edges close a cycle is an
interleaved pipeline (the last stage feeds the first stage's next chunk), walked from the one rank whose
first p2p op of the job is a send.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import numpy as np
import polars as pl

from rankscope.collectors.schema import P2P_OPS


class Pipelines(NamedTuple):
    """The pipelines of one job, as the send/recv graph gives them."""

    pipelines: list[list]
    """each pipeline's ranks, first stage to last, in the order of their smallest rank."""
    ordered: bool
    """every pipeline's stage order is confirmed by the direction of its first messages."""
    interleaved: bool
    """some pipeline is a p2p cycle (interleaved stages)."""


def order_pipelines(comm_op: pl.DataFrame, ranks: list) -> Pipelines:
    """The pipelines of ``ranks`` from their p2p records, each ordered from first stage to last.

    Needs comm_op columns rank, op, peer, start_ns. A rank with no p2p peer is a pipeline of one stage.
    """
    p2p = _p2p_by_start(comm_op)  # read once for both
    votes, first_send = _votes(p2p), _first_is_send(p2p)
    edges = sorted({tuple(sorted(k)) for k in votes})
    comps = components(ranks, edges)
    comp_votes, comp_edges = _split_by_component(comps, votes, edges)
    pipelines, ordered, interleaved = [], True, False
    for c, c_votes, nedges in zip(comps, comp_votes, comp_edges, strict=True):
        if len(c) > 2 and nedges >= len(c):
            # a p2p cycle: an interleaved pipeline (the last stage feeds the first stage's next chunk)
            order, ok = order_cycle(c, c_votes, first_send)
            interleaved = True
        else:
            order, ok = order_path(c, c_votes)
        pipelines.append(order)
        ordered &= ok
    return Pipelines(pipelines, ordered, interleaved)


def _split_by_component(comps: list[list], votes: dict[tuple, float],
                        edges: list[tuple]) -> tuple[list[dict], list[int]]:
    """Each component's votes and its number of edges, in the order of ``comps``.

    Split in one pass over the votes and edges, not one scan of all of them per component.
    """
    comp_of = {r: i for i, c in enumerate(comps) for r in c}
    comp_votes: list[dict] = [{} for _ in comps]
    for k, v in votes.items():
        if k[0] in comp_of:
            comp_votes[comp_of[k[0]]][k] = v
    comp_edges = [0] * len(comps)
    for e in edges:
        if e[0] in comp_of:
            comp_edges[comp_of[e[0]]] += 1
    return comp_votes, comp_edges


def components(nodes: list, edges: list[tuple]) -> list[list]:
    """Connected components, each sorted, ordered by smallest member.

    A union-find over the edges: the answer does not depend on component labels, and scipy.sparse
    cost ~0.13 s to import, a tenth of a small trace's analysis.
    """
    idx = {n: i for i, n in enumerate(nodes)}
    if not edges:
        return [[n] for n in nodes]
    parent = list(range(len(nodes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for u, v in edges:
        ru, rv = root(idx[u]), root(idx[v])
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    comps = defaultdict(list)
    for i, n in enumerate(nodes):
        comps[root(i)].append(n)
    return sorted((sorted(c) for c in comps.values()), key=lambda c: c[0])


def order_path(members: list, upstream_votes: dict[tuple, float]) -> tuple[list, bool]:
    """Order one pipeline's members from first stage to last.

    ``upstream_votes[(a, b)] > 0`` says a is upstream of b (antisymmetric).
    Returns (ordered members, True when the edges form a simple path that the
    votes orient consistently).
    """
    if len(members) == 1:
        return list(members), True
    adj = defaultdict(set)
    for (a, b) in upstream_votes:
        if a in adj or a in members:
            adj[a].add(b)
            adj[b].add(a)
    ends = [m for m in members if len(adj[m]) == 1]
    is_path = len(ends) == 2 and all(len(adj[m]) <= 2 for m in members)
    if not is_path:
        # not a path: order by net upstream score (sources first) as best effort
        score = {m: sum(np.sign(upstream_votes.get((m, o), 0.0)) for o in adj[m]) for m in members}
        return sorted(members, key=lambda m: (-score[m], m)), False
    # walk from the end that is upstream of its only neighbour
    start = None
    for e in ends:
        (nb,) = adj[e]
        if upstream_votes.get((e, nb), 0.0) > 0:
            start = e if start is None else start
    consistent = start is not None
    start = start if start is not None else min(ends)
    order, prev = [start], None
    while len(order) < len(members):
        cur = order[-1]
        nxt = [n for n in adj[cur] if n != prev and n not in order]
        if not nxt:
            break
        prev = cur
        order.append(nxt[0])
        consistent &= upstream_votes.get((cur, nxt[0]), 0.0) > 0
    return order, consistent


def p2p_votes(comm_op: pl.DataFrame) -> dict[tuple, float]:
    """Per rank pair, whether the first rank is upstream: +1/-1 per side whose first op on the edge says so.

    Needs comm_op columns rank, op, peer, start_ns. Each side is read on its own clock only.
    """
    return _votes(_p2p_by_start(comm_op))


def _p2p_by_start(comm_op: pl.DataFrame) -> pl.DataFrame:
    """The p2p ops with a peer (rank, peer, op, start_ns), by start."""
    # only the columns read: a filter and sort gather every column they carry (member lists included)
    return comm_op.select("rank", "peer", "op", "start_ns").filter(
        pl.col("op").is_in(P2P_OPS) & pl.col("peer").is_not_null()).sort("start_ns")


def _votes(p2p: pl.DataFrame) -> dict[tuple, float]:
    """:func:`p2p_votes` of :func:`_p2p_by_start`'s frame."""
    if p2p.is_empty():
        return {}
    first = p2p.group_by(["rank", "peer"], maintain_order=True).agg(pl.col("op").first())
    votes: dict[tuple, float] = defaultdict(float)
    for r, p, op in first.iter_rows():
        s = 1.0 if op == "send" else -1.0
        votes[(r, p)] += s
        votes[(p, r)] -= s
    return dict(votes)


def first_p2p_is_send(comm_op: pl.DataFrame) -> dict[int, bool]:
    """Per rank, whether its first p2p op of the job is a send (only the first stage starts that way)."""
    return _first_is_send(_p2p_by_start(comm_op))


def _first_is_send(p2p: pl.DataFrame) -> dict[int, bool]:
    """:func:`first_p2p_is_send` of :func:`_p2p_by_start`'s frame."""
    if p2p.is_empty():
        return {}
    first = p2p.group_by("rank", maintain_order=True).agg(pl.col("op").first())
    return {int(r): op == "send" for r, op in first.iter_rows()}


def order_cycle(members: list, votes: dict[tuple, float], first_send: dict) -> tuple[list, bool]:
    """Order a cyclic (interleaved) pipeline: follow the upstream votes from the rank that sends first."""
    starts = [m for m in members if first_send.get(m)]
    start = min(starts) if starts else min(members)
    order = [start]
    while len(order) < len(members):
        nxt = [b for (a, b), v in votes.items() if a == order[-1] and v > 0 and b not in order]
        if not nxt:
            break
        order.append(min(nxt))
    ok = len(starts) == 1 and len(order) == len(members)
    return (order if len(order) == len(members) else sorted(members)), ok
