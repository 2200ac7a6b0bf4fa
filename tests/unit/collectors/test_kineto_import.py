"""Kineto importer on built traces: the gloo and NCCL forms, GEMM shapes, and broken files."""

from __future__ import annotations

import gzip
import json

import pytest

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers.contract import ImportOptions
from rankscope.collectors.importers.kineto.compute_rows import gemm_shape
from rankscope.collectors.importers.kineto.importer import read_trace
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.ingest.registry import detect
from rankscope.collectors.store import Store

BASE = 1_700_000_000_000_000_000


def ev(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 42, "tid": tid, "ts": ts, "dur": dur, "args": args}


def gloo_trace(rank=1, steps=2):
    """A CPU/gloo-form trace like torch 2.13 writes: c10d cpu_ops plus gloo:* worker annotations."""
    events = [{"ph": "M", "name": "process_name", "pid": 42, "tid": 0, "args": {"name": "python"}}]
    for s in range(steps):
        t = 1000.0 + s * 1000
        events += [
            ev(f"ProfilerStep#{s}", "user_annotation", t, 900),
            ev("forward", "user_annotation", t + 10, 100),
            ev("aten::linear", "cpu_op", t + 20, 50, **{"Input Dims": [[8, 64], [128, 64], [128]],
                                                        "Input type": ["float", "float", "float"]}),
            ev("aten::addmm", "cpu_op", t + 25, 40, **{"Input Dims": [[128], [8, 64], [64, 128]],
                                                       "Input type": ["float", "float", "float"],
                                                       "Input Strides": [[1], [64, 1], [1, 64]]}),
            ev("c10d::send", "cpu_op", t + 120, 5, **{"Input Dims": [[[8, 128]], [], [], []],
                                                      "Concrete Inputs": ["", "", "3", "0"]}),
            ev("gloo:send", "user_annotation", t + 126, 30, **{"Input Dims": [[8, 128]], "Input type": ["float"]}),
            ev("backward", "user_annotation", t + 200, 300),
            ev("c10d::recv_", "cpu_op", t + 210, 80, **{"Input Dims": [[[8, 128]], [], [], []],
                                                        "Concrete Inputs": ["", "", "3", "0"]}),
            ev("gloo:recv", "user_annotation", t + 212, 70, **{"Input Dims": [[8, 128]], "Input type": ["float"]}),
            ev("c10d::allreduce_", "cpu_op", t + 600, 10, **{"Input Dims": [[[1000]], [], [], [], [], []],
                                                             "Concrete Inputs": ["", "", "", "", "False", "-1"]}),
            ev("gloo:all_reduce", "user_annotation", t + 605, 150, tid=7,
               **{"Input Dims": [[1000]], "Input type": ["c10::BFloat16"]}),
            ev("optimizer", "user_annotation", t + 800, 50),
        ]
    return {"schemaVersion": 1, "baseTimeNanoseconds": BASE, "host_name": "node7",
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 4, "pg_count": 3,
                                "pg_config": [{"pg_name": "0", "ranks": [0, 1, 2, 3]},
                                              {"pg_name": "2", "ranks": [1, 3]}]},
            "traceEvents": events}


def write(path, doc):
    path.write_text(json.dumps(doc, indent=1))
    return path


def test_gloo_form_ops_peers_sizes_and_worker_times(tmp_path):
    p = write(tmp_path / "rank1.json", gloo_trace())
    assert detect(p) == "kineto"
    b = read_trace(p, ImportOptions())
    (comm,) = b.tables["comm_op"]
    comm = comm.sort("start_ns")
    assert comm["op"].to_list() == ["send", "recv", "all_reduce"] * 2
    assert comm.filter(comm["op"] != "all_reduce")["peer"].to_list() == [3, 3, 3, 3]
    assert comm["size_bytes"].to_list() == [4096, 4096, 2000] * 2
    ar = comm.filter(comm["op"] == "all_reduce")
    assert ar["dtype"].to_list() == ["bfloat16"] * 2
    # start/end are the gloo worker's; launch_ns the c10d call's.
    assert (ar["start_ns"] - ar["launch_ns"]).to_list() == [5000, 5000]
    assert (ar["end_ns"] - ar["start_ns"]).to_list() == [150_000, 150_000]
    assert comm["step"].to_list() == [0, 0, 0, 1, 1, 1]
    assert comm["seq"].to_list() == [1, 1, 1, 2, 2, 2]
    assert set(comm["host"]) == {"node7"} and set(comm["pid"]) == {42}
    assert comm["start_ns"].min() > BASE


def test_gloo_form_spans_gemms_and_steps(tmp_path):
    b = read_trace(write(tmp_path / "rank1.json", gloo_trace()), ImportOptions())
    (comp,) = b.tables["compute_op"]
    assert sorted(comp.filter(comp["step"] == 0)["category"].to_list()) == ["backward", "forward", "gemm",
                                                                              "optimizer"]
    g = comp.filter(comp["category"] == "gemm")
    # aten::linear wraps aten::addmm: counted once, with the addmm's shape.
    assert g["name"].to_list() == ["aten::addmm"] * 2
    assert (g["m"].to_list(), g["n"].to_list(), g["k"].to_list()) == ([8, 8], [128, 128], [64, 64])
    assert g["flops"].to_list() == [2.0 * 8 * 128 * 64] * 2
    assert g["layout"].to_list() == ["nt", "nt"]
    (steps,) = b.tables["step_mark"]
    assert steps["step"].to_list() == [0, 1]


def test_span_regex_option(tmp_path):
    doc = gloo_trace(steps=1)
    doc["traceEvents"].append(ev("my-fwd-block", "user_annotation", 5000, 10))
    b = read_trace(write(tmp_path / "rank1.json", doc), ImportOptions(extra={"forward_regex": "^my-fwd"}))
    comp = b.tables["compute_op"][0]
    assert comp.filter(comp["category"] == "forward")["name"].to_list() == ["my-fwd-block"]


@pytest.mark.parametrize("name,dims,expect", [
    ("aten::mm", [[4, 8], [8, 16]], (4, 16, 8, 1)),
    ("aten::bmm", [[3, 4, 8], [3, 8, 16]], (4, 16, 8, 3)),
    ("aten::linear", [[2, 5, 8], [16, 8], [16]], (10, 16, 8, 1)),
    ("aten::baddbmm", [[3, 4, 16], [3, 4, 8], [3, 8, 16]], (4, 16, 8, 3)),
])
def test_gemm_shapes(name, dims, expect):
    assert gemm_shape(name, {"Input Dims": dims, "Input type": ["c10::Half"] * 3})[:4] == expect
    assert gemm_shape(name, {"Input Dims": dims, "Input type": ["c10::Half"] * 3})[4] == "float16"


def test_nccl_form_kernel_joins_its_cpu_call(tmp_path):
    doc = {"baseTimeNanoseconds": BASE, "distributedInfo": {"rank": 3, "pg_config": []}, "traceEvents": [
        ev("record_param_comms", "cpu_op", 100, 20, **{
            "External id": 9, "Collective name": "send", "In msg nelems": 1024, "Out msg nelems": 1024,
            "dtype": "BFloat16", "Process Group Name": "7", "Process Group Ranks": "[2, 3, 6, 7]",
            "Dst Rank": 2, "Group size": 4}),
        ev("cudaLaunchKernel", "cuda_runtime", 110, 5, correlation=55, **{"External id": 9}),
        ev("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "kernel", 130, 400, tid=20,
           correlation=55, stream=20, device=3, **{"External id": 9}),
        ev("record_param_comms", "cpu_op", 900, 20, **{"Collective name": "wait"}),
    ]}
    b = read_trace(write(tmp_path / "t.json", doc), ImportOptions())
    (comm,) = b.tables["comm_op"]
    r = comm.row(0, named=True)
    assert comm.height == 1
    assert (r["op"], r["peer"], r["size_bytes"], r["dtype"], r["stream"]) == ("send", 6, 2048, "bfloat16", "20")
    assert (r["group_id"], r["group_ranks"], r["rank"]) == ("7", [2, 3, 6, 7], 3)
    assert (r["start_ns"], r["end_ns"], r["launch_ns"]) == (BASE + 130_000, BASE + 530_000, BASE + 100_000)
    assert b.notes["groups_recovered_from_ops"] == ["7"]


def test_no_base_time_is_relative_from_zero(tmp_path):
    doc = gloo_trace()
    del doc["baseTimeNanoseconds"]
    b = read_trace(write(tmp_path / "rank1.json", doc), ImportOptions())
    assert b.relative_time
    assert b.tables["step_mark"][0]["start_ns"].min() == 0


def test_truncated_file_keeps_complete_events(tmp_path):
    full = json.dumps(gloo_trace(steps=3), indent=1)
    p = tmp_path / "rank1.json"
    p.write_text(full[: int(len(full) * 0.7)])
    st = Store(tmp_path / "st")
    s = ingest(st, [p], opts=ImportOptions(job="t"))
    assert s.files[0].status == "ingested", s.files[0].error
    assert any("truncated" in r for r in s.rejects)
    assert 0 < st.count("comm_op", "t") < 9
    assert st.read("step_mark", "t")["step"].to_list()[:2] == [0, 1]


def test_truncated_gzip_keeps_what_was_decompressed(tmp_path):
    raw = gzip.compress(json.dumps(gloo_trace(steps=3), indent=1).encode())
    p = tmp_path / "rank1.json.gz"
    p.write_bytes(raw[: int(len(raw) * 0.8)])
    b = read_trace(p, ImportOptions())
    assert any("truncated" in r for r in b.rejects)
    assert b.tables["comm_op"][0].height > 0


def test_bad_events_are_counted_and_good_ones_kept(tmp_path):
    doc = gloo_trace(steps=1)
    doc["traceEvents"] += [ev("forward", "user_annotation", "soon", 10), "not an event",
                           ev("backward", "user_annotation", 5000, -3)]
    b = read_trace(write(tmp_path / "rank1.json", doc), ImportOptions())
    assert b.rejects == {"event without name, numeric ts or dur >= 0": 2, "event is not a JSON object": 1}
    assert b.tables["comm_op"][0].height == 3


@pytest.mark.parametrize("content,expected", [
    (b"", "empty file"),
    (b"[1, 2, 3]", "traceEvents"),
    (b'{"schemaVersion": 1, "traceEvents": "nope"}', "traceEvents"),
    (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "na', "recoverable"),
    (b"\x1f\x8b\x08\x00garbage-not-deflate", "gzip"),
    (b'{"schemaVersion": 1, "distributedInfo": {}, "traceEvents": [{"ph": "X", "name": "a", "ts": 1}]}', "rank"),
])
def test_broken_files_give_clear_errors(tmp_path, content, expected):
    p = tmp_path / "trace.json"
    p.write_bytes(content)
    with pytest.raises(InputFormatError) as e:
        read_trace(p, ImportOptions())
    assert str(p) in str(e.value) and expected in str(e.value)


def test_one_bad_file_never_stops_the_others(tmp_path):
    good = write(tmp_path / "rank1.json", gloo_trace())
    bad = tmp_path / "rank2.json"
    bad.write_text('{"schemaVersion": 1, "traceEvents": [')
    st = Store(tmp_path / "st")
    s = ingest(st, [bad, good], fmt="kineto", opts=ImportOptions(job="j"))
    assert [f.status for f in s.files] == ["failed", "ingested"]
    assert st.count("comm_op", "j") == 6
    again = ingest(st, [good], opts=ImportOptions(job="j"))
    assert again.count("skipped") == 1 and st.count("comm_op", "j") == 6


def test_gpu_gemm_kernel_takes_shape_and_step_from_its_launch(tmp_path):
    doc = {"baseTimeNanoseconds": BASE, "distributedInfo": {"rank": 0}, "traceEvents": [
        ev("ProfilerStep#7", "user_annotation", 0, 1000),
        ev("aten::mm", "cpu_op", 900, 50, **{"External id": 5, "Input Dims": [[128, 256], [256, 512]],
                                             "Input type": ["c10::BFloat16", "c10::BFloat16"]}),
        ev("cudaLaunchKernel", "cuda_runtime", 950, 5, correlation=77, **{"External id": 5}),
        # runs after the step's CPU span ended
        ev("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel", 1200, 300, tid=7, correlation=77, stream=7, device=0,
           grid=[4, 2, 1], block=[128, 1, 1], **{"External id": 5}),
    ]}
    b = read_trace(write(tmp_path / "t.json", doc), ImportOptions())
    (comp,) = b.tables["compute_op"]
    assert comp.height == 1  # the CPU aten::mm is not stored again
    r = comp.row(0, named=True)
    assert (r["category"], r["m"], r["n"], r["k"], r["dtype"]) == ("gemm", 128, 512, 256, "bfloat16")
    assert (r["step"], r["stream"], r["grid"], r["block"]) == (7, 7, "4,2,1", "128,1,1")
    assert r["flops"] == 2.0 * 128 * 512 * 256


JUNK = [None, 1, -5, 2.5, "x", "[1, 2", [], [[1, "a"]], {"a": 1}, True, [1, [2, [3]]]]


@pytest.mark.parametrize("seed", range(6))
def test_junk_args_never_crash_the_file(tmp_path, seed):
    """Every arg of every event replaced at random by junk: the file still imports or fails cleanly."""
    import random

    rng = random.Random(seed)
    doc = gloo_trace(steps=2)
    for e in doc["traceEvents"]:
        for k in list(e.get("args", {})):
            if rng.random() < 0.5:
                e["args"][k] = rng.choice(JUNK)
        if rng.random() < 0.1:
            e["args"] = rng.choice(JUNK)
    p = write(tmp_path / "rank1.json", doc)
    st = Store(tmp_path / "st")
    s = ingest(st, [p], opts=ImportOptions(job="f"))
    f = s.files[0]
    assert f.status == "ingested", f.error
    assert st.count("step_mark", "f") == 2
