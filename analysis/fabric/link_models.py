"""Traffic models of collectives and pipeline p2p, used to judge a DP/PP labelling of a job's links.

A labelling says which links carry data-parallel collectives and which carry
pipeline sends; this module says how well the traffic fits that, model by
model:

- *ring* (all-reduce, reduce-scatter, all-gather): the group's links form one
  cycle; payload goes one way round it (each member sends to its successor),
  the other direction of each link carries only the transport's ACK/CTS flow.
  A group of two is a ring whose one link carries payload both ways.
- *tree* (NCCL tree all-reduce): a binary tree or the union of two (double
  binary tree); payload goes both ways on every link (reduce up, broadcast
  down), the two directions starting together; its depth is logarithmic, so a
  long path is never a tree.
- *all-to-all*: every member talks to every other, payload both ways.
- *pipeline p2p*: links join neighbouring stages only (simple paths, or a
  cycle for interleaved schedules); activations go downstream and gradients
  upstream, so payload flows both ways, the gradient direction starting a
  share of a step after the activation direction.

Any path of links is *not* a DP group: it fits no collective. Per link the
fit is a number in 0..1 (how well its direction pattern and timing match the
model of its label); a labelling's fit is the mean over links. Two valid
labellings whose fits differ by less than ``tie_margin`` explain the traffic
equally well: the caller reports them as ambiguous.
"""

from __future__ import annotations

from collections import deque

import numpy as np

BALANCED = 0.5
"""a link's payload is balanced when its smaller direction carries at least this share of the larger."""

TWO_WAY = 0.05
"""a link carries payload both ways when its smaller payload direction is at least this share of the
larger; ACK/CTS flows and bare TCP segments are well under 1 % of the payload they acknowledge."""


def adjacency(n: int, a: np.ndarray, b: np.ndarray) -> list[list[int]]:
    adj: list[list[int]] = [[] for _ in range(n)]
    for x, y in zip(a.tolist(), b.tolist()):
        adj[x].append(y)
        adj[y].append(x)
    return adj


def _eccentricity(adj: list[list[int]], members: list[int], start: int) -> int:
    seen = {start: 0}
    q = deque([start])
    while q:
        u = q.popleft()
        for v in adj[u]:
            if v not in seen:
                seen[v] = seen[u] + 1
                q.append(v)
    return max(seen[m] for m in members) if all(m in seen for m in members) else 1 << 30


def group_kind(members: list[int], ea: np.ndarray, eb: np.ndarray, two_way: np.ndarray,
               adj: list[list[int]], balanced: np.ndarray | None = None) -> str | None:
    """The collective a DP group's links fit (``pair``, ``ring``, ``tree``, ``all_to_all``) or None.

    ``ea``/``eb``: the group's links as node indices; ``two_way``: whether each carries payload both
    ways; ``balanced``: whether the two directions carry about the same payload (tree links do);
    ``adj``: adjacency of the group's links only.
    """
    balanced = two_way if balanced is None else balanced
    n, m = len(members), len(ea)
    if n == 1:
        return "single"
    if n == 2:
        return "pair" if m == 1 else None
    deg = np.array([len(adj[x]) for x in members])
    if m == n * (n - 1) // 2 and n > 3:
        return "all_to_all" if two_way.mean() >= 0.5 else None
    if m == n and (deg == 2).all() and not balanced.all():
        return "ring"  # a cycle: one-way payload round it, or a ring run in both directions unevenly
    # a cycle whose every link carries the same payload both ways is an interleaved pipeline's shape
    # (activations one way, gradients back), or a small tree; a ring all-reduce sends round one way
    # a tree link carries the reduction up and the broadcast down: the same bytes both ways. NCCL runs
    # two complementary binary trees (gloo's halving-doubling pairs up likewise), so the union of the
    # links holds a cycle: n - 1 links, a single tree or a path, is a pipeline's shape, not a collective's
    if balanced.mean() < 0.75 or not n <= m <= 2 * (n - 1) or deg.max() > 6:
        return None
    # NCCL's trees are binary and balanced: depth ~log2(n); a long chain of links is not one
    radius = min(_eccentricity(adj, members, s) for s in members)
    return "tree" if radius <= int(np.ceil(np.log2(n))) + 1 else None


def link_fit(is_pp: np.ndarray, kind_of_link: list[str | None], data_sym: np.ndarray,
             lag_like: np.ndarray) -> np.ndarray:
    """0..1 per link: how well its payload direction and timing match the model of its label.

    ``data_sym``: smaller payload direction / larger; ``lag_like``: 0..1, the evidence that the link
    carries pipeline sends (0.5: none; see fabric.link_evidence.link_likeness), e.g. the gradient direction
    started clearly after the activation direction (see fabric.link_evidence.pp_likeness).
    """
    two = np.clip(data_sym / TWO_WAY, 0.0, 1.0)
    fit = np.empty(len(is_pp))
    for i, (pp, kind) in enumerate(zip(is_pp.tolist(), kind_of_link)):
        if pp:
            fit[i] = two[i] * lag_like[i]
        elif kind == "ring":
            # one-way payload is the ring's signature; a ring of links used both ways fits less well
            fit[i] = 1.0 - 0.5 * two[i]
        elif kind in ("pair", "tree", "all_to_all"):
            fit[i] = two[i] * (1.0 - lag_like[i])
        else:
            fit[i] = 0.0
    return fit
