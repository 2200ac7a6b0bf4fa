from __future__ import annotations

import subprocess
import sys

import pytest

from rankscope.cli.main import COMMANDS, main

from ..collectors.test_ingest import write_comm_csv  # noqa: F401  (importlib mode: see below)


def run(*args):
    return subprocess.run([sys.executable, "-m", "rankscope.cli.main", *args], capture_output=True, text=True)


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_every_command_has_help_with_example(cmd):
    r = run(cmd, "--help")
    assert r.returncode == 0, r.stderr
    assert "Example" in r.stdout


def test_usage_errors_exit_2(tmp_path):
    assert run("ingest", "--store", str(tmp_path)).returncode == 2
    assert run("nosuchcommand").returncode == 2
    assert run("sql", "--store", str(tmp_path), "selec nothing").returncode == 2
    assert main(["ingest", str(tmp_path), "--store", str(tmp_path / "s"), "--job", "../x"]) == 2


def test_ingest_info_sql_roundtrip(tmp_path):
    src = tmp_path / "comm_op.csv"
    write_comm_csv(src, 1000, bad={1, 2, 3, 4, 5})
    st = tmp_path / "st"
    r = run("ingest", str(src), "--store", str(st), "-q")
    assert r.returncode == 0, r.stderr
    assert "comm_op 995" in r.stdout and "rejected 5" in r.stdout
    r = run("ingest", str(src), "--store", str(st), "-q")
    assert "skipped 1" in r.stdout and "no records" in r.stdout
    r = run("sql", "--store", str(st), "select count(*) as n from comm_op", "--csv")
    assert r.returncode == 0 and r.stdout == "n\n995\n"
    r = run("sql", "--store", str(st), "select count(*) as n from flow", "--csv")
    assert r.stdout == "n\n0\n"
    r = run("info", "--store", str(st))
    assert "job default" in r.stdout and "995 rows" in r.stdout and "unknown op" in r.stdout


def test_all_files_failed_exits_1(tmp_path):
    junk = tmp_path / "x.bin"
    junk.write_bytes(b"\x00")
    assert main(["ingest", str(junk), "--store", str(tmp_path / "s"), "-q"]) == 1
