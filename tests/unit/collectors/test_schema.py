from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankscope.collectors import schema
from rankscope.collectors.errors import SchemaError

BINDING = {
    "comm_op": "job rank op group_id group_ranks peer size_bytes dtype start_ns end_ns state seq step "
               "microbatch source",
    "compute_op": "job rank name category start_ns end_ns step microbatch stage m n k dtype flops source",
    "flow": "job exporter src_addr dst_addr src_port dst_port protocol size_bytes num_packets start_ns "
            "end_ns sampling_rate source",
    "step_mark": "job rank step start_ns end_ns",
    "batch_meta": "job rank step microbatch seq_len",
    "endpoint_map": "job address host gpu rank",
}


@pytest.mark.parametrize("kind", list(BINDING))
def test_binding_columns_present_in_order(kind):
    names = schema.schema(kind).names
    want = BINDING[kind].split()
    assert names[: len(want)] == want


@pytest.mark.parametrize("kind", list(schema.SCHEMAS))
def test_every_field_has_unit_and_description(kind):
    for f in schema.schema(kind):
        assert f.metadata is not None and b"unit" in f.metadata, f.name
        assert f.metadata[b"description"].strip(), f.name
        if f.name.endswith("_ns"):
            assert f.metadata[b"unit"] == b"ns"
        if f.name.endswith("_bytes"):
            assert f.metadata[b"unit"] == b"bytes"


def test_unknown_kind():
    with pytest.raises(SchemaError, match="unknown record kind 'nope'"):
        schema.schema("nope")


def _comm(n=5, **over):
    d = {"job": ["j"] * n, "rank": list(range(n)), "op": ["all_reduce"] * n,
         "size_bytes": [8] * n, "start_ns": [100] * n, "end_ns": [200] * n}
    d.update(over)
    return pl.DataFrame(d)


def test_validate_counts_each_reason_once():
    df = _comm(6, op=["all_reduce", "nope", "send", "recv", "barrier", "broadcast"],
               end_ns=[200, 200, 50, 200, 200, 200], size_bytes=[8, 8, 8, -1, 8, 8])
    v = schema.validate(df, "comm_op")
    assert v.table.num_rows == 3
    assert v.rejects == {"unknown op": 1, "end_ns < start_ns": 1, "negative size_bytes": 1}
    assert v.table.schema.equals(schema.schema("comm_op"))
    # state is derived from end_ns when absent
    assert set(v.table.column("state").to_pylist()) == {"completed"}


def test_validate_wrong_type_from_strings():
    df = pl.DataFrame({"job": ["j", "j"], "rank": ["1", "x"], "op": ["send", "send"],
                       "start_ns": ["1764000000000000001", "5"], "end_ns": ["1764000000000000009", "9"],
                       "group_ranks": ["[0, 1]", "0;1"]})
    v = schema.validate(df, "comm_op")
    assert v.rejects == {"wrong type rank": 1}
    row = v.table.to_pylist()[0]
    # nanosecond timestamps survive parsing exactly (no float round trip)
    assert row["start_ns"] == 1764000000000000001 and row["end_ns"] == 1764000000000000009
    assert row["group_ranks"] == [0, 1]


def test_pending_op_keeps_null_end():
    df = _comm(2, end_ns=[None, 200])
    v = schema.validate(df, "comm_op")
    assert v.table.column("state").to_pylist() == ["pending", "completed"]


def test_flow_defaults_sampling_and_estimates():
    df = pl.DataFrame({"job": ["f"], "exporter": ["10.0.0.1/0"], "src_addr": ["a"], "dst_addr": ["b"],
                       "size_bytes": [1000], "num_packets": [2], "start_ns": [1], "end_ns": [2],
                       "sampling_rate": [None]}, schema_overrides={"sampling_rate": pl.Int64})
    t = schema.validate(df, "flow").table
    assert t.column("sampling_rate").to_pylist() == [1]
    assert t.column("est_size_bytes").to_pylist() == [1000]


def test_empty_input_gives_empty_table():
    v = schema.validate(pa.table({"x": pa.array([], pa.int64())}), "step_mark")
    assert v.table.num_rows == 0 and not v.rejects


def test_conform_raises_on_bad_rows():
    with pytest.raises(SchemaError, match="unknown op"):
        schema.conform(_comm(1, op=["x"]), "comm_op")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 10**12), st.integers(-5, 10**12), st.sampled_from(
    ["all_reduce", "send", "bogus", None])), min_size=1, max_size=40))
def test_validate_never_loses_rows(rows):
    df = pl.DataFrame({"job": ["j"] * len(rows), "rank": [0] * len(rows),
                       "start_ns": [r[0] for r in rows], "end_ns": [r[1] for r in rows],
                       "op": [r[2] for r in rows]})
    v = schema.validate(df, "comm_op")
    assert v.table.num_rows + v.num_rejected == len(rows)
    good = v.table.to_pylist()
    assert all(r["end_ns"] >= r["start_ns"] >= 0 and r["op"] in schema.COMM_OPS for r in good)


def test_missing_columns_are_nulls_of_the_frames_height():
    """A frame without any of the kind's columns still has one (rejected) row per input row."""
    from rankscope.collectors.schema import _wrong_type_masks, polars_schema

    df = pl.DataFrame({"unrelated": [1, 2, 3]})
    cast, bad = _wrong_type_masks(df, "comm_op")
    assert cast.shape == (3, len(polars_schema("comm_op"))) and dict(cast.schema) == polars_schema("comm_op")
    assert bad == {}
    assert schema.validate(df, "comm_op").num_rejected == 3
