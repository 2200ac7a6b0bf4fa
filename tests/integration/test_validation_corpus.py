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


def test_stage_order_comes_from_traffic_not_from_address_order(scorer, tmp_path):
    """V1 with every host renumbered in reverse: the pipelines must come out reversed in address
    terms too (the generator numbers hosts in stage order, which a sort by address would copy)."""
    import polars as pl

    from rankscope.collectors.ingest import ingest
    from rankscope.collectors.store import Store

    src = VALIDATION / "flows" / "V1-128-pp4-dp4"
    st = Store(tmp_path / "st")
    ingest(st, [src / "flows.ipfix"])
    flow = st.read("flow")
    hosts = sorted({int(a.split(".")[2]) for a in flow["src_addr"].to_list() + flow["dst_addr"].to_list()})
    top = max(hosts)

    def flip(col: str) -> pl.Expr:
        parts = pl.col(col).str.split(".")
        return pl.concat_str([parts.list.get(0), parts.list.get(1),
                              (top - parts.list.get(2).cast(pl.Int64)).cast(pl.String), parts.list.get(3)],
                             separator=".").alias(col)

    flipped = flow.with_columns(flip("src_addr"), flip("dst_addr"))
    (tmp_path / "in").mkdir()
    flipped.drop("job").write_parquet(tmp_path / "in" / "flow-flipped.parquet")
    r = subprocess.run([str(BIN / "rankscope"), "ingest", str(tmp_path / "in"), "--store", str(tmp_path / "st2"),
                        "--job", "flipped", "-q"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([str(BIN / "rankscope"), "analyze", "--store", str(tmp_path / "st2"), "--out-dir",
                        str(tmp_path / "rep"), "--no-html"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads((tmp_path / "rep" / "flipped.json").read_text())
    truth = json.loads((src / "truth.json").read_text())["jobs"][0]

    def flip_ip(a: str) -> str:
        o = a.split(".")
        return ".".join([o[0], o[1], str(top - int(o[2])), o[3]])

    want = sorted([flip_ip(x) for x in p] for p in truth["pp_groups_ip"])
    assert sorted(rep["strategy"]["pp_groups"]) == want
