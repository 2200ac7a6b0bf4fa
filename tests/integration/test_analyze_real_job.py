"""REAL: `rankscope analyze` on the shared gloo DP2 x PP2 job.

Black-box: the job runs in 4 network namespaces under softflowd (see
netns_job.py); from the IPFIX flows alone, analyze must name the DP groups and
the pipeline order (by address; the endpoint map turns them into ranks).
White-box: the same job's Kineto traces (torch.profiler), imported with
`rankscope ingest`, must give the same groups by rank. Truth is the job's own
layout (Megatron order: stage = rank // dp, dp_rank = rank % dp) and the p2p
calls it logged itself (activations go from stage 0 to stage 1 first).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.cli.main import main

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "jobs" / "train_dp_pp.py"
DP, PP = 2, 2
DP_GROUPS = sorted(sorted(s * DP + d for d in range(DP)) for s in range(PP))
PIPELINES = sorted([s * DP + d for s in range(PP)] for d in range(DP))


def _first_sender(comm: list[dict]) -> dict:
    """Per pipeline edge, who sent first (in the job's own issue order): upstream -> downstream."""
    out = {}
    for c in comm:
        if c["op"] == "send" and c.get("peer") is not None:
            out.setdefault(frozenset((c["rank"], c["peer"])), (c["rank"], c["peer"]))
    return out


@pytest.mark.netns
@pytest.mark.torchjob
@pytest.mark.slow
def test_flows_of_the_namespaced_job_name_dp_groups_and_pipeline_order(tmp_path_factory, report_schema):
    from tests.integration.netns_job import netns_skip_reason, shared_netns_run

    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    run = shared_netns_run(tmp_path_factory.mktemp("analyze-netns"))
    out = tmp_path_factory.mktemp("reports")
    assert main(["analyze", "--store", str(run.store), "--job", run.flow_job, "--out-dir", str(out),
                 "--no-html"]) == 0
    reps = sorted(out.glob("*.json"))
    assert [p.name for p in reps] == [f"{run.flow_job}.json"], "one training job in the capture"
    rep = json.loads(reps[0].read_text())
    import jsonschema

    jsonschema.validate(rep, report_schema)
    s = rep["strategy"]
    rank = run.endpoints
    assert (s["dp"], s["pp"], s["world_size"]) == (DP, PP, DP * PP), s
    assert sorted(sorted(rank[a] for a in g) for g in s["dp_groups"]) == DP_GROUPS
    pipes = sorted([rank[a] for a in g] for g in s["pp_groups"])
    assert pipes == PIPELINES
    # the order must agree with who the job itself had send first
    for edge, (up, down) in _first_sender(run.comm).items():
        for p in pipes:
            if set(p) == set(edge):
                assert p.index(up) < p.index(down)



@pytest.mark.torchjob
def test_kineto_traces_of_the_job_give_the_same_groups_by_rank(tmp_path, report_schema):
    pytest.importorskip("torch")
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists() or not JOB.is_file():
        pytest.skip("torchrun or the shared job script missing")
    cmd = [str(torchrun), "--nproc_per_node=4", "--standalone", str(JOB), "--steps", "3",
           "--hidden", "64", "--out", str(tmp_path / "out"), "--profile", str(tmp_path / "prof")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    store, out = tmp_path / "store", tmp_path / "reports"
    assert main(["ingest", str(tmp_path / "prof"), "--store", str(store), "--job", "gloo", "-q"]) == 0
    assert main(["analyze", "--store", str(store), "--out-dir", str(out), "--no-html"]) == 0
    assert [p.name for p in out.glob("*.json")] == ["gloo.json"]
    rep = json.loads((out / "gloo.json").read_text())
    import jsonschema

    jsonschema.validate(rep, report_schema)
    s = rep["strategy"]
    assert (s["dp"], s["pp"], s["world_size"]) == (DP, PP, DP * PP), s
    assert sorted(map(sorted, s["dp_groups"])) == DP_GROUPS
    assert sorted(s["pp_groups"]) == PIPELINES  # ordered first stage -> last
    assert rep["steps"]["count"] >= 2
