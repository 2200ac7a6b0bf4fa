"""Critical path at 4,096 GPUs (issue 39): the section's cost beside the what-if it reuses, per step.

Simulates dp=64 x pp=8 x tp=8 (5 steps; 20 with BENCH_FULL=1), builds the job model and the straggler
section (whose graph the path reuses, as ``analyze`` does), then times the critical-path section. The
budget is the whole ``analyze`` (< 60 s at 4,096 GPUs): the path's share of it is printed with the
figures. Timings are only worth quoting from a quiet machine.
"""

from __future__ import annotations

import os
import sys
import time

import polars as pl

from rankscope.analysis.critical_path import critical_path_section
from rankscope.analysis.model.job_model import build_job_model
from rankscope.analysis.stragglers import StragglerConfig
from rankscope.analysis.stragglers.section import straggler_section
from rankscope.collectors.job_frames import JobFrames
from rankscope.datasets.simulator import SimConfig, simulate

FULL = os.environ.get("BENCH_FULL") == "1"


def main() -> int:
    steps = 20 if FULL else 5
    t0 = time.perf_counter()
    res = simulate(SimConfig(job="big", dp=64, pp=8, tp=8, steps=steps, microbatches=8, flows=False))
    tabs = {k: (v if isinstance(v, pl.DataFrame) else pl.from_arrow(v)) for k, v in res.tables.items()}
    frames = JobFrames.from_frames("big", **{k: v for k, v in tabs.items()
                                           if k in ("comm_op", "compute_op", "step_mark", "batch_meta")})
    t1 = time.perf_counter()
    model = build_job_model(frames)
    inter: dict = {}
    straggler_section(model, StragglerConfig(), inter)
    t2 = time.perf_counter()
    c = critical_path_section(model, inter)
    t3 = time.perf_counter()
    n = len(c.top_rank_by_step) or 1
    print(f"simulate {t1 - t0:.1f} s; job model + what-if {t2 - t1:.1f} s; critical path {t3 - t2:.1f} s "
          f"({(t3 - t2) / n:.2f} s per step over {n} steps); evaluated={c.evaluated} {c.why or ''}")
    print(f"critical path + what-if at 4,096 GPUs: {t3 - t1:.1f} s (budget: analyze < 60 s in all)")
    return 0 if c.evaluated else 1


if __name__ == "__main__":
    sys.exit(main())
