from __future__ import annotations

import csv
import gzip

from rankscope.collectors.importers.contract import ImportOptions
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.store import Store

T0 = 1_764_000_000_000_000_000


def write_comm_csv(path, n=1000, bad=()):
    """n rows; the indices in `bad` get one defect each, cycling through five kinds of defect."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rank", "op", "group_id", "group_ranks", "size_bytes", "dtype", "start_ns", "end_ns", "seq"])
        for i in range(n):
            r = [i % 4, "all_reduce", "0", "[0,1,2,3]", 4096, "float32", T0 + i * 1000, T0 + i * 1000 + 500, i // 4]
            if i in bad:
                j = sorted(bad).index(i) % 5
                if j == 0:
                    r[1] = "allreduce"          # unknown op
                elif j == 1:
                    r[7] = T0 + i * 1000 - 1    # end < start
                elif j == 2:
                    r[4] = -8                   # negative size
                elif j == 3:
                    r[0] = "rank?"              # wrong type
                else:
                    r[6] = ""                   # missing start
            w.writerow(r)


def test_csv_with_five_bad_rows(tmp_path):
    src = tmp_path / "comm_op.csv"
    write_comm_csv(src, 1000, bad={3, 100, 500, 777, 999})
    st = Store(tmp_path / "st")
    s = ingest(st, [src], opts=ImportOptions(job="j"))
    assert s.records == {"comm_op": 995}
    assert s.rejects == {"unknown op": 1, "end_ns < start_ns": 1, "negative size_bytes": 1,
                         "wrong type rank": 1, "null start_ns": 1}
    again = ingest(st, [src], opts=ImportOptions(job="j"))
    assert again.count("skipped") == 1 and not again.records
    assert st.count("comm_op") == 995
    (entry,) = st.manifest()
    assert entry.records == {"comm_op": 995} and sum(entry.rejects.values()) == 5


def test_default_job_and_gzip_and_dirs(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    write_comm_csv(d / "comm_op-a.csv", 10)
    raw = (d / "comm_op-a.csv").read_bytes()
    with gzip.open(d / "comm_op-b.csv.gz", "wb") as f:
        f.write(raw.replace(b"float32", b"bfloat16"))
    st = Store(tmp_path / "st")
    s = ingest(st, [d])
    assert s.count("ingested") == 2
    assert st.jobs() == ["default"] and st.count("comm_op", "default") == 20


def test_bad_file_does_not_stop_the_rest(tmp_path):
    good = tmp_path / "comm_op.csv"
    write_comm_csv(good, 10)
    empty = tmp_path / "comm_op-empty.csv"
    empty.write_text("")
    junk = tmp_path / "mystery.bin"
    junk.write_bytes(b"\x00\x01garbage")
    ragged = tmp_path / "step_mark.csv"
    ragged.write_text("rank,step,start_ns,end_ns\n0,1,10,20\n0,2,30\n0,3,40,50\n")
    st = Store(tmp_path / "st")
    s = ingest(st, [empty, junk, good, ragged])
    status = {r.path.rsplit("/", 1)[-1]: r.status for r in s.files}
    assert status == {"comm_op-empty.csv": "failed", "mystery.bin": "unknown",
                      "comm_op.csv": "ingested", "step_mark.csv": "ingested"}
    assert "empty file" in s.files[0].error and "comm_op-empty.csv" in s.files[0].error
    assert st.count("comm_op") == 10 and st.count("step_mark") == 2
    assert s.rejects["wrong number of fields"] == 1


def test_crashed_ingest_leftovers_are_replaced(tmp_path):
    src = tmp_path / "comm_op.csv"
    write_comm_csv(src, 10)
    st = Store(tmp_path / "st")
    ingest(st, [src], opts=ImportOptions(job="j"))
    # Simulate a crash after the parts were written but before the manifest entry.
    for m in st.manifest_dir().glob("*.json"):
        m.unlink()
    ingest(st, [src], opts=ImportOptions(job="j"))
    assert st.count("comm_op") == 10


def test_kind_from_header(tmp_path):
    src = tmp_path / "whatever.csv"
    src.write_text("job,rank,step,microbatch,seq_len\nj,0,0,0,4096\nj,0,0,1,0\n")
    st = Store(tmp_path / "st")
    s = ingest(st, [src])
    assert s.records == {"batch_meta": 1} and s.rejects == {"seq_len == 0": 1}
