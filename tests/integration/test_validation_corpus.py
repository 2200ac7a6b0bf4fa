"""The outside check of black-box inference: every IPFIX capture of ../shared/validation (an independent
generator with exact truth), ingested and analysed with the CLI, scored by the corpus's own scorer.

Each case must pass every scored check: jobs found, dp, pp, tp, DP groups, pipelines in stage order, and
for V5 the slow NIC named (verdict communication, its address first). Read in place, never copied.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED, missing_shared

VALIDATION = SHARED / "validation"
CASES = sorted(p.name for p in (VALIDATION / "flows").glob("*")) if (VALIDATION / "flows").is_dir() else []
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scorer() -> Path:
    p = VALIDATION / "score.py"
    if not p.is_file():
        missing_shared(f"validation corpus at {VALIDATION}")
    return p


def test_the_corpus_is_there(scorer):
    assert len(CASES) == 6, CASES


@pytest.mark.parametrize("case", CASES)
def test_every_scored_check_passes(case, scorer, report_schema, tmp_path):
    import jsonschema

    src = VALIDATION / "flows" / case
    st, out = tmp_path / "st", tmp_path / "rep"
    r = subprocess.run([str(BIN / "rankscope"), "ingest", str(src), "--store", str(st), "-q"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([str(BIN / "rankscope"), "analyze", "--store", str(st), "--out-dir", str(out), "--no-html"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    reports = sorted(out.glob("*.json"))
    for rep in reports:
        jsonschema.validate(json.loads(rep.read_text()), report_schema)
    s = subprocess.run([sys.executable, str(scorer), str(src / "truth.json"), *map(str, reports), "--side", "ip"],
                       capture_output=True, text=True, timeout=120)
    assert s.returncode == 0, s.stdout[-3000:]
    # a fault-free case must not name a culprit: a wrong answer is worse than none
    truth = json.loads((src / "truth.json").read_text())
    for job, rep in zip(truth["jobs"], reports):
        if (job.get("fault") or {}).get("kind", "none") == "none":
            assert json.loads(rep.read_text())["stragglers"]["verdict"] == "none", rep
