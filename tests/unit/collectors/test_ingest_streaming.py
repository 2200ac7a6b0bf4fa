"""Streamed ingest: the same records as the whole-file way, in memory bounded by a chunk, not the file."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from rankscope.collectors.flows import flow_importers
from rankscope.collectors.importers.kineto import (
    chrome_trace as kineto_reader,
)
from rankscope.collectors.importers.kineto import (
    event_chunks as kineto_stream,
)
from rankscope.collectors.ingest.files import ingest_file
from rankscope.collectors.store import Store
from tests.unit.collectors.flow_builders import data_set, ipfix_message, template_set, u, v4
from tests.unit.collectors.test_kineto_import import ev, gloo_trace

REPO = Path(__file__).resolve().parents[3]


def _odd_trace() -> dict:
    """A trace with what a naive splitter trips on: '},{' and ']' inside strings, non-object
    elements, nested objects in args, and keys (a log list full of ']') after the array."""
    doc = gloo_trace(rank=2, steps=30)
    doc["traceEvents"] += [
        1, "x", [2, {"a": 1}], None,
        ev('name "},{" ]', "cpu_op", 1500.0, 3, **{"nested": [{"a": {"b": [1, 2]}}, {"c": "}, {"}]}),
        ev("kernel_x", "kernel", 1600.0, 4, correlation=7, grid=[1, 2, 3], big=2**70),
    ]
    log = [f"INFO CuptiActivityProfiler.cpp:{i}] line {i}" for i in range(200)]
    return {"traceEvents": doc["traceEvents"], "distributedInfo": doc["distributedInfo"],
            "baseTimeNanoseconds": doc["baseTimeNanoseconds"], "traceName": "a]b", "logs": log}


def _both(path: Path) -> tuple[kineto_reader.KinetoTrace, kineto_reader.KinetoTrace]:
    streamed = kineto_reader._trace(path, None, *kineto_reader._streamed(path))
    whole = kineto_reader._trace(path, None, *kineto_reader._whole(path))
    return streamed, whole


@pytest.mark.parametrize("chunk", [700, 5000, 1 << 20])
@pytest.mark.parametrize("indent", [None, 1])
def test_streamed_trace_equals_whole_file_read(tmp_path, monkeypatch, chunk, indent):
    monkeypatch.setattr(kineto_stream, "CHUNK_BYTES", chunk)
    p = tmp_path / "rank2.json.gz"
    p.write_bytes(gzip.compress(json.dumps(_odd_trace(), indent=indent).encode()))
    streamed, whole = _both(p)
    assert streamed.frame.equals(whole.frame) and streamed.frame.height > 300
    assert streamed.rejects == whole.rejects and streamed.samples == whole.samples
    assert streamed.samples["event is not a JSON object"] == "4 events"
    assert (streamed.rank, streamed.base_ns, streamed.dist_info) == (whole.rank, whole.base_ns, whole.dist_info)
    idx = streamed.frame["idx"]
    assert streamed.args(idx) == whole.args(idx)
    assert any(a.get("big") == 2**70 for a in streamed.args(idx))  # kept although orjson cannot write it back


def test_irregular_files_take_the_whole_file_path(tmp_path):
    text = json.dumps(gloo_trace(rank=1, steps=5))
    p = tmp_path / "rank1.json"
    p.write_text(text[: len(text) * 2 // 3])  # a job killed while writing
    with pytest.raises(kineto_stream.Irregular):
        kineto_reader._streamed(p)
    tr = kineto_reader.load(p)
    assert "truncated file (events after the last complete one lost)" in tr.rejects and tr.frame.height > 5


def _big_trace(path: Path, n_events: int) -> int:
    events = [ev(f"aten::op_{i % 50}", "cpu_op", 1000.0 + i, 1, tid=i % 4, **{"Input Dims": [[8, 64], [64]],
              "Sequence number": i, "Fwd thread id": 0}) for i in range(n_events)]
    doc = gloo_trace(rank=0, steps=2)
    doc["traceEvents"] = doc["traceEvents"] + events
    data = json.dumps(doc).encode()
    path.write_bytes(data)
    return len(data)


def _traced_peak(code: str) -> int:
    """Peak bytes of Python allocations plus Arrow's pool while ``code`` runs, in a fresh process
    (after the imports: module code is not what is measured)."""
    script = textwrap.dedent("""
        import sys, tracemalloc, pyarrow as pa
        from pathlib import Path
        from rankscope.collectors.importers.kineto import chrome_trace as kineto_reader
        from rankscope.collectors.ingest.files import ingest_file
        from rankscope.collectors.store import Store
        import rankscope.collectors.flows.flow_importers
        tracemalloc.start()
        base = pa.default_memory_pool().max_memory()
    """) + textwrap.dedent(code) + textwrap.dedent("""
        print(tracemalloc.get_traced_memory()[1] + pa.default_memory_pool().max_memory() - base)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


def test_kineto_load_memory_is_bounded_by_the_chunk_not_the_file(tmp_path):
    # the whole-file way holds the raw bytes and every event's dict: several times the file's size
    p = tmp_path / "rank0.json"
    size = _big_trace(p, 120_000)
    peak = _traced_peak(f"""
        tr = kineto_reader.load(Path({str(p)!r}))
        assert tr.frame.height > 120_000
    """)
    print("traced peak", peak, "file", size)
    assert size > 20 << 20
    assert peak < min(size // 2, 16 << 20), (peak, size)


def _ipfix_file(path: Path, n_msgs: int, per_msg: int = 30) -> None:
    tmpl = [(8, 4), (12, 4), (152, 8), (153, 8), (1, 8), (2, 8), (7, 2), (11, 2), (4, 1)]
    with open(path, "wb") as f:
        for m in range(n_msgs):
            recs = [v4(f"10.{m % 4}.{i}.1") + v4(f"10.{(m + 1) % 4}.{i}.2") + u(1_700_000_000_000 + m, 8)
                    + u(1_700_000_000_100 + m, 8) + u(1500 * (i + 1), 8) + u(i + 1, 8) + u(40000 + i, 2)
                    + u(29500, 2) + u(6, 1) for i in range(per_msg)]
            sets = ([template_set({256: tmpl})] if m % 100 == 0 else []) + [data_set(256, recs)]
            f.write(ipfix_message(sets, domain=1, seq=m * per_msg))


def _ipfix_peak(path: Path) -> int:
    return _traced_peak(f"""
        r = ingest_file(Store(Path({str(path)!r}).with_suffix(".st")), Path({str(path)!r}))
        assert r.status == "ingested", r
    """)


def test_ipfix_ingest_memory_follows_the_batch_not_the_file(tmp_path):
    small, big = tmp_path / "small.ipfix", tmp_path / "big.ipfix"
    _ipfix_file(small, 1_200)  # 36k records: two batches
    _ipfix_file(big, 4_800)  # 144k records
    p_small, p_big = _ipfix_peak(small), _ipfix_peak(big)
    # holding the file's records (the old merge of every batch) made the peak grow with the file: 4x here
    print("traced peak", p_small, p_big)
    assert p_big < 1.5 * p_small, (p_small, p_big)


def _flow_rows(st: Path) -> pl.DataFrame:
    df = Store(st).read("flow")
    return df.sort(df.columns, nulls_last=True)


def test_batched_ipfix_ingest_stores_what_one_batch_stores(tmp_path, monkeypatch):
    f = tmp_path / "flows.ipfix"
    _ipfix_file(f, 300)
    r1 = ingest_file(Store(tmp_path / "one"), f)
    monkeypatch.setattr(flow_importers, "CHUNK_RECORDS", 1000)
    r2 = ingest_file(Store(tmp_path / "many"), f)
    assert r1.records == r2.records == {"flow": 9000}
    assert len(list((tmp_path / "many" / "flow").rglob("*.parquet"))) >= 9
    assert _flow_rows(tmp_path / "one").equals(_flow_rows(tmp_path / "many"))


def test_a_file_failing_after_some_batches_leaves_no_rows(tmp_path, monkeypatch):
    f = tmp_path / "flows.ipfix"
    _ipfix_file(f, 300)
    monkeypatch.setattr(flow_importers, "CHUNK_RECORDS", 1000)
    calls = {"n": 0}
    real = flow_importers._batch

    def failing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("decoder broke in the third batch")
        return real(*a, **k)

    monkeypatch.setattr(flow_importers, "_batch", failing)
    st = Store(tmp_path / "st")
    r = ingest_file(st, f)
    assert r.status == "failed" and "third batch" in r.error and not r.records
    assert not list((tmp_path / "st").rglob("*.parquet")) and st.manifest() == []
