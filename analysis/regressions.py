"""Regression section of the report (issue 9: GEMM alignment and throughput regressions)."""

from __future__ import annotations

from rankscope.collectors.job_frames import JobFrames


def regression_section(frames: JobFrames, baseline: JobFrames | None = None, config=None) -> list[dict]:
    """Kernel regressions of one job. Placeholder until issue 9."""
    return []
