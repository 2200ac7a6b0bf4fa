"""Sizes an input declares are claims: checked against the ranks seen and the format's limits, counted, and
listed only up to a cap; a claim set aside is named in data_quality (issue 41)."""

import resource
import subprocess
import sys
import textwrap

import polars as pl

from rankscope.analysis.diagnose import diagnose
from rankscope.analysis.model.coverage import MISSING_LISTED, rank_coverage
from rankscope.collectors.job_frames import JobFrames, declared_world


def _comp(ranks):
    return pl.DataFrame({"rank": ranks, "name": ["f"] * len(ranks), "category": ["forward"] * len(ranks),
                         "start_ns": [0] * len(ranks), "end_ns": [10] * len(ranks)})


def _bounded(code: str, limit_bytes: int = 2 << 30, timeout_s: float = 120) -> str:
    """Run ``code`` in a child whose address space is capped: the unbounded code dies of MemoryError there
    instead of taking the shared machine."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       preexec_fn=cap, timeout=timeout_s)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_a_declared_world_of_10_to_the_9_is_counted_not_built():
    out = _bounded("""
        import polars as pl
        from rankscope.analysis.model.coverage import rank_coverage
        from rankscope.collectors.job_frames import JobFrames
        f = JobFrames.from_frames("j", compute_op=pl.DataFrame({"rank": [0, 5], "name": ["f", "f"],
                                  "category": ["forward"] * 2, "start_ns": [0, 0], "end_ns": [1, 1]}))
        f.declared = [{"format": "kineto", "world_size": 10**9, "source": "a.json"}]
        cov = rank_coverage(f)
        print(cov.ranks.missing, len(cov.missing_ranks), cov.missing_ranks[:6], cov.ranks.listed)
        print(cov.ranks.note)
    """)
    head, note = out.splitlines()
    assert head == f"999999998 {MISSING_LISTED} [1, 2, 3, 4, 6, 7] {MISSING_LISTED}"
    assert "kineto declares world_size 1,000,000,000" in note and "999,999,998 missing" in note


def test_named_ranks_outside_the_declared_world_are_merged_in_order():
    comm = pl.DataFrame({"rank": [0], "op": ["all_reduce"], "group_ranks": [[0, 1, 9]], "peer": [None],
                         "start_ns": [0], "end_ns": [5]}, schema_overrides={"peer": pl.Int32})
    f = JobFrames.from_frames("j", comm_op=comm, compute_op=_comp([0, 2]))
    f.declared = [{"format": "kineto", "world_size": 4, "source": "a"}]
    cov = rank_coverage(f)
    assert cov.missing_ranks == [1, 3, 9] and cov.ranks.missing == 3 and cov.ranks.listed is None


def test_a_world_beyond_32_bit_ranks_is_set_aside_and_named():
    f = JobFrames.from_frames("j", compute_op=_comp([0, 1]))
    f.declared = [{"format": "kineto", "world_size": 2**40, "source": "big.json"}]
    dq = diagnose(f).data_quality
    assert dq.missing_ranks == [] and dq.ranks.declared_world_size is None
    assert len(dq.ranks.set_aside) == 1 and "big.json" in dq.ranks.set_aside[0]
    assert "rank column can hold" in dq.ranks.set_aside[0]


def test_an_osdi_meta_whose_world_contradicts_its_layout_is_set_aside():
    notes = {"layout": {"world_size": 100_000_000, "dp_size": 4, "pp_size": 4, "tp_size": 4, "dsp_size": 1}}
    d = declared_world("whatif_parquet", notes)
    assert "64" in d["doubt"]
    ok = declared_world("whatif_parquet", {"layout": {"world_size": 64, "dp_size": 4, "pp_size": 4, "tp_size": 4}})
    assert "doubt" not in ok
    f = JobFrames.from_frames("j", compute_op=_comp([0, 1]))
    f.declared = [{**d, "source": "meta-X.yaml"}]
    dq = diagnose(f).data_quality
    assert dq.ranks.missing == 0 and "meta-X.yaml" in dq.ranks.set_aside[0]


def test_a_kineto_rank_at_or_above_its_world_size_is_a_doubt():
    assert "2,147,483,647" in declared_world("kineto", {"world_size": 8, "rank": 2**31 - 1})["doubt"]
    assert "doubt" not in declared_world("kineto", {"world_size": 8, "rank": 7})


OSDI_ST = "/work/shared/reference/stragglers-osdi25/trace-ST.parquet"
KINETO = __import__("pathlib").Path(__file__).parents[2] / "data" / "gloo_dp2pp2tp2" / "kineto" / "rank0.json.gz"


def _analyze_bounded(store, out, *sources) -> dict:
    """ingest + analyze through the CLI in a child capped at 4 GiB of address space (polars' thread pools
    reserve more than they touch) and 120 s; its peak resident memory must stay under 1.5 GiB."""
    import json

    _bounded(f"""
        import sys
        from rankscope.cli.main import main
        assert main(["ingest", "--store", {str(store)!r}, *{[str(s) for s in sources]!r}]) == 0
        rc = main(["analyze", "--store", {str(store)!r}, "--out-dir", {str(out)!r}])
        # VmHWM is this process's own peak; ru_maxrss would start at the forking test process's RSS
        peak_kib = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM"))
        assert peak_kib < 1536 * 1024, f"peak {{peak_kib}} KiB, over 1.5 GiB"
        sys.exit(rc)
    """, limit_bytes=4 << 30)
    return json.loads(next(out.glob("*.json")).read_text())


def test_osdi_meta_declaring_10_to_the_8_ranks_analyzes_bounded(tmp_path):
    import os

    import pytest
    if not os.path.exists(OSDI_ST):
        pytest.skip("the OSDI'25 reference traces are not on this machine")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "trace-ST.parquet").symlink_to(OSDI_ST)  # read in place
    (tmp_path / "in" / "meta-ST.yaml").write_text("dp_size: 2\ndsp_size: 1\npp_size: 4\ntp_size: 1\n"
                                                    "world_size: 100000000\n")
    rep = _analyze_bounded(tmp_path / "st", tmp_path / "out", tmp_path / "in")
    assert rep["strategy"]["world_size"] == 8
    assert "world_size 100,000,000" in rep["data_quality"]["ranks"]["set_aside"][0]


def test_kineto_declaring_10_to_the_9_ranks_analyzes_bounded(tmp_path):
    import gzip
    import json

    doc = json.loads(gzip.decompress(KINETO.read_bytes()))
    doc["distributedInfo"]["world_size"] = 10**9
    src = tmp_path / "rank0.json"
    src.write_text(json.dumps(doc))
    rep = _analyze_bounded(tmp_path / "st", tmp_path / "out", src)
    dq = rep["data_quality"]
    assert dq["ranks"]["missing"] == 10**9 - 1 and len(dq["missing_ranks"]) == MISSING_LISTED
    assert dq["ranks"]["listed"] == MISSING_LISTED and "1,000,000,000" in dq["ranks"]["note"]
