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
