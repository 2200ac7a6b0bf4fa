"""Store.read goes through polars' own parquet reader: parts older than a column still read, with nulls."""
import pyarrow as pa
import pyarrow.parquet as pq

from rankscope.collectors.schema import schema
from rankscope.collectors.store import Store


def test_part_written_before_a_column_was_appended_reads_with_nulls(tmp_path):
    sch = schema("step_mark")
    old = pa.table({f.name: pa.array(["j"] if f.type == pa.string() else [7], f.type) for f in list(sch)[:-1]})
    d = tmp_path / "step_mark" / "job=j"
    d.mkdir(parents=True)
    pq.write_table(old, d / "part-00000000000000000001-aaaaaaaaaaaa.parquet")
    st = Store(tmp_path)
    df = st.read("step_mark", "j")
    assert df.columns == sch.names
    assert df[sch.names[-1]].null_count() == 1 and df["step"].to_list() == [7]
    assert st.read("step_mark", "j", columns=["rank"]).columns == ["rank"]
    assert st.count("step_mark", "j") == 1 and st.count("step_mark", "other") == 0
