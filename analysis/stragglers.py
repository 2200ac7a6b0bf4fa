"""Straggler section of the report (issue 8 fills this in: what-if attribution)."""

from __future__ import annotations

from rankscope.analysis.diagnosis import Stragglers, Strategy
from rankscope.collectors.job_frames import JobFrames


def straggler_section(frames: JobFrames, strategy: Strategy, config=None) -> Stragglers:
    """What-if attribution of one job. Placeholder until issue 8: reports that nothing was evaluated."""
    return Stragglers(extra={"evaluated": False, "why": "what-if analysis not implemented yet"})
