"""NCCL profiler plugin traces and NCCL Inspector records, built the way the plugins print them."""
# ruff: noqa: UP031 - the lines mirror the plugin's printf formats, so they keep printf syntax

from __future__ import annotations

import json

import pytest

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers.contract import ImportOptions
from rankscope.collectors.importers.nccl_inspector import read_inspector
from rankscope.collectors.importers.nccl_profiler import read_profile
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.ingest.registry import detect
from rankscope.collectors.store import Store


def profiler_lines(n=4, rank=2):
    """Lines as the example plugin's fprintf calls write them (bare ncclFloat32 / hex stream included)."""
    lines = ["["]
    t = 100.0
    for i in range(n):
        lines.append('{"name": "Group", "cat": "GROUP", "ph": "b", "id": %d, "pid": 77, "tid": 1, "ts": %f, '
                     '"args": {"groupId": %d}},' % (i, t, i))
        lines.append('{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": %d, "pid": 77, "tid": 1, "ts": %f, '
                     '"args": {"SeqNum": %d, "CommHash": 1234567890123456789, "Rank": %d, "Count": 262144, '
                     '"Datatype": "ncclBfloat16", "Algorithm": "RING", "Protocol": "SIMPLE", "nMaxChannels": 8}},'
                     % (i, t + 1, i, rank))
        lines.append('{"name": "KernelCh", "cat": "GPU", "ph": "b", "id": %d, "pid": 77, "tid": 1, "ts": %f, '
                     '"args": {"Channel": 0}},' % (i, t + 2))
        lines.append('{"name": "AllReduce", "cat": "COLL", "ph": "e", "id": %d, "pid": 77, "tid": 1, "ts": %f},'
                     % (i, t + 51.5))
        lines.append('{"name": "Send", "cat": "P2P_API", "ph": "b", "id": %d, "pid": 77, "tid": 1, "ts": 0.0, '
                     '"args": {"count": 16, "datatype": ncclFloat32, "Stream": 0x4142e90}},' % i)
        lines.append('{"name": "Send", "cat": "P2P", "ph": "b", "id": %d, "pid": 77, "tid": 1, "ts": %f, '
                     '"args": {"CommHash": 99, "Rank": %d, "Peer": 3, "Count": 16, "Datatype": "ncclFloat32"}},'
                     % (i, t + 60, rank))
        lines.append('{"name": "Send", "cat": "P2P", "ph": "e", "id": %d, "pid": 77, "tid": 1, "ts": %f},'
                     % (i, t + 70))
        t += 1000
    lines.append("{}]")
    return lines


def test_profiler_pairs_begin_and_end(tmp_path):
    p = tmp_path / "nccl_prof_rank2.json"
    p.write_text("\n".join(profiler_lines()))
    assert detect(p) == "nccl_profiler"
    b = read_profile(p, ImportOptions())
    df = b.tables["comm_op"][0].sort("start_ns")
    assert b.relative_time and not b.rejects
    assert df["op"].to_list() == ["all_reduce", "send"] * 4
    ar = df.filter(df["op"] == "all_reduce")
    assert ar["seq"].to_list() == [0, 1, 2, 3]
    assert ar["size_bytes"].to_list() == [524288] * 4 and set(ar["dtype"]) == {"bfloat16"}
    assert (ar["end_ns"] - ar["start_ns"]).to_list() == [50_500] * 4
    assert ar["group_id"][0] == "1234567890123456789" and ar["algorithm"][0] == "RING/SIMPLE"
    assert df["start_ns"].min() == 0 and set(df["rank"]) == {2}
    assert df.filter(df["op"] == "send")["peer"].to_list() == [3] * 4


def test_profiler_truncated_and_broken_lines(tmp_path):
    lines = profiler_lines()
    lines[5] = '{"name": "AllReduce", "cat": "CO'
    p = tmp_path / "prof_rank2.json"
    p.write_text("\n".join(lines[:-6]))
    st = Store(tmp_path / "st")
    s = ingest(st, [p], opts=ImportOptions(job="p"))
    assert s.files[0].status == "ingested"
    assert s.rejects["undecodable line"] == 1
    df = st.read("comm_op", "p")
    # The begin whose end line was cut never finished: pending, not invented.
    assert df.filter(df["state"] == "pending").height == 1
    assert df.height == 7


@pytest.mark.parametrize("content", [b"", b"[\n{}]", b"[\nnot json at all\n]"])
def test_profiler_unreadable(tmp_path, content):
    p = tmp_path / "prof.json"
    p.write_bytes(content)
    with pytest.raises(InputFormatError) as e:
        read_profile(p, ImportOptions())
    assert str(p) in str(e.value)


def inspector_record(sn, verbose=False, rank=4):
    perf = {"coll": "ReduceScatter", "coll_sn": sn, "coll_msg_size_bytes": 2147483648, "coll_exec_time_us": 41057,
            "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": 418.4, "coll_busbw_gbs": 366.1}
    if verbose:
        perf["event_trace_ts"] = {"coll_start_ts": 1752867229235059 + sn * 100000,
                                  "coll_stop_ts": 1752867229235064 + sn * 100000,
                                  "kernel_events": [{"channel_id": 0,
                                                     "kernel_start_ts": 1752867229235181 + sn * 100000,
                                                     "kernel_stop_ts": 1752867229275811 + sn * 100000}]}
    return {"header": {"id": "0xe62dedaa97644a", "rank": rank, "n_ranks": 8, "nnodes": 1},
            "metadata": {"inspector_output_format_version": "v4.0", "dump_timestamp_us": 1752867230000000 + sn,
                         "hostname": "node3", "pid": 438776}, "coll_perf": perf}


def test_inspector_json_lines(tmp_path):
    p = tmp_path / "inspector.log"
    p.write_text("\n".join(json.dumps(inspector_record(i, verbose=i % 2 == 1)) for i in range(6)))
    assert detect(p) == "nccl_inspector"
    b = read_inspector(p, ImportOptions())
    df = b.tables["comm_op"][0].sort("seq")
    assert df["op"].to_list() == ["reduce_scatter"] * 6
    assert df["size_bytes"].to_list() == [2147483648] * 6 and set(df["rank"]) == {4}
    assert (df["end_ns"] - df["start_ns"]).to_list()[0::2] == [41_057_000] * 3
    # verbose records: kernel start/stop, not the dump time
    assert (df["end_ns"] - df["start_ns"]).to_list()[1::2] == [40_630_000] * 3
    assert b.notes["placed_at_dump"] == 3 and set(df["host"]) == {"node3"}


def test_inspector_pretty_printed_and_broken_records(tmp_path):
    good = [json.dumps(inspector_record(i), indent=2) for i in range(3)]
    bad = json.dumps({"header": {"rank": 1}, "coll_perf": {"coll": "Frobnicate"}})
    p = tmp_path / "insp.json"
    p.write_text("\n".join([good[0], bad, good[1], '{"header": {"id": 1,', good[2]]))
    st = Store(tmp_path / "st")
    s = ingest(st, [p], opts=ImportOptions(job="i"))
    assert s.files[0].status == "ingested"
    assert st.count("comm_op", "i") == 3
    assert s.rejects == {"malformed inspector record": 1, "undecodable JSON object": 1}


@pytest.mark.parametrize("content", [b"", b"{}", b'{"header": {}, "coll_perf": {}}'])
def test_inspector_unreadable(tmp_path, content):
    p = tmp_path / "insp.json"
    p.write_bytes(content)
    with pytest.raises(InputFormatError) as e:
        read_inspector(p, ImportOptions())
    assert str(p) in str(e.value)
