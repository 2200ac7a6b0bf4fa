"""One snapshot per read: every kind and the manifest of one read come from the same commits (issue 41).

A writer commits 150 sources, each 3 comm_op and 5 compute_op rows in one transaction (parts first, the
manifest entry last, as ingest does); beside it, 200 reads through duckdb(), load_job and the info summary
must each see whole commits only: comm_op x 5 == compute_op x 3, and as many sources as commits."""

from __future__ import annotations

import subprocess
import sys

from rankscope.cli.commands.info import store_summary
from rankscope.collectors.job_frames import load_job
from rankscope.collectors.store import Store

WRITER = """
import sys, polars as pl
from rankscope.collectors.schema import conform
from rankscope.collectors.store import ManifestEntry, Store
s = Store(sys.argv[1])
for i in range(150):
    key = Store.manifest_key(f"{i:064x}", "j")
    comm = pl.DataFrame({"job": "j", "rank": [0, 1, 2], "op": "all_reduce", "start_ns": i * 100,
                         "end_ns": i * 100 + 5, "source": "t"})
    comp = pl.DataFrame({"job": "j", "rank": [0, 1, 2, 3, 4], "name": "gemm", "category": "gemm",
                         "start_ns": i * 100, "end_ns": i * 100 + 7, "source": "t"})
    with s.transaction(key) as tx:
        tx.write("comm_op", conform(comm, "comm_op"))
        tx.write("compute_op", conform(comp, "compute_op"))
        tx.commit(ManifestEntry(key=key, source=f"src{i}", format="t", job="j", records={"comm_op": 3}))
print("done")
"""

READS = 200


def _whole(comm: int, comp: int, sources: int | None = None) -> bool:
    return comm * 5 == comp * 3 and (sources is None or comm == 3 * sources)


def test_reads_beside_an_ingest_see_whole_commits_only(tmp_path):
    root = tmp_path / "st"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE, text=True)
    store, torn, seen = Store(root), [], set()
    try:
        for i in range(READS):
            if i % 3 == 0:
                con = store.duckdb()
                comm = con.execute("SELECT count(*) FROM comm_op").fetchone()[0]
                comp = con.execute("SELECT count(*) FROM compute_op").fetchone()[0]
                ok = _whole(comm, comp)
            elif i % 3 == 1:
                jf = load_job(store, "j") if store.jobs() else None
                comm, comp = (jf.comm_op.height, jf.compute_op.height) if jf else (0, 0)
                ok = _whole(comm, comp)
            else:
                s = store_summary(store)
                kinds = s["jobs"].get("j", {})
                comm, comp = kinds.get("comm_op", {}).get("rows", 0), kinds.get("compute_op", {}).get("rows", 0)
                ok = _whole(comm, comp, s["sources"])
            seen.add(comm)
            if not ok:
                torn.append((i, comm, comp))
    finally:
        out = writer.communicate(timeout=300)[0]
    assert writer.returncode == 0 and out.strip() == "done"
    assert len(seen) > 3, "the reads did not overlap the ingest; the test proved nothing"
    assert not torn, f"{len(torn)} of {READS} reads saw half a commit: {torn[:5]}"
    con = Store(root).duckdb()
    assert con.execute("SELECT count(*) FROM comm_op").fetchone()[0] == 450
