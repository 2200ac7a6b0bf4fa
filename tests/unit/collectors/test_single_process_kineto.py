"""Kineto traces from single-process runs (HTA's ROCm, Triton and CPU-only test data) load as rank 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.collectors.importers.contract import ImportOptions
from rankscope.collectors.importers.kineto.chrome_trace import SINGLE_PROCESS_NOTE
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.store import Store

HTA = Path(__file__).resolve().parents[2] / "data" / "hta"
NO_DIST_INFO = ["mi250_minitoy_train_ROCm6_2_kineto.json.gz", "triton_example.json.gz",
                "distributed_info_not_found.json.gz"]


@pytest.mark.parametrize("name", NO_DIST_INFO)
def test_trace_without_distributed_info_is_rank_0_with_a_manifest_note(tmp_path, name):
    store = Store(tmp_path / "st")
    s = ingest(store, [HTA / name], opts=ImportOptions(job="hta"))
    (f,) = s.files
    assert f.status == "ingested" and sum(f.records.values()) > 0, f
    assert f.warnings == [SINGLE_PROCESS_NOTE]
    (entry,) = [json.loads(p.read_text()) for p in (tmp_path / "st" / "_manifest").glob("*.json")]
    assert entry["notes"]["rank_assumed"] == SINGLE_PROCESS_NOTE
    ranks = store.read("compute_op", job="hta")["rank"].unique().to_list() if "compute_op" in f.records else \
        store.read("step_mark", job="hta")["rank"].unique().to_list()
    assert ranks == [0]


def test_rank_option_places_the_trace_and_drops_the_note(tmp_path):
    store = Store(tmp_path / "st")
    s = ingest(store, [HTA / "triton_example.json.gz"], opts=ImportOptions(job="hta", extra={"rank": "5"}))
    (f,) = s.files
    assert f.status == "ingested" and f.warnings == []
    assert store.read("compute_op", job="hta")["rank"].unique().to_list() == [5]


def test_a_bad_rank_option_is_a_clear_error(tmp_path):
    s = ingest(Store(tmp_path / "st"), [HTA / "triton_example.json.gz"],
               opts=ImportOptions(job="hta", extra={"rank": "two"}))
    (f,) = s.files
    assert f.status == "failed" and not f.unexpected and "--opt rank=N" in f.error and "two" in f.error


def test_a_trace_with_distributed_info_but_no_rank_is_refused_naming_the_option(tmp_path):
    doc = {"distributedInfo": {"backend": "nccl"}, "traceEvents": [
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1.0, "dur": 2.0, "pid": 1, "tid": 1}]}
    p = tmp_path / "trace.json"
    p.write_text(json.dumps(doc))
    (f,) = ingest(Store(tmp_path / "st"), [p], opts=ImportOptions(job="x")).files
    assert f.status == "failed" and "--opt rank=N" in f.error


def test_a_folder_of_unrecognised_files_is_one_summary_line(tmp_path):
    junk = tmp_path / "junk"
    junk.mkdir()
    for i in range(30):
        (junk / f"notes{i}.txt").write_text(f"nothing to see {i}\n")
    r = subprocess.run([sys.executable, "-m", "rankscope.cli.main", "ingest", str(junk), "--store",
                        str(tmp_path / "st"), "-q"], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "recognises" in ln]
    assert len(lines) == 1 and "30 file(s)" in lines[0] and "27 more" in lines[0], r.stderr
    assert r.stderr.count("kineto") == 1  # the format list once, not once per file


def test_a_parquet_footer_with_undecodable_names_is_a_clear_error(tmp_path):
    import polars as pl

    p = tmp_path / "step_mark-x.parquet"
    pl.DataFrame({"rank": [0], "step": [1], "start_ns": [10], "end_ns": [15]}).write_parquet(p)
    p.write_bytes(p.read_bytes().replace(b"start_ns", b"\xff\xferf_ns"))  # footer and Arrow schema alike
    (f,) = ingest(Store(tmp_path / "st"), [p]).files
    assert f.status == "failed" and not f.unexpected and str(p) in f.error, f
