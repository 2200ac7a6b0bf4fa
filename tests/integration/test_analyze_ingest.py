"""``rankscope analyze --ingest``: one process gives the reports of ``ingest`` then ``analyze``.

On the three OSDI'25 reference traces: the JSON reports are equal key for key (timings aside), the store is
still written, the rows just written are analysed from memory (comm_op and compute_op are not read back), a
store that already held the job is read as usual, and a file that fails stops before any report.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from rankscope.cli.main import main
from rankscope.collectors.fresh_rows import FreshRows
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.job_frames import KINDS_FOR_ANALYSIS
from rankscope.collectors.store import Store

TRACES = ["ST", "AR", "SE"]


@pytest.fixture(autouse=True)
def no_cache(monkeypatch):
    monkeypatch.setenv("RANKSCOPE_NO_CACHE", "1")  # every run computes: the comparison is of computations


@pytest.fixture(scope="module")
def osdi(reference_dir):
    d = reference_dir / "stragglers-osdi25"
    if not d.is_dir():
        pytest.skip(f"{d} not found")
    return d


def _report(out, name) -> dict:
    def scrub(x):
        if isinstance(x, dict):
            return {k: scrub(v) for k, v in x.items() if k != "seconds"}  # wall time of a section
        if isinstance(x, list):
            return [scrub(v) for v in x]
        return x

    return scrub(json.loads((out / f"{name}.json").read_text()))


@pytest.fixture
def store_reads(monkeypatch):
    """(kind, job) of every Store.read call."""
    calls = []
    read = Store.read

    def spy(self, kind, job=None, columns=None):
        calls.append((kind, job))
        return read(self, kind, job, columns)

    monkeypatch.setattr(Store, "read", spy)
    return calls


@pytest.mark.parametrize("name", TRACES)
def test_one_process_report_equals_ingest_then_analyze(osdi, tmp_path, name, store_reads):
    trace = str(osdi / f"trace-{name}.parquet")
    two, one = tmp_path / "two", tmp_path / "one"
    assert main(["ingest", "-q", trace, "--store", str(two / "st")]) == 0
    assert main(["analyze", "--store", str(two / "st"), "--out-dir", str(two / "out"), "--no-html"]) == 0
    assert ("comm_op", name) in store_reads  # the two-command flow reads its rows back
    store_reads.clear()
    assert main(["analyze", "--ingest", trace, "--store", str(one / "st"), "--out-dir", str(one / "out"),
                 "--no-html"]) == 0
    assert not {("comm_op", name), ("compute_op", name)} & set(store_reads)  # taken from memory
    assert _report(one / "out", name) == _report(two / "out", name)
    # the store is still the record: the same jobs and rows as the two-command flow wrote
    a, b = Store(two / "st"), Store(one / "st")
    assert b.jobs() == a.jobs() == [name]
    for kind in ("comm_op", "compute_op"):
        assert b.read(kind, name).equals(a.read(kind, name))


def test_rows_kept_equal_the_store_read(osdi, tmp_path):
    """What the analysis gets from memory is what a read of the store gives: values, dtypes and row order."""
    store = Store(tmp_path / "st")
    summary = ingest(store, [osdi], keep_rows=True)
    fresh = FreshRows.from_summary(summary)
    for name in TRACES:
        held = fresh.frames(store, name, KINDS_FOR_ANALYSIS)
        assert sorted(held) == ["comm_op", "compute_op"]
        for kind, df in held.items():
            want = store.read(kind, name)
            assert df.schema == want.schema
            assert df.equals(want), (name, kind)


def test_store_with_the_job_already_is_read_whole(osdi, tmp_path, store_reads):
    """A second --ingest of the same file adds nothing (skipped): the job is read from the store, same report."""
    trace = str(osdi / "trace-ST.parquet")
    st = str(tmp_path / "st")
    assert main(["analyze", "--ingest", trace, "--store", st, "--out-dir", str(tmp_path / "a"), "--no-html"]) == 0
    store_reads.clear()
    assert main(["analyze", "--ingest", trace, "--store", st, "--out-dir", str(tmp_path / "b"), "--no-html"]) == 0
    assert ("comm_op", "ST") in store_reads
    assert _report(tmp_path / "b", "ST") == _report(tmp_path / "a", "ST")


def test_rows_beside_older_ones_are_not_taken_alone(tmp_path):
    """Memory holds only this run's parts; a kind with other parts in the store is not taken from it."""
    store = Store(tmp_path / "st")
    df = pl.DataFrame({"job": ["j"], "rank": [0], "name": ["fwd"], "category": ["forward"],
                       "start_ns": [0], "end_ns": [5], "source": ["t"]})
    from rankscope.collectors.schema import validate

    store.write("compute_op", validate(df, "compute_op").table)
    with store.transaction("ab" * 16, keep_rows=True) as tx:
        tx.write("compute_op", validate(df.with_columns(pl.lit(7).alias("start_ns"), pl.lit(9).alias("end_ns")),
                                        "compute_op").table)
        kept = tx.kept
    assert len(kept) == 1
    from rankscope.collectors.store import ManifestEntry

    store.add_manifest(ManifestEntry(key="ab" * 16, source="x", format="t", job="j", sha256="0"))
    assert FreshRows(kept).frames(store, "j", ("compute_op",)) == {}


def test_failed_file_stops_before_any_report(osdi, tmp_path):
    bad = tmp_path / "trace-XX.parquet"  # the OSDI format, every record rejected (unknown optype)
    pl.DataFrame({c: [1] for c in ("dp_rank", "stage", "rank", "step", "seq_id", "mc", "mb_id")}).with_columns(
        optype=pl.lit("bogus"), start_ts=pl.lit(0.0), duration=pl.lit(1.0)).write_parquet(bad)
    out = tmp_path / "out"
    rc = main(["analyze", "--ingest", str(osdi / "trace-ST.parquet"), "--ingest", str(bad), "--store",
               str(tmp_path / "st"), "--out-dir", str(out), "--no-html"])
    assert rc == 1
    assert not out.exists() or not list(out.iterdir())


def test_one_process_imports_only_what_it_uses(osdi, tmp_path):
    """A JSON-only ``analyze --ingest`` loads no plotly, scipy, pandas, pyarrow.compute or tqdm (off a terminal):
    each is a measurable share of a small trace's whole run (see benchmarks/bench_whatif.py)."""
    import subprocess
    import sys

    code = ("import sys\nfrom rankscope.cli.main import main\n"
            f"rc = main(['analyze', '--ingest', {str(osdi / 'trace-ST.parquet')!r}, '--store', "
            f"{str(tmp_path / 'st')!r}, '--out-dir', {str(tmp_path / 'out')!r}, '--no-html'])\n"
            "heavy = ('plotly', 'scipy', 'pandas', 'pyarrow.compute', 'pyarrow.dataset', 'tqdm')\n"
            "print(rc, sorted(m for m in sys.modules if m in heavy))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "0 []"


def test_import_frozen_freezes_only_when_it_loads_something():
    import gc

    from rankscope.cli.startup import import_frozen

    before = gc.get_freeze_count()
    import_frozen("json", "polars")  # loaded already
    assert gc.get_freeze_count() == before
    assert gc.isenabled()
