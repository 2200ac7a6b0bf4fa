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
# # Switch flow records to the parallel strategy
#
# A training job's network traffic alone tells its parallel layout: data-parallel groups
# exchange large, bursty gradient collectives once per step; pipeline stages exchange small,
# steady activations with their neighbours. This notebook ingests an IPFIX capture from the
# outside validation corpus (made by a generator that shares no code with rankscope), infers the
# strategy from the flows alone, and scores it against the capture's truth.

# %%
import json
import os
import tempfile
from pathlib import Path

import plotly.graph_objects as go
import polars as pl

from rankscope.analysis.diagnose import analyze_job
from rankscope.analysis.runner.plan import load_planned, plan_jobs
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.importers.contract import ImportOptions
from rankscope.collectors.store import Store

SHARED = Path(os.environ.get("RANKSCOPE_SHARED", Path.cwd().parent.parent / "shared"))
CASE = SHARED / "validation" / "flows" / "V1-128-pp4-dp4"
truth = json.loads((CASE / "truth.json").read_text())["jobs"][0]
work = Path(tempfile.mkdtemp(prefix="rankscope-flows-"))

# %% [markdown]
# Ingest the capture under the capture name `fabric`, then let job recognition split it into jobs.

# %%
store = Store(work / "st")
ingest(store, [CASE / "flows.ipfix"], opts=ImportOptions(job="fabric"))
flows = store.read("flow", "fabric")
print(f"{flows.height} flow records, {flows['src_addr'].n_unique()} sources, "
      f"{flows['size_bytes'].sum() / 1e9:.1f} GB")
plan = plan_jobs(store)
print([p.name for p in plan])

# %%
frames = load_planned(store, plan[0])
d, tables = analyze_job(frames)
s = d.strategy
print(f"inferred dp={s.dp} pp={s.pp} tp={s.tp} confidence={s.confidence:.2f}")
print(f"truth    dp={truth['dp']} pp={truth['pp']} tp={truth['tp']}")
same_dp = sorted(map(sorted, s.dp_groups)) == sorted(map(sorted, truth["dp_groups_ip"]))
same_pp = sorted(map(tuple, s.pp_groups)) == sorted(map(tuple, truth["pp_groups_ip"]))
print("DP groups exact:", same_dp, "| pipelines exact and in stage order:", same_pp)

# %% [markdown]
# The traffic matrix between the endpoints of the first pipeline and their DP peers: pipeline
# neighbours exchange activations, DP peers exchange gradients.

# %%
members = sorted({a for g in s.dp_groups[:2] for a in g} | set(s.pp_groups[0]) if s.pp_groups else set())
pairs = (flows.filter(pl.col("src_addr").is_in(members) & pl.col("dst_addr").is_in(members))
         .group_by("src_addr", "dst_addr").agg(pl.col("size_bytes").sum()))
idx = {a: i for i, a in enumerate(members)}
z = [[0.0] * len(members) for _ in members]
for a, b, n in pairs.iter_rows():
    z[idx[a]][idx[b]] = n / 1e9
go.Figure(go.Heatmap(z=z, x=members, y=members, colorbar_title="GB")).update_layout(
    title="bytes sent (row) to (column)", xaxis_title="destination", yaxis_title="source")
