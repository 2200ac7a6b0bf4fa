"""The report's ``hangs``: collectives some ranks never finished or never joined."""

from __future__ import annotations

from typing import Any

from rankscope.analysis.report.codec import doc
from rankscope.collectors.record_class import record


@record
class Hang:
    """One stuck collective (or send/recv pair) of one source."""

    group: Any = doc("the process group id (or its member key).")
    group_key: str = doc("the group as keyed across sources: its sorted members, or the p2p direction.")
    group_ranks: list[int] = doc("the group's members.")
    seq: int = doc("the stuck call's sequence number in the group.")
    op: str | None = doc("the op most arrived ranks called.")
    size_bytes: int | None = doc("its size.")
    dtype: str | None = doc("its element type.")
    step: int | None = doc("its step.")
    missing: list[int] = doc("members that never reached that seq: no record at it and none after it in the group.")
    mismatched: list[dict] = doc("arrived ranks whose op, size or dtype differs from the majority's.")
    pending_ranks: list[int] = doc("ranks whose call never completed.")
    evidence: str = doc("pending (a call never completed) or lagging (members stopped at different seqs).")
    arrived: list[int] = doc("members with a record at that seq.")
    last_seq: dict[str, int] = doc("rank -> the last seq it reached in the group.")
    last_completed: dict[str, Any] = doc("rank -> its last completed call (op, group, seq, step).")
    first_divergent_seq: int | None = doc("the first seq whose members recorded different steps.")
    root_cause: bool = doc("a rank arrived mismatched; or ranks wait here first for a missing member that waits "
                           "nowhere, or whose own first wait lacks nobody (where the chain of waits ends).")
    started_ns: int | None = doc("when the stuck call started.")
    first: bool = doc("the first stuck call of its source: roots first, then the earliest step and start.")
    source: str = doc("the record source.")
    missing_input: list[int] = doc("members with no record of any kind in the job (absent traces).")
    passed: list[int] = doc("members with no record at that seq but records after it: they went through it (a "
                            "dump of unfinished calls only leaves out the completed ones).", factory=list)
    waiting: list[int] = doc("ranks whose oldest unfinished call this is: where they wait (their later unfinished "
                             "calls queue behind it).", factory=list)
