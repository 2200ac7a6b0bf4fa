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
# # A what-if study on the OSDI'25 straggler traces
#
# The three traces that the OSDI'25 straggler paper published (AR, ST, SE; 64 ranks each,
# TP4 PP4 DP4) come with the authors' own results. This notebook ingests each trace, runs
# rankscope's what-if replay, and sets its slowdown S, worker metric M_W and stage metric M_S
# beside the published figures. It reads the traces in place (`RANKSCOPE_SHARED`, default
# `../../shared` from this folder).

# %%
import json
import os
import tempfile
from pathlib import Path

import plotly.graph_objects as go

from rankscope.analysis.diagnose import analyze_job
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.job_frames import load_job
from rankscope.collectors.store import Store

SHARED = Path(os.environ.get("RANKSCOPE_SHARED", Path.cwd().parent.parent / "shared"))
REF = SHARED / "reference" / "stragglers-osdi25"
work = Path(tempfile.mkdtemp(prefix="rankscope-osdi-"))
print("traces:", REF)

# %% [markdown]
# Ingest the three traces into one store (each trace becomes the job named by its `trial_name`;
# the `meta-<X>.yaml` beside each trace is read as its layout).

# %%
store = Store(work / "st")
summary = ingest(store, [REF / f"trace-{x}.parquet" for x in ("AR", "ST", "SE")])
print(sorted(store.jobs()))

# %% [markdown]
# Analyse each job and compare with the authors' results: `blocking_slowdown` is their S,
# `mw-<X>.json` and `ms-<X>.json` hold M_W and M_S.

# %%
rows = []
diagnoses = {}
for x in ("AR", "ST", "SE"):
    d, tables = analyze_job(load_job(store, x))
    diagnoses[x] = (d, tables)
    paper = json.loads((REF / f"result-{x}.json").read_text())
    mw = json.loads((REF / f"mw-{x}.json").read_text())["Mw"]
    ms = json.loads((REF / f"ms-{x}.json").read_text())["Ms"]
    st = d.stragglers
    rows.append({"trace": x, "S": st.slowdown, "S paper": paper["blocking_slowdown"],
                 "M_W": st.by_cause.get("worker"), "M_W paper": mw,
                 "M_S": st.by_cause.get("stage_imbalance"), "M_S paper": ms,
                 "verdict": st.verdict, "median step s": d.steps.median_ns / 1e9})
for r in rows:
    print(" | ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))

# %% [markdown]
# S per trace, ours beside the paper's.

# %%
fig = go.Figure([go.Bar(name="rankscope", x=[r["trace"] for r in rows], y=[r["S"] for r in rows]),
                 go.Bar(name="OSDI'25 paper", x=[r["trace"] for r in rows], y=[r["S paper"] for r in rows])])
fig.update_layout(barmode="group", yaxis_title="slowdown S = T / T_ideal", title="What-if slowdown per trace")
fig

# %% [markdown]
# Which workers cost the most in AR? Each worker's S_w (the slowdown left when only that worker
# is made ideal; the paper's min(S_dp, S_stage)), from the report's `top_workers`.

# %%
d, _ = diagnoses["AR"]
top = d.stragglers.top_workers
go.Figure(go.Bar(x=[f"rank {w.endpoint}" for w in top], y=[w.slowdown for w in top])).update_layout(
    yaxis_title="S_w of the worker", title="AR: workers by what-if slowdown")
