"""The report's ``data_quality``: what was read, what was rejected, which ranks are missing, clock fixes."""

from __future__ import annotations

from typing import Any

from rankscope.analysis.report.codec import doc
from rankscope.collectors.record_class import record


@record
class RankCoverage:
    """Which ranks the sources declare and which have records."""

    present: int = doc("ranks with records of their own.")
    declared_world_size: int | None = doc("the largest world size a source declares.")
    declared_by: list[str] = doc("which sources declare a world size, and what.")
    named_in_comm_groups: int = doc("ranks named as members or peers of recorded collectives.")
    missing: int = doc("declared or named ranks without records.")
    note: str | None = doc("why ranks are missing, where the sources tell.", None, omit="none")
    listed: int | None = doc("how many of the missing ranks ``missing_ranks`` lists, when it lists only the "
                             "first ones (a declared world size is a claim: counted, not listed whole).",
                             None, omit="none")
    set_aside: list[str] = doc("declared world sizes not used, and why (beyond what a rank can hold, or "
                               "contradicted by the same file's layout).",
                               factory=list, omit="empty")


@record
class ClockQuality:
    """The per-rank clock corrections applied."""

    domains: int = doc("clock domains (hosts, else ranks) fitted.")
    max_abs_offset_ns: float = doc("the largest offset corrected.")
    max_abs_drift: float = doc("the largest drift corrected.")
    note: str | None = doc("why no clock was fitted.", None, omit="none")


@record
class ExporterClock:
    """The per-exporter offsets applied to flow records."""

    exporters: int = doc("flow exporters seen.")
    max_abs_offset_ns: float = doc("the largest offset corrected.")


@record
class LayoutQuality:
    """Where each rank's stage, dp rank, tp rank and pipeline came from."""

    source: str = doc("records (columns the records carry) or strategy (positions in the inferred groups).")
    filled: dict[str, dict] = doc("per record kind and column, how many nulls the job model filled.")
    notes: list[str] = doc("what the job model could not fill, and why.")


@record
class DataQuality:
    """What the report rests on."""

    records: dict[str, int] = doc("records read per record kind.")
    rejected: dict[str, int] = doc("records rejected at ingest, per reason.")
    num_rejected: int = doc("records rejected at ingest.")
    relative_time: bool = doc("some source has relative times (each step from 0): no clock to fit.")
    missing_ranks: list[int] = doc("ranks the sources declare but no record covers (the first "
                                   "``ranks.listed`` when there are more; ``ranks.missing`` counts them).")
    ranks: RankCoverage = doc("how the missing ranks were found.")
    layout: LayoutQuality = doc("where the per-rank layout came from.")
    clock: ClockQuality | None = doc("the rank clock corrections (per-rank records).", None, omit="none")
    flows: dict[str, Any] | None = doc("the flow records: control, self-loop and sampled records set apart, "
                                       "pairs, heavy pairs, time resolution.", None, omit="none")
    exporter_clock: ExporterClock | None = doc("the exporter clock corrections (flow records).", None,
                                               omit="none")
    capture: str | None = doc("the flow capture a recognised job was found in.", None, omit="none")
    fabric: dict[str, Any] | None = doc("job recognition's counts about the whole capture.", None, omit="none")
