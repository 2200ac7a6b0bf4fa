"""Nothing visible until committed, on a full disk too (issue 41): the simulator writes through ingest's
transaction, reports and exports are renamed into place, and the error names the input and the store.

The full disk is RLIMIT_FSIZE in a child process (SIGXFSZ ignored, so a write fails with EFBIG as with
ENOSPC): no mount, no privilege, and the same write paths fail."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

from rankscope.collectors.store import Store

KINETO = Path(__file__).parents[2] / "data" / "gloo_dp2pp2tp2" / "kineto" / "rank0.json.gz"
CLI = "import sys; from rankscope.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _rankscope(*argv, max_file_bytes: int | None = None) -> tuple[int, str]:
    def cap():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))
    r = subprocess.run([sys.executable, "-c", CLI, *map(str, argv)], capture_output=True, text=True, timeout=300,
                       preexec_fn=cap if max_file_bytes else None)
    return r.returncode, r.stdout + r.stderr


def _rows(root: Path) -> dict[str, int]:
    s = Store(root)
    return {k: s.count(k) for k in ("comm_op", "compute_op") if s.count(k)}


def test_simulate_on_a_full_disk_leaves_nothing_and_a_retry_does_not_double(tmp_path):
    out = tmp_path / "sim"
    rc, text = _rankscope("simulate", "--out", out, max_file_bytes=20_000)
    assert rc == 1 and "Traceback" not in text and str(out) in text, text
    assert _rows(out) == {} and not (out / "truth.json").exists()
    rc, text = _rankscope("info", "--store", out)
    assert rc == 0 and "0 job(s)" in text
    rc, text = _rankscope("simulate", "--out", out)
    assert rc == 0, text
    once = tmp_path / "once"
    assert _rankscope("simulate", "--out", once)[0] == 0
    assert _rows(out) == _rows(once) and _rows(once)
    assert len(Store(out).manifest()) == 1


def test_ingest_on_a_full_disk_names_the_input_and_the_store_and_counts_no_reject(tmp_path):
    st = tmp_path / "st"
    rc, text = _rankscope("ingest", "--store", st, KINETO, max_file_bytes=8_000)
    assert rc == 1 and "Traceback" not in text
    line = next(x for x in text.splitlines() if "failed:" in x and str(KINETO) in x)
    assert f"not stored in {st}" in line
    assert "rejected" not in text and "StoreError" not in text
    assert _rows(st) == {}
    assert _rankscope("ingest", "--store", st, KINETO)[0] == 0
    assert _rows(st) == {"comm_op": 66, "compute_op": 183}


def test_a_report_or_export_on_a_full_disk_leaves_the_previous_file_whole(tmp_path):
    st, rep = tmp_path / "st", tmp_path / "rep"
    assert _rankscope("ingest", "--store", st, KINETO)[0] == 0
    assert _rankscope("analyze", "--store", st, "--out-dir", rep)[0] == 0
    before = (rep / "default.json").read_bytes()
    rc, text = _rankscope("analyze", "--store", st, "--out-dir", rep, max_file_bytes=4_096)
    assert rc == 1 and "Traceback" not in text and "default.json" in text, text
    assert (rep / "default.json").read_bytes() == before
    json.loads(before)
    out = rep / "t.json.gz"
    rc, text = _rankscope("export", "perfetto", "--store", st, "--out", out, max_file_bytes=1_000)
    assert rc == 1 and "Traceback" not in text and not out.exists(), text
    assert not [p for p in rep.iterdir() if p.name.endswith(".tmp")]
