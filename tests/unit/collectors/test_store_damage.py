"""A damaged store is detected and named: part hashes in the manifest (or beside a live writer's part),
orphans reported, manifest field types checked, one line and exit 1, and ``rankscope check`` (issue 41)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from rankscope.cli.main import main
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.orphans import REMOVED_LOG
from rankscope.collectors.schema import conform
from rankscope.collectors.store import Store
from rankscope.collectors.store_check import check_store

KINETO = Path(__file__).parents[2] / "data" / "gloo_dp2pp2tp2" / "kineto" / "rank0.json.gz"


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "st")
    assert ingest(s, [KINETO]).count("ingested") == 1
    comp = pl.DataFrame({"job": "live", "rank": list(range(40)), "name": "gemm", "category": "gemm",
                         "start_ns": list(range(40)), "end_ns": [x + 7 for x in range(40)], "source": "hook"})
    s.write("compute_op", conform(comp, "compute_op"))  # a live writer's part: no manifest entry
    return s


def _parts(s: Store) -> list[Path]:
    return sorted(s.root.glob("*/job=*/part-*.parquet"))


def _run(capsys, *argv) -> tuple[int, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_check_finds_a_flipped_byte_at_every_offset_of_every_part(store):
    parts = _parts(store)
    assert len(parts) == 4 and not check_store(store).problems
    for p in parts:
        data = p.read_bytes()
        missed = []
        for off in range(0, len(data), 7):
            b = bytearray(data)
            b[off] ^= 0x10
            p.write_bytes(bytes(b))
            found = check_store(store).problems
            if not (len(found) == 1 and str(p) in found[0]):
                missed.append(off)
        p.write_bytes(data)
        assert not missed, f"{p.name}: flips at {missed[:10]} not found"


@pytest.mark.parametrize("damage", ["truncate", "zero", "empty", "flip"])
def test_a_damaged_part_is_one_line_and_exit_1_for_every_reader(store, capsys, damage):
    p = _parts(store)[0]
    data = p.read_bytes()
    p.write_bytes({"truncate": data[: len(data) // 2], "zero": bytes(len(data)), "empty": b"",
                   "flip": data[:100] + bytes([data[100] ^ 1]) + data[101:]}[damage])
    for argv in (["info", "--store", str(store.root)], ["sql", "--store", str(store.root), "select count(*) from comm_op"],
                 ["analyze", "--store", str(store.root), "--out-dir", str(store.root.parent / "out")],
                 ["check", "--store", str(store.root)]):
        rc, out = _run(capsys, *argv)
        assert rc == 1, (argv[0], out)
        assert "Traceback" not in out and str(p) in out, (argv[0], out)
    rc, out = _run(capsys, "info", "--store", str(store.root))
    assert len(out.strip().splitlines()) == 1


def test_a_junk_part_is_named(store, capsys):
    junk = store.root / "comm_op" / "job=default" / "part-junk.parquet"
    junk.write_bytes(b"not parquet at all")
    rc, out = _run(capsys, "info", "--store", str(store.root))
    assert rc == 1 and "part-junk.parquet" in out and "Traceback" not in out


def test_a_manifest_field_of_the_wrong_type_is_named(store, capsys):
    m = next((store.root / "_manifest").glob("*.json"))
    data = json.loads(m.read_text())
    data["rejects"] = None
    m.write_text(json.dumps(data))
    for argv in (["info", "--store", str(store.root)],
                 ["analyze", "--store", str(store.root), "--out-dir", str(store.root.parent / "out")]):
        rc, out = _run(capsys, *argv)
        assert rc == 1 and "'rejects' is null" in out and m.name in out and "Traceback" not in out, out
    rc, out = _run(capsys, "check", "--store", str(store.root))
    assert rc == 1 and "'rejects' is null" in out


def test_a_lost_manifest_entry_leaves_orphans_that_are_reported_and_noted(store, capsys, tmp_path):
    m = next((store.root / "_manifest").glob("*.json"))
    m.unlink()
    rc, out = _run(capsys, "info", "--store", str(store.root))
    assert rc == 0 and "3 orphan part(s)" in out
    rc, out = _run(capsys, "check", "--store", str(store.root))
    assert rc == 1 and out.count("orphan part") == 3 and "_removed.log" in out
    other = tmp_path / "comm_op.csv"
    other.write_text("rank,op,start_ns,end_ns\n0,all_reduce,1,2\n")
    rc, out = _run(capsys, "ingest", "--store", str(store.root), str(other))
    assert rc == 0 and "removed 3 orphan part(s)" in out
    log = (store.root / REMOVED_LOG).read_text().splitlines()
    assert len(log) == 3 and all("orphan part" in line for line in log)
    rc, out = _run(capsys, "check", "--store", str(store.root))
    assert rc == 0, out
