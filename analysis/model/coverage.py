"""Which ranks the sources declare but no record covers (``data_quality.missing_ranks``).

A rank is declared by a source's world size (Kineto ``distributedInfo``,
the OSDI'25 meta; see :attr:`JobFrames.declared`) and by being named as a
member or peer of a recorded collective or transfer (the process groups of
a flight recorder's ``pg_config`` or of Kineto's ``distributedInfo.pg_config``
reach comm_op as ``group_ranks``). A rank is present when any comm_op,
compute_op, step_mark or batch_meta record is its own, or a source file is
(:attr:`JobFrames.source_ranks`). What a missing rank
did is unknown; nothing may be concluded from its silence alone.
"""

from __future__ import annotations

import heapq
import itertools

import polars as pl

from rankscope.analysis.report.data_quality import (
    RankCoverage,
)
from rankscope.analysis.strategy.whitebox import member_ranks
from rankscope.collectors.job_frames import JobFrames
from rankscope.collectors.record_class import record


@record
class Coverage:
    """Which ranks the sources declare and which of them no record covers."""

    missing_ranks: list[int]
    ranks: RankCoverage


MAX_WORLD = 2**31
"""Ranks are 32-bit in every record kind: a declared world size above this is beyond the format."""
MISSING_LISTED = 10_000
"""``data_quality.missing_ranks`` lists at most this many; ``ranks.missing`` counts them all."""
RECORD_KINDS = ("comm_op", "compute_op", "flow", "step_mark", "batch_meta", "endpoint_map")
_OWN = ("comm_op", "compute_op", "step_mark", "batch_meta")


def _ints(s: pl.Series) -> set[int]:
    return {int(x) for x in s.drop_nulls().unique().to_list()} if s.len() else set()


def rank_coverage(frames: JobFrames) -> Coverage:
    """The sorted missing ranks and how they were found.

    Needs the ``rank`` column of comm_op/compute_op/step_mark/batch_meta,
    comm_op ``group_ranks`` and ``peer`` where present, and ``frames.declared``.
    """
    # a rank's own source file counts even when empty (a dump of unfinished calls, and it had none)
    present: set[int] = set(frames.source_ranks)
    for k in _OWN:
        df = getattr(frames, k)
        if not df.is_empty() and "rank" in df.columns:
            present |= _ints(df["rank"])
    named: set[int] = set()
    cm = frames.comm_op
    if not cm.is_empty():
        if "group_ranks" in cm.columns:
            named |= member_ranks(cm["group_ranks"])
        if "peer" in cm.columns:
            named |= _ints(cm["peer"])
    claims, set_aside = usable_claims(frames.declared)
    world = max((d["world_size"] for d in claims), default=None)
    count, missing = _missing(world or 0, present, named)
    note = None
    kept = _one_per_group(claims)
    if count and world and kept > 1 and len(present) * kept == world:
        note = (f"the trace keeps one rank per {_group_words(claims)}; "
                "the other ranks of each group are absent by the trace's design")
    elif count:
        note = "no records from these ranks: their traces were not supplied or not written"
    if count > len(missing):
        claim = max(claims, key=lambda d: d["world_size"]) if claims else None
        said = f"{claim['format']} declares world_size {world:,} " if claim else ""
        note = (f"{note}; {said}with records from {len(present):,} ranks: {count:,} missing, "
                f"the first {len(missing):,} listed")
    info = RankCoverage(present=len(present), declared_world_size=world,
                        declared_by=sorted({f"{d['format']} world_size {d['world_size']}" for d in frames.declared}),
                        named_in_comm_groups=len(named), missing=count, note=note,
                        listed=len(missing) if count > len(missing) else None, set_aside=set_aside)
    return Coverage(missing_ranks=missing, ranks=info)


def usable_claims(declared: list[dict]) -> tuple[list[dict], list[str]]:
    """The declared world sizes worth using, and each one set aside with why: above what a 32-bit rank
    can hold, or contradicted by the same file's layout (``doubt``, see :func:`declared_world`)."""
    claims, set_aside = [], []
    for d in declared:
        why = (f"above the {MAX_WORLD:,} ranks a rank column can hold" if d["world_size"] > MAX_WORLD
               else d.get("doubt"))
        if why:
            set_aside.append(f"{d['format']} world_size {d['world_size']:,} ({d.get('source', '?')}): {why}; not used")
        else:
            claims.append(d)
    return claims, set_aside


def _missing(world: int, present: set[int], named: set[int]) -> tuple[int, list[int]]:
    """How many of ``range(world) | named`` have no records, and the first :data:`MISSING_LISTED` of them.

    A declared world size is a claim: counted arithmetically and listed up to the cap, never built as a
    set (a 70-byte meta file declaring 10**8 ranks took 11.6 GB)."""
    own_in_world = sum(1 for r in present if 0 <= r < world)
    outside = sorted(r for r in named - present if not 0 <= r < world)
    count = world - own_in_world + len(outside)
    inside = (r for r in range(world) if r not in present)
    return count, list(itertools.islice(heapq.merge(inside, outside), MISSING_LISTED))


def _one_per_group(declared: list[dict]) -> int:
    """How many ranks of a declared layout each recorded rank stands for (tensor x data-sequence parallel)."""
    tp = max((d.get("tp_size", 1) for d in declared), default=1)
    dsp = max((d.get("dsp_size", 1) for d in declared), default=1)
    return tp * dsp


def _group_words(declared: list[dict]) -> str:
    tp = max((d.get("tp_size", 1) for d in declared), default=1)
    dsp = max((d.get("dsp_size", 1) for d in declared), default=1)
    parts = ([f"tensor-parallel group (tp_size {tp})"] if tp > 1 else []) + (
        [f"data-sequence-parallel group (dsp_size {dsp})"] if dsp > 1 else [])
    return " and ".join(parts)
