"""Two real gloo runs profiled with torch.profiler (Kineto traces): the aligned baseline (hidden 1024)
and one whose linear layers are resized to 1000. `rankscope diff` over the two ingested stores does
not call the fp32 dims misaligned (IEEE fp32 has no tensor-core alignment rule); the GEMM throughput
ratio is reported as measured (on CPU it says little about tensor cores, so its value is not asserted)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
JOB = REPO / "tests" / "jobs" / "train_dp_pp.py"

pytestmark = [pytest.mark.torchjob, pytest.mark.slow]



def _profiled_run(base: Path, hidden: int) -> Path:
    prof, store = base / f"prof{hidden}", base / f"st{hidden}"
    r = subprocess.run([str(BIN / "torchrun"), "--nproc_per_node=2", "--standalone", str(JOB),
                        "--steps", "1", "--pp", "1", "--microbatches", "2", "--layers", "1",
                        "--hidden", str(hidden), "--profile", str(prof)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ing = subprocess.run([str(BIN / "rankscope"), "ingest", str(prof), "--store", str(store), "--job", "run"],
                         capture_output=True, text=True, timeout=120)
    assert ing.returncode == 0, ing.stderr[-2000:]
    return store


@pytest.fixture(scope="module")
def diffed(tmp_path_factory):
    pytest.importorskip("torch")
    if not (BIN / "torchrun").exists() or not JOB.exists():
        pytest.skip("torchrun or tests/jobs/train_dp_pp.py missing")
    base = tmp_path_factory.mktemp("misaligned")
    a, b = _profiled_run(base, 1024), _profiled_run(base, 1000)
    out = base / "diff.json"
    r = subprocess.run([str(BIN / "rankscope"), "diff", "--baseline", str(a), "--store", str(b), "--job", "run",
                        "--json", str(out)], capture_output=True, text=True, timeout=120)
    return r, json.loads(out.read_text()) if out.exists() else None


def test_diff_does_not_call_fp32_dims_misaligned(diffed):
    # The job's GEMMs are IEEE fp32 on CPU: no tensor cores, so no alignment rule applies to 1000 / 2000
    # (analysis/kernels/alignment.py TENSOR_CORE_DTYPES). A bf16 variant of the job would be flagged.
    r, d = diffed
    assert r.returncode == 0, r.stderr[-2000:]
    assert d is not None
    assert [row for row in d["rows"] if row["aspect"] == "alignment"] == []
    assert [f for f in d["kernel_findings"] if f["check"] == "alignment"] == []
    changes = [row["change"] for row in d["rows"]]
    n_reg = changes.count("regression")
    assert changes[:n_reg] == ["regression"] * n_reg  # regressions first


def test_diff_reports_the_measured_gemm_throughput_ratio(diffed):
    _, d = diffed
    rows = [row for row in d["rows"] if row["aspect"] == "gemm_throughput"]
    assert rows, "no per-kernel-class throughput compared"
    for row in rows:
        assert row["ratio"] is not None and math.isfinite(row["ratio"]) and row["ratio"] > 0
        print(f"measured {row['item']}: {row['baseline']:.4g} -> {row['current']:.4g} TFLOP/s, ratio {row['ratio']:.3f}")
