"""The front door of the analysis: one job's frames in, one Diagnosis out.

Every analyzer is reached from here; the CLI, the dashboard and the notebooks
call :func:`diagnose` and read the Diagnosis it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankscope.analysis.diagnosis import Diagnosis
from rankscope.analysis.hangs import hang_section
from rankscope.analysis.regressions import regression_section
from rankscope.analysis.stragglers import straggler_section
from rankscope.collectors.job_frames import JobFrames


@dataclass(frozen=True)
class DiagnoseConfig:
    """Options of a whole diagnosis (each analyzer's own config hangs off here as issues add them)."""

    none_below: float = 1.05
    """straggler verdict is ``none`` when S is below this."""


def data_quality(frames: JobFrames) -> dict:
    counts = {k: getattr(frames, k).height for k in
              ("comm_op", "compute_op", "flow", "step_mark", "batch_meta", "endpoint_map")}
    return {"records": counts, "rejected": dict(frames.rejects),
            "num_rejected": int(sum(frames.rejects.values())), "relative_time": frames.relative_time}


def diagnose(frames: JobFrames, config: DiagnoseConfig | None = None,
             baseline: JobFrames | None = None) -> Diagnosis:
    """Run every analysis on one job. Needs: any subset of the record kinds (JobFrames)."""
    config = config or DiagnoseConfig()
    d = Diagnosis(job=frames.job, sources=list(frames.sources))
    d.data_quality = data_quality(frames)
    d.stragglers = straggler_section(frames, d.strategy)
    d.regressions = regression_section(frames, baseline)
    d.hangs = hang_section(frames)
    return d
