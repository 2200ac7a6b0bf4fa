"""Store transactions: one copy per source, nothing visible before the commit, nothing left by a failure."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest

from rankscope.collectors.errors import UsageError
from rankscope.collectors.importers.contract import ImportOptions
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.store import Store, check_job_name
from tests.unit.collectors.test_flight_recorder import nccl_dump
from tests.unit.collectors.test_ingest import write_comm_csv

INGEST = "from rankscope.collectors.ingest.files import ingest; from rankscope.collectors.store import Store; " \
         "import sys; s = ingest(Store(sys.argv[1]), [sys.argv[2]]); print(s.files[0].status)"


def test_concurrent_ingests_of_one_file_store_it_once(tmp_path):
    src = tmp_path / "comm_op.csv"
    write_comm_csv(src, 200)
    for i in range(4):
        st = tmp_path / f"st{i}"
        procs = [subprocess.Popen([sys.executable, "-c", INGEST, str(st), str(src)], stdout=subprocess.PIPE,
                                  text=True) for _ in range(3)]
        outs = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
        assert all(p.returncode == 0 for p in procs)
        assert outs == ["ingested", "skipped", "skipped"], outs
        store = Store(st)
        assert store.count("comm_op") == 200 and len(store.manifest()) == 1


def test_default_job_spelled_two_ways_is_one_source(tmp_path):
    src = tmp_path / "comm_op.csv"
    write_comm_csv(src, 10)
    st = Store(tmp_path / "st")
    assert ingest(st, [src]).count("ingested") == 1
    assert ingest(st, [src], opts=ImportOptions(job="default")).count("skipped") == 1
    assert st.count("comm_op") == 10
    assert ingest(st, [src], opts=ImportOptions(job="other")).count("ingested") == 1


def test_pickle_and_json_of_one_dump_are_one_source(tmp_path):
    (tmp_path / "nccl_trace_rank_3").write_bytes(pickle.dumps(nccl_dump()))
    (tmp_path / "rank3.fr.json").write_text(json.dumps(nccl_dump()))
    st = Store(tmp_path / "st")
    s = ingest(st, [tmp_path / "nccl_trace_rank_3", tmp_path / "rank3.fr.json"])
    assert [f.status for f in s.files] == ["ingested", "skipped"]
    assert st.count("comm_op") == 5


def test_uncommitted_parts_are_invisible_and_cleaned(tmp_path):
    src = tmp_path / "comm_op.csv"
    write_comm_csv(src, 10)
    st = Store(tmp_path / "st")
    ingest(st, [src])
    # A crash after the parts were written, before the manifest entry (the commit):
    for m in st.manifest_dir().glob("*.json"):
        m.unlink()
    tmp = st.root / "comm_op" / "job=default" / ".part-0123456789abcdef-01790000000000000000-abcdef012345.parquet.tmp"
    tmp.write_bytes(b"half")
    assert st.count("comm_op") == 0 and st.jobs() == []
    st2 = Store(st.root)
    with st2.writer_lock():
        pass
    left = [p.name for p in (st.root / "comm_op" / "job=default").iterdir()]
    assert left == []
    assert ingest(st2, [src]).count("ingested") == 1 and st2.count("comm_op") == 10


def test_failed_file_leaves_no_rows(tmp_path):
    src = tmp_path / "comm_op.csv"
    write_comm_csv(src, 20, bad=set(range(20)))
    st = Store(tmp_path / "st")
    s = ingest(st, [src])
    assert s.files[0].status == "failed" and "all 20 rejected" in s.files[0].error
    assert st.count("comm_op") == 0 and st.manifest() == []


@pytest.mark.parametrize("bad", ["abc\n", ".", "..", "../x", "-a", "a/b", "", "x" * 129, "a:b", "é"])
def test_job_names_refused(bad):
    with pytest.raises(UsageError):
        check_job_name(bad)


def test_job_names_checked_on_read(tmp_path):
    st = Store(tmp_path / "st")
    outside = tmp_path / "x" / "comm_op" / "job=s"
    outside.mkdir(parents=True)
    for job in ["../../x/comm_op/job=s", "*", "a\n"]:
        with pytest.raises(UsageError):
            st.read("comm_op", job)
    assert check_job_name("A.b_c-1" + "x" * 120) and check_job_name("0")


def _rows(kind: str, n: int):
    import polars as pl

    from rankscope.collectors.schema import conform

    cols = {"job": "j", "rank": list(range(n)), "start_ns": 0, "end_ns": 5, "source": "t"}
    cols.update({"op": "all_reduce"} if kind == "comm_op" else {"name": "gemm", "category": "gemm"})
    return conform(pl.DataFrame(cols), kind)


def test_kinds_written_at_once_are_noted_in_order_and_kept(tmp_path):
    from rankscope.collectors.store import ManifestEntry

    st = Store(tmp_path / "st")
    key = Store.manifest_key("0" * 64, "j")
    tables = [("comm_op", _rows("comm_op", 3)), ("compute_op", _rows("compute_op", 5))]
    with st.transaction(key, keep_rows=True) as tx:
        tx.write_kinds(tables)
        assert [k for k, *_ in tx.kept] == ["comm_op", "compute_op"]
        assert [p.parent.parent.name for p in tx.written] == ["comm_op", "compute_op"]
        tx.commit(ManifestEntry(key=key, source="s", format="t", job="j"))
    assert st.count("comm_op") == 3 and st.count("compute_op") == 5
    assert len(st.manifest()[0].parts) == 2


def test_a_kind_that_fails_beside_another_leaves_no_part(tmp_path, monkeypatch):
    from rankscope.collectors.errors import StoreError

    st = Store(tmp_path / "st")
    real = Store.write_parts

    def failing(self, kind, table, job=None, *, prefix="part"):
        if kind == "compute_op":
            raise StoreError("disk full")
        return real(self, kind, table, job, prefix=prefix)

    monkeypatch.setattr(Store, "write_parts", failing)
    with pytest.raises(StoreError), st.transaction(Store.manifest_key("1" * 64, "j")) as tx:
        tx.write_kinds([("comm_op", _rows("comm_op", 3)), ("compute_op", _rows("compute_op", 5))])
    # the comm_op part written beside the failure was noted, so the rollback removed it
    assert not list((tmp_path / "st").rglob("*.parquet"))


def test_tables_of_one_kind_keep_their_order_and_a_late_failure_leaves_no_part(tmp_path, monkeypatch):
    from rankscope.collectors.errors import StoreError
    from rankscope.collectors.store import ManifestEntry

    st = Store(tmp_path / "st")
    key = Store.manifest_key("2" * 64, "j")
    tables = [("comm_op", _rows("comm_op", 1)), ("compute_op", _rows("compute_op", 2)),
              ("comm_op", _rows("comm_op", 3)), ("comm_op", _rows("comm_op", 4))]
    with st.transaction(key, keep_rows=True) as tx:
        tx.write_kinds(tables)
        tx.commit(ManifestEntry(key=key, source="s", format="t", job="j"))
    # a store is read in part-name order: the comm_op tables come back in the order they were given
    assert st.read("comm_op", "j")["rank"].to_list() == [0, 0, 1, 2, 0, 1, 2, 3]
    real = Store.write_parts
    calls = []

    def third_fails(self, kind, table, job=None, *, prefix="part"):
        calls.append(kind)
        if kind == "comm_op" and calls.count("comm_op") == 3:
            raise StoreError("disk full")
        return real(self, kind, table, job, prefix=prefix)

    monkeypatch.setattr(Store, "write_parts", third_fails)
    before = set((tmp_path / "st").rglob("*.parquet"))
    with pytest.raises(StoreError), st.transaction(Store.manifest_key("3" * 64, "j")) as tx:
        tx.write_kinds(tables)
    # the two comm_op parts written before the failure, and compute_op's, were noted and rolled back
    assert set((tmp_path / "st").rglob("*.parquet")) == before
