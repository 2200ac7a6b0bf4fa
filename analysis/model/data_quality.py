"""The report's data quality of one job model: records read and rejected, missing ranks, layout, clock fixes."""

from __future__ import annotations

import polars as pl

from rankscope.analysis.model.job_model import JobModel
from rankscope.analysis.report.data_quality import (
    ClockQuality,
    DataQuality,
    ExporterClock,
    LayoutQuality,
)

RELATIVE_CLOCK_NOTE = "relative-time records: each step keeps its own origin, clocks not fitted"


def clock_quality(offsets: pl.DataFrame, relative_time: bool) -> ClockQuality:
    """The rank clock corrections as the report states them."""
    note = RELATIVE_CLOCK_NOTE if relative_time else None
    if offsets.is_empty():
        return ClockQuality(domains=0, max_abs_offset_ns=0.0, max_abs_drift=0.0, note=note)
    return ClockQuality(domains=int(offsets["domain"].n_unique()),
                        max_abs_offset_ns=float(offsets["offset_ns"].abs().max()),
                        max_abs_drift=float(offsets["drift"].abs().max()), note=note)


def data_quality(model: JobModel) -> DataQuality:
    """What the report of one job rests on: records, rejects, missing ranks, layout, clock fixes."""
    frames = model.frames
    lay = model.layout
    flows = model.flows if not model.per_rank else None  # a job with comm_op reports its own clocks
    exp = flows.exporter_offsets if flows is not None else None
    return DataQuality(
        records=dict(model.records), rejected=dict(frames.rejects),
        num_rejected=int(sum(frames.rejects.values())), relative_time=frames.relative_time,
        missing_ranks=model.coverage.missing_ranks, ranks=model.coverage.ranks,
        layout=LayoutQuality(source=lay["source"][0] if lay.height else "unknown", filled=model.filled,
                             notes=model.notes),
        clock=clock_quality(model.rank_offsets, frames.relative_time) if model.per_rank else None,
        flows=flows.inference.quality if flows is not None else None,
        exporter_clock=ExporterClock(exporters=int(exp.height),
                                     max_abs_offset_ns=float(exp["offset_ns"].abs().max()) if exp.height else 0.0)
        if exp is not None else None)
