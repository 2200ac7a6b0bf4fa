"""`rankscope simulate`: writes a store plus truth.json; bad flags exit 2 with a clear message."""

from __future__ import annotations

import json

import pytest

from rankscope.cli.main import main
from rankscope.collectors.store import Store


def test_simulate_writes_store_and_truth(tmp_path, capsys):
    out = tmp_path / "sim"
    rc = main(["simulate", "--out", str(out), "--dp", "2", "--pp", "2", "--gpus-per-host", "2", "--steps", "2",
               "--microbatches", "2", "--layers", "4", "--fault", "slow-worker:rank=3,factor=2",
               "--rank-order", "tp-cp-ep-pp-dp", "--sampling", "4"])
    assert rc == 0
    truth = json.loads((out / "truth.json").read_text())
    job = truth["jobs"]["default"]
    assert job["faults"] == [{"kind": "worker", "injected": "slow-worker", "params": {"rank": 3, "factor": 2}}]
    assert job["degrees"] == {"dp": 2, "pp": 2, "tp": 1, "ep": 1, "cp": 1}
    assert job["pp_groups"] == [[0, 1], [2, 3]] and truth["capture"] == "fabric"
    st = Store(out)
    assert st.jobs() == ["default", "fabric"]
    assert st.count("comm_op", "default") > 0 and st.count("flow", "fabric") > 0
    assert "job default: 4 ranks" in capsys.readouterr().out
    # a second run into the same directory is refused
    assert main(["simulate", "--out", str(out)]) == 2


def test_config_file_runs_several_jobs(tmp_path):
    cfg = tmp_path / "jobs.toml"
    cfg.write_text('capture = "fab"\nbackground = false\n[[jobs]]\njob = "x"\ndp = 2\n'
                   'faults = ["gc:rank=1"]\n[[jobs]]\njob = "y"\ndp = 2\npp = 2\n')
    out = tmp_path / "o"
    assert main(["simulate", "--out", str(out), "--config", str(cfg), "--steps", "2", "--layers", "4",
                 "--gpus-per-host", "1"]) == 0
    truth = json.loads((out / "truth.json").read_text())
    assert set(truth["jobs"]) == {"x", "y"} and truth["background"] == []
    assert truth["jobs"]["x"]["steps"] == 2 and truth["jobs"]["x"]["faults"][0]["kind"] == "worker"


@pytest.mark.parametrize("args,msg", [
    (["--fault", "slow-worker:rank=99"], "rank must be in"),
    (["--fault", "meteor"], "unknown fault kind"),
    (["--fault", "gc:pause"], "not key=value"),
    (["--dp", "0"], "dp=0"),
    (["--rank-order", "tp-dp"], "rank_order"),
    (["--host-map", "0,x"], "comma-separated host slots"),
    (["--dp", "2", "--gpus-per-host", "1", "--host-map", "0,0"], "permutes the job's"),
])
def test_bad_flags_exit_2_with_a_message(tmp_path, capsys, args, msg):
    assert main(["simulate", "--out", str(tmp_path / "x"), *args]) == 2
    assert msg in capsys.readouterr().err
    assert not (tmp_path / "x" / "truth.json").exists()


def test_bad_config_file_exits_2(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("jobs: {not: a list}\n")
    assert main(["simulate", "--out", str(tmp_path / "x"), "--config", str(cfg)]) == 2
    assert "jobs" in capsys.readouterr().err


def test_realism_flag_and_config_mapping(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["simulate", "--out", str(out), "--dp", "4", "--gpus-per-host", "1", "--steps", "2",
                 "--layers", "4", "--realism", "transport=tcp,timestamp_ns=1000000,hosts_per_pod=2"]) == 0
    truth = json.loads((out / "truth.json").read_text())["jobs"]["default"]
    assert truth["flows"]["protocol"] == "tcp" and truth["flows"]["timestamp_ns"] == 1_000_000
    assert all(e.startswith("10.254.") for e in truth["exporters"])
    cfg = tmp_path / "jobs.toml"
    cfg.write_text('[realism]\ntimestamp_ns = 1000\n[[jobs]]\njob = "x"\ndp = 2\n[jobs.realism]\nreverse = true\n')
    assert main(["simulate", "--out", str(tmp_path / "c"), "--config", str(cfg), "--steps", "2", "--layers", "4",
                 "--gpus-per-host", "1"]) == 0
    t = json.loads((tmp_path / "c" / "truth.json").read_text())
    assert t["fabric"]["timestamp_ns"] == 1000 and t["jobs"]["x"]["flows"]["reverse_flows"] is True
    capsys.readouterr()
    assert main(["simulate", "--out", str(tmp_path / "bad"), "--realism", "bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().err


def test_a_deliberate_placement_from_flags(tmp_path):
    """--host-map places ranks on host slots; with --pod-uplink-gbps below the NIC rate the placement changes
    the step time, and with uplinks as fast as the NICs it does not."""
    def run(name, *extra):
        out = tmp_path / name
        assert main(["simulate", "--out", str(out), "--dp", "2", "--pp", "2", "--gpus-per-host", "1", "--steps", "3",
                     "--microbatches", "4", "--layers", "4", "--realism", "hosts_per_pod=2", "--no-flows",
                     *extra]) == 0
        return json.loads((out / "truth.json").read_text())["jobs"]["default"]

    swap = ("--host-map", "0,2,1,3")  # ranks 1 and 2 trade hosts: the pipelines, not the DP rings, stay in a pod
    assert run("map", *swap)["hosts"]["host0002"] == [1]
    assert run("a").get("step_times_ns") == run("b", *swap).get("step_times_ns")  # no pod penalty: same time
    slow = ("--pod-uplink-gbps", "10")
    assert run("c", *slow)["step_times_ns"] != run("d", *slow, *swap)["step_times_ns"]
