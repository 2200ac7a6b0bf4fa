"""Flight recorder dumps (pickle and JSON) and the restricted unpickler."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from rankscope.collectors.errors import InputFormatError, UnsafePickleError
from rankscope.collectors.importers import safe_pickle
from rankscope.collectors.importers.contract import ImportOptions
from rankscope.collectors.importers.flight_recorder import read_dump
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.ingest.registry import detect
from rankscope.collectors.store import Store

T0 = 1_790_000_000_000_000_000


def entry(i, name="nccl:all_reduce", pg=("1", "dp"), pg_id=1, state="completed", p2p=False, **kw):
    e = {"record_id": i, "pg_id": pg_id, "process_group": pg, "collective_seq_id": 0 if p2p else i + 1,
         "p2p_seq_id": i + 1 if p2p else 0, "op_id": i + 1, "profiling_name": name, "time_created_ns": T0 + i * 10**6,
         "input_sizes": [[1024, 4]], "input_dtypes": ["BFloat16"], "output_sizes": [[1024, 4]],
         "output_dtypes": ["BFloat16"], "state": state, "time_discovered_started_ns": T0 + i * 10**6 + 500,
         "time_discovered_completed_ns": T0 + i * 10**6 + 9000 if state == "completed" else None,
         "duration_ms": 0.0085 if state == "completed" else None, "retired": True, "timeout_ms": 600000,
         "is_p2p": p2p, "frames": [{"name": "all_reduce", "filename": "x.py", "line": 3}]}
    e.update(kw)
    return e


def nccl_dump():
    entries = [entry(i) for i in range(3)] + [entry(3, state="started"),
                                              entry(4, name="nccl:send 1->0", pg=("5", "pp"), pg_id=2, p2p=True)]
    return {"version": "2.4", "pg_config": {"1": {"name": "1", "desc": "dp", "ranks": "[2, 3]"},
                                            "5": {"name": "5", "desc": "pp", "ranks": "[1, 3]"}},
            "pg_status": {"1": {"last_enqueued_collective": 4, "last_started_collective": 4,
                                "last_completed_collective": 3}},
            "entries": entries, "comm_lib_version": "2.21.5"}


def gloo_dump():
    """What torch 2.13's gloo recorder writes: no pg ranks, every entry 'scheduled', zero start times."""
    entries = [entry(i, name="gloo:all_reduce", state="scheduled", time_discovered_started_ns=0,
                     time_discovered_completed_ns=0, duration_ms=None) for i in range(3)]
    return {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
            "pg_status": {"1": {"last_enqueued_collective": "3", "last_started_collective": "-1",
                                "last_completed_collective": "2"}},
            "entries": entries, "comm_lib_version": ""}


def test_pickle_and_json_give_the_same_rows(tmp_path):
    pk = tmp_path / "nccl_trace_rank_3"
    pk.write_bytes(pickle.dumps(nccl_dump()))
    js = tmp_path / "rank3.fr.json"
    js.write_text(json.dumps(nccl_dump()))
    assert detect(pk) == "flight_recorder" and detect(js) == "flight_recorder"
    a = read_dump(pk, ImportOptions()).tables["comm_op"][0]
    b = read_dump(js, ImportOptions()).tables["comm_op"][0]
    assert a.equals(b)
    assert a["rank"].to_list() == [3] * 5
    assert a["state"].to_list() == ["completed"] * 3 + ["pending", "completed"]
    assert a["end_ns"].is_null().to_list() == [False, False, False, True, False]
    assert a["seq"].to_list() == [1, 2, 3, 4, 5]
    assert a["group_ranks"].to_list() == [[2, 3]] * 4 + [[1, 3]]
    assert a["size_bytes"].to_list() == [8192] * 5 and a["dtype"].to_list() == ["bfloat16"] * 5
    assert a["op"].to_list() == ["all_reduce"] * 4 + ["send"]
    assert a["peer"].to_list()[-1] == 1  # local peer 0 of group [1, 3]
    assert a["start_ns"][0] == T0 + 500 and a["end_ns"][0] == T0 + 9000


def test_gloo_dump_completion_from_pg_status(tmp_path):
    p = tmp_path / "rank0.pkl"
    p.write_bytes(pickle.dumps(gloo_dump()))
    b = read_dump(p, ImportOptions())
    df = b.tables["comm_op"][0]
    # op ids 1 and 2 passed last_completed_collective=2; op 3 is where a hang sits.
    assert df["state"].to_list() == ["completed", "completed", "pending"]
    assert df["start_ns"].to_list() == [T0, T0 + 10**6, T0 + 2 * 10**6]
    assert df["end_ns"].to_list()[:2] == df["start_ns"].to_list()[:2] and df["end_ns"][2] is None
    assert b.notes["completed_without_time"] == 2
    assert df["group_id"].to_list() == ["1"] * 3


def test_malicious_pickle_executes_nothing(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    p = tmp_path / "rank0.pkl"
    p.write_bytes(pickle.dumps({"version": "2.4", "pg_config": {}, "entries": [Evil()]}))
    with pytest.raises(UnsafePickleError) as e:
        read_dump(p, ImportOptions())
    assert "system" in str(e.value) and str(p) in str(e.value)
    assert not marker.exists()
    st = Store(tmp_path / "st")
    s = ingest(st, [p])
    assert s.files[0].status == "failed" and not marker.exists()


def test_restricted_unpickler_allows_plain_data_only():
    data = {"a": [1, 2.5, None, True], "b": ("x", b"y"), "c": {1, 2}, "d": frozenset([3])}
    assert safe_pickle.loads(pickle.dumps(data, protocol=2))[0] == data
    assert safe_pickle.loads(pickle.dumps(data))[0] == data
    with pytest.raises(UnsafePickleError):
        safe_pickle.loads(pickle.dumps(ValueError("x")))


def test_truncated_pickle_keeps_complete_entries(tmp_path):
    raw = pickle.dumps(nccl_dump())
    p = tmp_path / "rank3.pkl"
    p.write_bytes(raw[: int(len(raw) * 0.75)])
    b = read_dump(p, ImportOptions())
    assert sum(b.rejects.values()) == 1 and "truncated" in next(iter(b.rejects))
    assert 0 < b.tables["comm_op"][0].height < 5


def test_truncated_json_keeps_complete_entries(tmp_path):
    text = json.dumps(nccl_dump(), indent=1)
    p = tmp_path / "rank3.json"
    p.write_text(text[: int(len(text) * 0.8)])
    b = read_dump(p, ImportOptions())
    df = b.tables["comm_op"][0]
    assert 0 < df.height < 5 and df["group_ranks"][0].to_list() == [2, 3]


def test_malformed_entry_is_counted_and_the_rest_kept(tmp_path):
    d = nccl_dump()
    d["entries"][1] = {"profiling_name": "nccl:all_reduce"}
    d["entries"].append("junk")
    p = tmp_path / "rank3.pkl"
    p.write_bytes(pickle.dumps(d))
    b = read_dump(p, ImportOptions())
    assert b.rejects == {"malformed flight recorder entry": 2}
    assert b.tables["comm_op"][0].height == 4


@pytest.mark.parametrize("content,expected", [
    (b"", "empty file"),
    (pickle.dumps([1, 2, 3]), "dump object"),
    (pickle.dumps({"version": "2.4", "entries": "x"}), "entries"),
    (b"\x80\x04\x95garbage", "pickle"),
    (b'{"version": "2.4", "pg_config": {}, "entries": [', "flight recorder dump"),
])
def test_broken_dumps_give_clear_errors(tmp_path, content, expected):
    p = tmp_path / "rank0.pkl"
    p.write_bytes(content)
    with pytest.raises(InputFormatError) as e:
        read_dump(p, ImportOptions())
    assert str(p) in str(e.value) and expected in str(e.value)


def test_rank_needed_from_name_or_option(tmp_path):
    p = tmp_path / "dump.pkl"
    p.write_bytes(pickle.dumps(nccl_dump()))
    with pytest.raises(InputFormatError):
        read_dump(p, ImportOptions())
    assert read_dump(p, ImportOptions(extra={"rank": "5"})).tables["comm_op"][0]["rank"][0] == 5
