"""One condition, one exit code: bad output paths exit 1 naming the path, a missing store is 2."""

from __future__ import annotations

import pytest

from rankscope.cli.main import main
from tests.unit.collectors.test_ingest import write_comm_csv


@pytest.fixture
def plain_file(tmp_path):
    f = tmp_path / "plain"
    f.write_text("not a folder")
    return f


@pytest.fixture
def store(tmp_path):
    src = tmp_path / "comm_op.csv"
    write_comm_csv(src, 20)
    st = tmp_path / "st"
    assert main(["ingest", str(src), "--store", str(st), "-q"]) == 0
    return st


def test_output_under_a_plain_file_exits_1_naming_it(store, plain_file, tmp_path, capsys):
    bad = plain_file / "sub"
    cases = [
        ["analyze", "--store", str(store), "--out-dir", str(bad), "--no-html"],
        ["export", "perfetto", "--store", str(store), "--out", str(bad / "t.json")],
        ["simulate", "--out", str(bad), "--dp", "2", "--steps", "2"],
        ["attach", "--store", str(bad), "--", "true"],
        ["ingest", str(tmp_path / "comm_op.csv"), "--store", str(bad)],
        ["diff", "--store", str(store), "--baseline", str(store), "--json", str(bad / "d.json")],
        ["collect", "flows", "--store", str(bad), "--listen", "127.0.0.1:0", "--max-seconds", "1"],
    ]
    for argv in cases:
        capsys.readouterr()
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert str(plain_file) in err and "Traceback" not in err, (argv, err)


def test_missing_store_is_a_usage_error_everywhere(tmp_path, capsys):
    nope = str(tmp_path / "nope")
    for argv in (["sql", "--store", nope, "select 1"], ["info", "--store", nope],
                 ["analyze", "--store", nope, "--out-dir", str(tmp_path / "o")],
                 ["export", "perfetto", "--store", nope, "--out", str(tmp_path / "t.json")],
                 ["diff", "--store", nope, "--baseline", nope], ["dashboard", "--store", nope]):
        assert main(argv) == 2, argv


def test_sql_job_is_checked_against_the_store(store, tmp_path, capsys):
    (tmp_path / "x" / "comm_op" / "job=s").mkdir(parents=True)
    assert main(["sql", "--store", str(store), "--job", "*/../../../x/comm_op/job=s", "select 1"]) == 2
    assert main(["sql", "--store", str(store), "--job", "other", "select 1"]) == 2
    assert main(["sql", "--store", str(store), "--job", "default", "--csv", "select count(*) from comm_op"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "20"


def test_bad_first_file_does_not_stop_the_folder(tmp_path, capsys):
    d = tmp_path / "in"
    d.mkdir()
    (d / "a_comm_op.csv").write_text("rank,op\n\"unterminated")
    write_comm_csv(d / "b_comm_op.csv", 10)
    write_comm_csv(d / "c_comm_op.csv", 10, bad=set(range(10)))
    assert main(["ingest", str(d), "--store", str(tmp_path / "st"), "-q"]) == 1
    out = capsys.readouterr()
    assert "a_comm_op.csv" in out.err and "c_comm_op.csv" in out.err and "Traceback" not in out.err
    assert main(["sql", "--store", str(tmp_path / "st"), "--csv", "select count(*) from comm_op"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "10"
