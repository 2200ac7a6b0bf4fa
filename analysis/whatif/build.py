"""The what-if dependency model of a job's records: the OSDI'25 op-level model for OSDI'25 traces, else the generic one."""

from __future__ import annotations

import polars as pl

from rankscope.analysis.model.job_model import JobModel
from rankscope.analysis.whatif.generic import generic_graph
from rankscope.analysis.whatif.graph import BWD, FWD, WhatIfGraph, WhatIfInputError
from rankscope.analysis.whatif.osdi import osdi_graph, osdi_ops
from rankscope.collectors.job_frames import JobFrames


def build_graph(frames: JobFrames, layout: pl.DataFrame | None = None) -> WhatIfGraph:
    """The what-if dependency model of a job.

    Needs compute_op and comm_op with rank, start_ns, end_ns, step; the OSDI
    model also optype, seq, stage, dp_rank (from the whatif_parquet importer).
    ``layout`` (rank, stage, dp_rank, ...: the job model's) places the generic model's ranks.
    Raises WhatIfInputError when there is nothing to replay.
    """
    comp, comm = frames.compute_op, frames.comm_op
    if comp.height == 0 and comm.height == 0:
        raise WhatIfInputError("no compute_op or comm_op records: nothing to replay")
    has_osdi = ("optype" in comp.columns and comp["optype"].drop_nulls().is_in([FWD, BWD]).any())
    if has_osdi:
        return osdi_graph(osdi_ops(comp, comm))

    return generic_graph(frames, layout)


def model_graph(model: JobModel) -> WhatIfGraph:
    """The what-if graph of a job model: its completed records, placed by its layout."""
    return build_graph(model.frames, model.layout_columns())
