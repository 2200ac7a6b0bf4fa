"""One job on one clock, built once: aligned frames, layout, steps, timelines, data quality."""

from rankscope.analysis.model.job_model import FlowView, JobModel, build_job_model

__all__ = ["FlowView", "JobModel", "build_job_model"]
