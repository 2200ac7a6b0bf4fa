"""Parallel decode of an ingest: the store and the per-file results are exactly the serial ones."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl

from rankscope.collectors.ingest import parallel_decode
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.store import Store
from tests.unit.collectors.test_kineto_import import gloo_trace

REPO = Path(__file__).resolve().parents[3]
HTA = REPO / "tests" / "data" / "hta"

# Runs in a fresh interpreter: pytest's own process has started polars' thread pool, so it never forks.
_INGEST = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from rankscope.collectors.ingest import parallel_decode
    from rankscope.collectors.ingest.files import ingest
    from rankscope.collectors.store import Store
    made = []
    init = parallel_decode.Ahead.__init__
    def spy(self, *a, **k):
        made.append(self)
        init(self, *a, **k)
    parallel_decode.Ahead.__init__ = spy
    s = ingest(Store(sys.argv[1]), sys.argv[2:])
    print(json.dumps({"parallel": [a.submitted for a in made], "files": [[f.path, f.status, f.records, dict(f.rejects), f.error,
                      f.warnings] for f in s.files]}))
""")


def _run(store: Path, files: list[Path], workers: int) -> dict:
    env = {**os.environ, parallel_decode.WORKERS_ENV: str(workers)}
    out = subprocess.run([sys.executable, "-c", _INGEST, str(store), *map(str, files)], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _contents(store: Path) -> dict:
    st = Store(store)
    out = {}
    for kind in ("comm_op", "compute_op", "step_mark"):
        df = st.read(kind)
        out[kind] = df.sort([c for c in df.columns if not df[c].dtype.is_nested()]).to_dicts() if df.height else []
    man = sorted((e.source, e.format, e.records, e.rejects, json.dumps(e.notes, sort_keys=True, default=str),
                  sorted(e.samples.items())) for e in st.manifest())
    return {"rows": out, "manifest": man}


def _corpus(tmp: Path) -> list[Path]:
    files = sorted(HTA.glob("*.json.gz"))
    for r in range(3):
        p = tmp / f"rank{r}.json.gz"
        p.write_bytes(gzip.compress(json.dumps(gloo_trace(rank=r, steps=20)).encode()))
        files.append(p)
    bad = tmp / "rank7.json"
    bad.write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": ')  # no event
    trunc = tmp / "rank8.json"
    doc = json.dumps(gloo_trace(rank=8, steps=5))
    trunc.write_text(doc[: len(doc) * 2 // 3])  # truncated: repaired by the serial path, in the parent
    return [*files, bad, trunc]


def test_parallel_ingest_equals_serial(tmp_path):
    files = _corpus(tmp_path)
    serial = _run(tmp_path / "serial", files, workers=0)
    parallel = _run(tmp_path / "parallel", files, workers=2)
    one = _run(tmp_path / "one", files, workers=1)  # one worker: decode and write overlap
    assert serial["parallel"] == [0] and parallel["parallel"] == one["parallel"] == [len(files)]
    assert parallel["files"] == serial["files"]
    assert [f[1:] for f in one["files"]] == [f[1:] for f in serial["files"]]
    statuses = [f[1] for f in serial["files"]]
    assert statuses.count("ingested") == len(files) - 1 and statuses.count("failed") == 1
    assert any("truncated" in r for f in serial["files"] for r in f[3])
    a, b = _contents(tmp_path / "serial"), _contents(tmp_path / "parallel")
    assert a == b == _contents(tmp_path / "one") and len(a["rows"]["compute_op"]) > 100 and a["rows"]["comm_op"]
    # a second ingest of the same files skips the stored ones without decoding them: only the failed file
    # is decoded again
    again = _run(tmp_path / "parallel", files, workers=2)
    assert again["parallel"] == [1] and {f[1] for f in again["files"]} == {"skipped", "failed"}


def test_no_fork_once_polars_pool_runs(tmp_path, monkeypatch):
    """This process has run polars: forking it could deadlock a worker, so ingest stays serial, and works."""
    pl.DataFrame({"a": [1, 2, 3]}).filter(pl.col("a") > 1)
    assert not parallel_decode._fork_safe()
    monkeypatch.setenv(parallel_decode.WORKERS_ENV, "2")
    s = ingest(Store(tmp_path / "st"), _corpus(tmp_path)[-5:])
    assert [f.status for f in s.files].count("ingested") == 4


_HUNG = textwrap.dedent("""
    import json, sys
    import polars as pl
    from rankscope.collectors.ingest import parallel_decode
    from rankscope.collectors.ingest.files import ingest
    from rankscope.collectors.importers.kineto.importer import KINETO
    from rankscope.collectors.store import Store
    pl.DataFrame({"a": [1, 2, 3]}).filter(pl.col("a") > 1)  # polars' pool runs: a forked child hangs in it
    parallel_decode._fork_safe = lambda: True  # as if the guard had missed it
    parallel_decode._PROBE_S = 2.0
    read, in_parent = KINETO.read, []
    KINETO.read = lambda path, opts: (in_parent.append(path), read(path, opts))[1]
    s = ingest(Store(sys.argv[1]), sys.argv[2:])
    print(json.dumps({"status": [f.status for f in s.files], "decoded_in_parent": len(in_parent)}))
""")


def test_hung_worker_falls_back_to_serial(tmp_path):
    """Should a worker be forked after polars' pool started, its probe hangs; the watchdog ends it and the
    parent decodes every file itself."""
    files = _corpus(tmp_path)[-5:-2]
    env = {**os.environ, parallel_decode.WORKERS_ENV: "2"}
    out = subprocess.run([sys.executable, "-c", _HUNG, str(tmp_path / "st"), *map(str, files)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"status": ["ingested"] * 3, "decoded_in_parent": 3}


def test_workers_follow_idle_cores_unless_set(monkeypatch):
    monkeypatch.delenv(parallel_decode.WORKERS_ENV, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    for load, want in ((0.1, 4), (1.2, 4), (2.6, 2), (3.8, 1), (9.0, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert parallel_decode._workers(8) == want, load
    assert parallel_decode._workers(2) == 1  # load 9: one worker, so that decode and write still overlap
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert parallel_decode._workers(3) == 3  # never more workers than files
    monkeypatch.setenv(parallel_decode.WORKERS_ENV, "2")
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert parallel_decode._workers(8) == 2  # set explicitly: the load is not asked
