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

from dataclasses import dataclass

import polars as pl

from rankscope.analysis.report.data_quality import (
    RankCoverage,
)
from rankscope.collectors.job_frames import JobFrames


@dataclass(frozen=True)
class Coverage:
    """Which ranks the sources declare and which of them no record covers."""

    missing_ranks: list[int]
    ranks: RankCoverage


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
            # distinct lists first: every op's member list exploded is ~100 M values on 4,096 GPUs
            named |= _ints(cm["group_ranks"].drop_nulls().unique().explode())
        if "peer" in cm.columns:
            named |= _ints(cm["peer"])
    sizes = [d["world_size"] for d in frames.declared]
    world = max(sizes) if sizes else None
    declared = set(range(world)) if world else set()
    missing = sorted((declared | named) - present)
    note = None
    kept = _one_per_group(frames.declared)
    if missing and world and kept > 1 and len(present) * kept == world:
        note = (f"the trace keeps one rank per {_group_words(frames.declared)}; "
                "the other ranks of each group are absent by the trace's design")
    elif missing:
        note = "no records from these ranks: their traces were not supplied or not written"
    info = RankCoverage(present=len(present), declared_world_size=world,
                        declared_by=sorted({f"{d['format']} world_size {d['world_size']}" for d in frames.declared}),
                        named_in_comm_groups=len(named), missing=len(missing), note=note)
    return Coverage(missing_ranks=missing, ranks=info)


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
