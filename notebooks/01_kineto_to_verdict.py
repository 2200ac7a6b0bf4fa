# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
# ---

# %% [markdown]
# # PyTorch profiler traces to a straggler verdict
#
# A real data- and pipeline-parallel training job (DP2 x PP2 on gloo, 4 processes under
# torchrun) runs with the PyTorch profiler on, and one rank is slowed on purpose. The profiler's
# Kineto traces carry no layout (no stage, no microbatch, no DP rank): rankscope infers the
# strategy from the collectives, rebuilds each rank's timeline on one clock, replays the job's
# dependency graph with ideal durations, and says who the straggler is.

# %%
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rankscope.analysis.diagnose import analyze_job
from rankscope.analysis.report import describe
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.job_frames import load_job
from rankscope.collectors.store import Store
from rankscope.dashboard.figures import timeline_figure

REPO = Path.cwd().parent
JOB = REPO / "tests" / "jobs" / "train_dp_pp.py"
work = Path(tempfile.mkdtemp(prefix="rankscope-kineto-"))
SLOW_RANK, EXTRA_MS = 3, 30

# %% [markdown]
# Run the job: 4 steps, rank 3 spends an extra 30 ms in every microbatch's forward pass.

# %%
torchrun = Path(sys.executable).parent / "torchrun"
r = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=4", str(JOB), "--steps", "4",
                    "--sleep-ms-rank", f"{SLOW_RANK}:{EXTRA_MS}", "--profile", str(work / "prof"),
                    "--out", str(work / "out")], capture_output=True, text=True, timeout=600,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
print("exit", r.returncode, sorted(p.name for p in (work / "prof").iterdir()))

# %% [markdown]
# Ingest the four trace files and analyse the job.

# %%
store = Store(work / "st")
ingest(store, [work / "prof"])
d, tables = analyze_job(load_job(store, "default"))
s = d.strategy
print(f"strategy: dp={s.dp} pp={s.pp}; pipelines {s.pp_groups}; DP groups {s.dp_groups}")
print(f"steps: {d.steps.count}, median {d.steps.median_ns / 1e6:.1f} ms")
st = d.stragglers
print(f"verdict {st.verdict}, S {st.slowdown:.2f}, basis {st.basis}")
for f in d.findings[:3]:
    print("finding:", describe(f))

# %% [markdown]
# Every rank's time per step, split into compute, exposed communication and idle waiting.

# %%
timeline_figure(tables["timeline"])
