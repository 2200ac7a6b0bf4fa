"""Which endpoint pairs a strategy makes talk, per traffic class, with each pair's relative share.

A strategy gives the links but not the sizes (message, bucket and microbatch counts live in the job's
config): each class's links carry equal bytes per step in the collectives rankscope models (a ring
all-reduce or a ZeRO reduce-scatter + all-gather sends the same 2(n-1)/n of the buffer over every ring
link; every pipeline link carries one activation per microbatch forward and one gradient back; every
pair of an all-to-all group exchanges the same expected share). So a class is expected as one weight
per link here, and :mod:`traffic` sizes it from the flows (the median of its links).
"""

from __future__ import annotations

from collections import defaultdict

CLASSES = ("dp", "pp_activation", "pp_gradient", "pp_wrap", "ep", "expert_dp")


def expert_dp_groups(dp_groups: list, ep_groups: list) -> list[list]:
    """The expert-data-parallel groups of EP carved out of DP: the same position in every EP block of one
    DP group (blocks and positions in the DP group's order), whose expert gradients are reduced together."""
    block_of = {str(x): i for i, g in enumerate(ep_groups) for x in g}
    out = []
    for g in dp_groups:
        blocks: dict[int, list] = {}
        for x in map(str, g):
            if x in block_of:
                blocks.setdefault(block_of[x], []).append(x)
        rows = list(blocks.values())
        if len(rows) > 1 and len({len(r) for r in rows}) == 1:
            out += [[r[i] for r in rows] for i in range(len(rows[0]))]
    return out



def _ring(group: list) -> list[tuple]:
    """A ring in the group's order: member i sends to member i+1 (both ways for a pair of two)."""
    n = len(group)
    if n < 2:
        return []
    if n == 2:
        return [(group[0], group[1]), (group[1], group[0])]
    return [(group[i], group[(i + 1) % n]) for i in range(n)]


def _pipeline(stages: list, wraps: bool) -> list[tuple]:
    links = []
    for a, b in zip(stages, stages[1:]):
        links += [(a, b, "pp_activation"), (b, a, "pp_gradient")]
    if wraps and len(stages) > 2:
        # an interleaved schedule: the last stage's chunk feeds the first stage's next chunk, and back
        links += [(stages[-1], stages[0], "pp_wrap"), (stages[0], stages[-1], "pp_wrap")]
    return links


def expected_traffic(strategy) -> dict[tuple, set]:
    """(src, dst) -> the classes the strategy sends over that directed pair.

    ``strategy``: the report's Strategy (dp_groups in ring order, pp_groups first stage to last, ep_groups).
    An interleaved pipeline (``whitebox.interleaved``) adds the wrap-around link both ways. EP groups are
    all-to-all meshes; where an EP group lies inside a DP ring, a pair carries both classes, and the expert
    gradients ring-reduce over the expert-data-parallel groups (:func:`expert_dp_groups`).
    """
    pairs: dict[tuple, set] = defaultdict(set)
    if (strategy.dp or 1) > 1:
        for g in strategy.dp_groups:
            for a, b in _ring(list(g)):
                pairs[(str(a), str(b))].add("dp")
    if (strategy.pp or 1) > 1:
        wraps = bool(strategy.interleaved)
        for p in strategy.pp_groups:
            for a, b, cls in _pipeline([str(x) for x in p], wraps):
                pairs[(a, b)].add(cls)
    for g in strategy.ep_groups or []:
        for a in g:
            for b in g:
                if a != b:
                    pairs[(str(a), str(b))].add("ep")
    for g in expert_dp_groups(strategy.dp_groups, strategy.ep_groups or []):
        for a, b in _ring(g):
            pairs[(a, b)].add("expert_dp")
    return dict(pairs)
