"""Hang section of the report (issue 9: collectives some rank never joined)."""

from __future__ import annotations

from rankscope.collectors.job_frames import JobFrames


def hang_section(frames: JobFrames) -> list[dict]:
    """Stuck collectives of one job. Placeholder until issue 9."""
    return []
