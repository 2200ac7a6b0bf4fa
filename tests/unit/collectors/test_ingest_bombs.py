"""Decompression and reference bombs are refused with a clear error, in bounded memory."""

from __future__ import annotations

import pickle
import subprocess
import sys
import zlib

import pytest

from tests.unit.collectors.test_flight_recorder import nccl_dump

MAX_RSS_BYTES = 1 << 30

# The child reports its own VmHWM: ru_maxrss would start at the RSS of the pytest process that forked it
# (Linux keeps the high-water mark across exec), which a full run grows past 1 GiB.
PROBE = """
import sys
from pathlib import Path
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.store import Store
s = ingest(Store(sys.argv[1]), [Path(sys.argv[2])])
f = s.files[0]
print(f.status, '|', f.error, '|', sum(f.records.values()))
print(next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM')) * 1024)
"""


def _gzip_repeated(path, block: bytes, total: int, head: bytes = b"", tail: bytes = b""):
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with open(path, "wb") as f:
        f.write(c.compress(head))
        for _ in range(total // len(block)):
            f.write(c.compress(block))
        f.write(c.compress(tail) + c.flush())


def _probe(tmp_path, src):
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "st"), str(src)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    status_line, rss = out.stdout.strip().splitlines()[-2:]
    status, error, records = (x.strip() for x in status_line.split("|"))
    return status, error, int(records), int(rss)


@pytest.mark.slow
def test_csv_gz_of_a_gib_of_newlines(tmp_path):
    src = tmp_path / "comm_op.csv.gz"
    _gzip_repeated(src, b"\n" * (1 << 20), 1 << 30, head=b"rank,op,start_ns,end_ns\n")
    assert src.stat().st_size < 2 << 20
    status, error, records, rss = _probe(tmp_path, src)
    assert status == "failed" and "expands to at most" in error and str(src) in error
    assert records == 0 and rss < MAX_RSS_BYTES, rss


@pytest.mark.slow
def test_json_gz_bomb(tmp_path):
    src = tmp_path / "rank0.pt.trace.json.gz"
    ev = b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1},' * 1000
    _gzip_repeated(src, ev, 1 << 30, head=b'{"schemaVersion": 1, "traceEvents": [', tail=b"{}]}")
    status, error, records, rss = _probe(tmp_path, src)
    assert status == "failed" and "expands to at most" in error
    assert records == 0 and rss < MAX_RSS_BYTES, rss


def test_pickle_reference_bomb(tmp_path):
    entry = pickle.dumps(nccl_dump()["entries"][0], protocol=2)[2:-1]  # the dict's opcodes, memoised
    n = 400_000
    body = b"(" + entry + b"q\x01" + b"h\x01" * n + b"l"
    src = tmp_path / "nccl_trace_rank_0"
    src.write_bytes(b"\x80\x02}(X\x07\x00\x00\x00entries" + body + b"X\x07\x00\x00\x00versionX\x03\x00\x00\x002.4u.")
    assert len(pickle.loads(src.read_bytes())["entries"]) == n + 1  # it is a real pickle
    status, error, records, rss = _probe(tmp_path, src)
    assert status == "failed" and "repeated references" in error
    assert records == 0 and rss < MAX_RSS_BYTES, rss


def test_max_bytes_lets_a_big_but_honest_file_through(tmp_path):
    from rankscope.cli.main import main

    src = tmp_path / "comm_op.csv.gz"
    rows = b"".join(b"0,all_reduce,0,[0],8,float32,%d,%d,%d\n" % (10 + i, 20 + i, i) for i in range(1000))
    _gzip_repeated(src, b" " * (1 << 20), 80 << 20,
                   head=b"rank,op,group_id,group_ranks,size_bytes,dtype,start_ns,end_ns,seq\n" + rows)
    st = str(tmp_path / "st")
    assert main(["ingest", str(src), "--store", st, "-q"]) == 1
    assert main(["ingest", str(src), "--store", st, "-q", "--max-bytes", str(200 << 20)]) == 0
