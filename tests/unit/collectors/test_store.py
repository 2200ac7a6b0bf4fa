from __future__ import annotations

import os

import polars as pl
import pyarrow.parquet as pq
import pytest

from rankscope.collectors import schema
from rankscope.collectors.errors import StoreError, UsageError
from rankscope.collectors.store import Store


def _steps(job="j", n=3):
    df = pl.DataFrame({"job": [job] * n, "rank": [0] * n, "step": list(range(n)),
                       "start_ns": [i * 10 for i in range(n)], "end_ns": [i * 10 + 5 for i in range(n)]})
    return schema.conform(df, "step_mark")


def test_write_layout_is_hive_by_kind_and_job(tmp_path):
    st = Store(tmp_path)
    p = st.write("step_mark", _steps("a"))
    assert p.parent == tmp_path / "step_mark" / "job=a" and p.name.startswith("part-")
    assert pq.read_schema(p).names == schema.schema("step_mark").names
    assert not [f for f in p.parent.iterdir() if f.name.endswith(".tmp")]


def test_scan_and_duckdb_views(tmp_path):
    st = Store(tmp_path)
    st.write("step_mark", _steps("a", 3))
    st.write("step_mark", _steps("b", 2))
    assert st.scan("step_mark").collect().height == 5
    assert st.scan("step_mark", "b").collect().height == 2
    assert st.jobs() == ["a", "b"]
    con = st.duckdb()
    assert con.execute("select count(*) from step_mark").fetchone()[0] == 5
    # every kind has a view, empty when absent, with the declared columns
    for kind in schema.SCHEMAS:
        cols = [d[0] for d in con.execute(f"select * from {kind} limit 0").description]
        assert cols == schema.schema(kind).names


def test_multi_job_table_is_split(tmp_path):
    st = Store(tmp_path)
    both = pl.concat([pl.from_arrow(_steps("a")), pl.from_arrow(_steps("b"))])
    st.write("step_mark", schema.conform(both, "step_mark"))
    assert st.count("step_mark", "a") == 3 and st.count("step_mark", "b") == 3


def test_old_parts_without_new_columns_still_read(tmp_path):
    st = Store(tmp_path)
    d = tmp_path / "step_mark" / "job=a"
    d.mkdir(parents=True)
    pq.write_table(_steps("a").drop_columns(["source"]), d / "part-old.parquet")
    df = st.read("step_mark", "a")
    assert df.columns == schema.schema("step_mark").names and df["source"].null_count() == 3


def test_bad_job_name(tmp_path):
    with pytest.raises(UsageError, match="job name"):
        Store(tmp_path).write("step_mark", _steps("a"), job="../escape")


def test_wrong_schema_refused(tmp_path):
    with pytest.raises(StoreError, match="validate it first"):
        Store(tmp_path).write("step_mark", _steps("a").drop_columns(["source"]))


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_store_raises_store_error(tmp_path):
    (tmp_path / "step_mark").mkdir()
    os.chmod(tmp_path / "step_mark", 0o500)
    with pytest.raises((StoreError, PermissionError)):
        Store(tmp_path).write("step_mark", _steps("a"))


def test_job_override_keeps_schema(tmp_path):
    st = Store(tmp_path)
    st.write("step_mark", _steps("a"), job="b")
    assert st.jobs() == ["b"] and st.read("step_mark", "b")["job"].to_list() == ["b"] * 3
