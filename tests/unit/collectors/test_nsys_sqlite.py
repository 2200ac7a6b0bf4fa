"""Nsight Systems SQLite exports, built following the documented schema (no nsys here)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers.contract import ImportOptions
from rankscope.collectors.importers.nsys_sqlite import read_nsys
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.ingest.registry import detect
from rankscope.collectors.store import Store

EPOCH = 1_760_000_000_000_000_000
PID = 4242
GPID = PID << 24
GTID = GPID + 4243


def build(path, *, name_col="demangledName", with_epoch=True, with_runtime=True, json_payload=False):
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
            rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER,
            textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL,
            uint32Value INTEGER, int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
            eventClass INTEGER, globalTid INTEGER, correlationId INTEGER, nameId INTEGER, returnValue INTEGER);
    """)
    con.execute(f"""CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER,
            globalPid INTEGER, {name_col} INTEGER NOT NULL, shortName INTEGER, gridX INTEGER, gridY INTEGER,
            gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER, registersPerThread INTEGER)""")
    if with_epoch:
        con.execute("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT)")
        con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (EPOCH,))
    strings = {1: "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn",
               2: "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
               3: "forward", 4: "vectorized_elementwise_kernel"}
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", strings.items())
    # two steps: forward range, a GEMM, an elementwise kernel, then an NCCL all-reduce range and kernel
    for s in range(2):
        t = s * 10_000_000
        con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, textId, globalTid) VALUES (?, ?, 59, 3, ?)",
                    (t, t + 4_000_000, GTID))
        size = 16 * 2**20
        payload = (None, json.dumps({"Message size [bytes]": size})) if json_payload else (size, None)
        con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, uint64Value, jsonText) "
                    "VALUES (?, ?, 59, 'ncclAllReduce', ?, ?, ?)", (t + 5_000_000, t + 5_100_000, GTID, *payload))
        for sid, corr, ks, ke in [(1, 10 + 4 * s, t + 1_000_000, t + 2_000_000),
                                  (4, 11 + 4 * s, t + 2_100_000, t + 2_200_000),
                                  (2, 12 + 4 * s, t + 5_300_000, t + 7_300_000)]:
            con.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, streamId, correlationId, "
                        f"globalPid, {name_col}, shortName, gridX, gridY, gridZ, blockX, blockY, blockZ) "
                        "VALUES (?, ?, 0, ?, ?, ?, ?, ?, 8, 1, 1, 256, 1, 1)",
                        (ks, ke, 7 if sid != 2 else 13, corr, GPID, sid, sid))
            launch = ks - 50_000 if sid != 2 else t + 5_050_000
            if with_runtime:
                con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, globalTid, correlationId) "
                            "VALUES (?, ?, ?, ?)", (launch, launch + 5000, GTID, corr))
    con.commit()
    con.close()
    return path


def test_kernels_ranges_and_nccl(tmp_path):
    p = build(tmp_path / "report_rank5.sqlite")
    assert detect(p) == "nsys_sqlite"
    b = read_nsys(p, ImportOptions())
    assert not b.relative_time
    comm = b.tables["comm_op"][0]
    assert comm["op"].to_list() == ["all_reduce"] * 2
    assert comm["size_bytes"].to_list() == [16 * 2**20] * 2
    assert comm["stream"].to_list() == ["13", "13"] and set(comm["rank"]) == {5} and set(comm["pid"]) == {PID}
    assert comm["start_ns"].to_list() == [EPOCH + 5_300_000, EPOCH + 15_300_000]
    assert comm["launch_ns"].to_list() == [EPOCH + 5_050_000, EPOCH + 15_050_000]
    comp = b.tables["compute_op"][0]
    assert sorted(comp["category"].to_list()) == ["elementwise"] * 2 + ["forward"] * 2 + ["gemm"] * 2
    g = comp.filter(comp["category"] == "gemm")
    assert g["grid"].to_list() == ["8,1,1"] * 2 and g["block"].to_list() == ["256,1,1"] * 2


def test_version_differences_tolerated(tmp_path):
    # older exports: kernel name column 'name', no session epoch, JSON NVTX payload, no runtime table rows
    p = build(tmp_path / "rank1.sqlite", name_col="name", with_epoch=False, json_payload=True, with_runtime=False)
    b = read_nsys(p, ImportOptions())
    assert b.relative_time
    comm = b.tables["comm_op"][0]
    # without launches a kernel cannot find its NVTX range: the op comes from the kernel name, no size
    assert comm["op"].to_list() == ["all_reduce"] * 2 and comm["size_bytes"].is_null().all()
    assert b.tables["compute_op"][0].height == 6


def test_ingest_round_trip_and_reingest(tmp_path):
    p = build(tmp_path / "report_rank0.sqlite")
    st = Store(tmp_path / "st")
    s = ingest(st, [p], opts=ImportOptions(job="n"))
    assert s.records == {"comm_op": 2, "compute_op": 6}
    assert ingest(st, [p], opts=ImportOptions(job="n")).count("skipped") == 1


def test_broken_files(tmp_path):
    empty = tmp_path / "rank0.sqlite"
    sqlite3.connect(empty).close()
    with pytest.raises(InputFormatError) as e:
        read_nsys(empty, ImportOptions())
    assert "CUPTI_ACTIVITY_KIND_KERNEL" in str(e.value)
    corrupt = tmp_path / "rank1.sqlite"
    raw = build(tmp_path / "x_rank1.sqlite").read_bytes()
    corrupt.write_bytes(raw[:100] + b"\xff" * 4000 + raw[4100:])
    with pytest.raises(InputFormatError) as e:
        read_nsys(corrupt, ImportOptions())
    assert str(corrupt) in str(e.value)
    noname = build(tmp_path / "report.sqlite")
    with pytest.raises(InputFormatError) as e:
        read_nsys(noname, ImportOptions())
    assert "rank" in str(e.value)
    assert read_nsys(noname, ImportOptions(extra={"rank": "2"})).tables["comm_op"][0]["rank"][0] == 2


def test_truncated_sqlite(tmp_path):
    raw = build(tmp_path / "full_rank0.sqlite").read_bytes()
    p = tmp_path / "cut_rank0.sqlite"
    p.write_bytes(raw[: len(raw) // 2])
    st = Store(tmp_path / "st")
    s = ingest(st, [p], fmt="nsys_sqlite", opts=ImportOptions(job="n"))
    f = s.files[0]
    # SQLite pages cannot be salvaged one by one: the file fails as a whole, with the reason.
    assert f.status == "failed" and str(p) in f.error and "malformed" in f.error
