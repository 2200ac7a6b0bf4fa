"""How far the flows strategy can be trusted: the chance that what the report claims is right.

Each kind of evidence (a unique valid grid, a tie broken by bytes, a stage order voted clearly or split,
or not at all) gets the chance measured for it on simulated jobs (the development corpus, and tie-prone
draws like it); each constant says what was measured. strategy.flows.infer picks the kind.
"""

from __future__ import annotations

VALID_GRID_CONFIDENCE = 0.99
"""chance that the groups (and tp, or tp null) of a unique valid grid labelling are right. On the
development corpus (240 jobs of 8..1,024 GPUs, half with scattered host addresses), of the recognised
jobs with a unique valid grid, 224 of 225 had them right (62 without pipelines, 151 of 152 with clear
stage-order votes, 6 with split votes, 5 with none); (k + 1) / (n + 2) = 0.991, rounded down. Whether
the stage order was voted does not change it: the order's chance multiplies in apart
(stage_order_confidence). The per-link model fit is reported but not used: pipeline links whose
gradient lag the transport's ACK flows hide fit poorly and were right as often as the rest."""
INVALID_GRID_CONFIDENCE = 0.3
"""no labelling forms a grid: a best effort (no job of the development corpus fell here, so this is not
measured)."""
CLEAR_VOTE_SHARE = 0.9
"""stage-order votes that agree at least this much are clear; below, they are split (the share counts
minority votes, and halves where a cycle's wrap link is a guess: on the development corpus every split
job ran an interleaved schedule)."""
CLEAR_ORDER_CONFIDENCE = 0.99
"""chance the stage order is right when the votes are clear: on the development corpus, 151 of the 151
jobs whose groups were right; (k + 1) / (n + 2) = 0.993, rounded down."""
SPLIT_ORDER_CONFIDENCE = 0.94
"""chance the stage order is right when votes exist but are split: on the development corpus (1,100 jobs)
15 of 15 right, each direction's votes tallied apart (the minority of the link votes counting against
the share, strategy.flows.stage_order.order_pipelines); (k + 1) / (n + 2) = 0.94. A split share says
that some links disagree, not that the order is wrong: read as a chance (2 * share - 1) it would give
these jobs 0.0-0.5, and they were right every time."""
TIE_BROKEN_CONFIDENCE = {"wrap": 0.97, "misfit": 0.9}
"""chance that the groups (and tp, or tp null) are right when a tie between equally fitting labellings
was broken by the bytes per link (fabric.tie_evidence), per kind of evidence. Ties are ~3 % of the corpus,
so this is measured on tie-prone jobs drawn like the corpus (benchmarks/bench_ties.py: corpus draws
turned into interleaved TCP pipelines, into small DP x PP tree all-reduce jobs, and as drawn), on draws
never used while the evidence was built. ``wrap`` (one link of each pipeline cycle short by a model
chunk, both ways): 47 of 47 right; (k + 1) / (n + 2) = 0.980, rounded down. ``misfit`` (the other
labellings' pipeline cycles have two short links): 19 of 20 (the miss had its groups right and one
pipeline listed against the others' direction); 0.909, rounded down. 20 ties stood (1 / k), all
DP-pair jobs whose alternatives hold no cycle. A tie left standing keeps 1 / k although the labelling
with the slightly better link fit was right in 16 of 17 standing 2-way ties over the development corpus
and a held-out draw: a real gloo DP2 x PP2 capture (tests/data/netns_gloo, slow NIC on stage 1) listed
the wrong one first, so that fit is our simulator's regularity, not evidence."""
TIE_CLASSES = {"wrap": "tie broken by a short wrap link", "misfit": "tie broken: no pipeline fits the bytes"}
UNVOTED_ORDER_CONFIDENCE = 0.5
"""no link showed the stage order: the pipelines (oriented alike, strategy.flows.stage_order.order_pipelines)
run one way or the other, and which is a coin flip. Address order is no evidence: hosts are numbered in rank
order on some fabrics and not on others (Kubernetes pod IPs), and nothing in the traffic tells which
(development corpus: 5 such jobs, all with scattered hosts; 4 happened to be listed first to last)."""


def evidence_class(valid: bool, alternatives: int, pp: int, order_share: float, tie_kind: str = "") -> str:
    """What the confidence rests on: ``invalid grid``, ``<k>-way tie``, a tie broken (``tie_kind``:
    ``wrap`` or ``misfit``, see fabric.tie_evidence), or a unique valid grid with ``no pipeline``, stage
    order ``voted`` (clear or split) or ``unknown``."""
    if not valid:
        return "invalid grid"
    if alternatives and tie_kind in TIE_CLASSES:
        return TIE_CLASSES[tie_kind]
    if alternatives:
        return f"{alternatives + 1}-way tie"
    if pp <= 1:
        return "unique grid, no pipeline"
    if order_share == 0:  # no link voted (a vote makes the share at least one half, bar halving for cycles)
        return "unique grid, order unknown"
    return "unique grid, order voted" + (" clearly" if order_share >= CLEAR_VOTE_SHARE else " split")


def stage_order_confidence(pp: int, order_share: float) -> float | None:
    """Chance that the pipelines' direction (first stage to last) is right; None without pipelines."""
    if pp <= 1:
        return None
    if order_share == 0:
        return UNVOTED_ORDER_CONFIDENCE
    return CLEAR_ORDER_CONFIDENCE if order_share >= CLEAR_VOTE_SHARE else SPLIT_ORDER_CONFIDENCE


def grid_confidence(valid: bool, alternatives: int, pp: int, order_share: float, tie_kind: str = "") -> float:
    """Chance that every field the report claims is right.

    Groups: a valid grid, one labelling or one of ``1 + alternatives`` that fit the traffic exactly
    as well (their order among themselves is the order candidates were tried in, no evidence: on the
    development corpus all 5 ties had equal fits, and the first listed was right in 4, the generator's
    more-DP-than-PP degrees showing through, not the traffic), so a k-way tie gets 1 / k of it. Stage
    order: claimed only when a link voted on it (``stage_order_known``), and then its own chance multiplies
    in; with no vote the report does not claim a direction (as tp null claims no tp), and
    ``stage_order_confidence`` says 0.5. A tie that evidence outside the link models broke
    (``tie_kind``, fabric.tie_evidence) gets that evidence's measured chance instead of 1 / k."""
    if valid and alternatives and tie_kind in TIE_BROKEN_CONFIDENCE:
        conf = TIE_BROKEN_CONFIDENCE[tie_kind]
    else:
        conf = (VALID_GRID_CONFIDENCE if valid else INVALID_GRID_CONFIDENCE) / (1 + alternatives)
    if pp > 1 and order_share > 0:
        conf *= stage_order_confidence(pp, order_share)
    return conf
