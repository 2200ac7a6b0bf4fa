"""``rankscope watch`` over a store, its --events stream, and the live series ``rankscope metrics`` serves from
the latest window (parsed with prometheus_client's own parser)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from rankscope.cli.main import main  # noqa: E402
from rankscope.collectors.store import Store  # noqa: E402
from rankscope.datasets.simulator import Fault, SimConfig, simulate, write_store  # noqa: E402
from tests.unit.dashboard.test_prometheus_metrics import metric_series  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    cfg = SimConfig(job="live", dp=2, pp=2, steps=12, flows=False, hidden=512, layers=4, seq_len=512,
                    faults=(Fault("slow-worker", {"rank": 3, "factor": 2.0}),))
    out = tmp_path_factory.mktemp("watch") / "st"
    write_store(simulate(cfg), out)
    return out


def test_watch_once_writes_one_event_per_window_and_a_line_each(store, capsys):
    assert main(["watch", "--store", str(store), "--job", "live", "--once", "--events", "-",
                 "--window-steps", "4", "--warmup-steps", "4"]) == 0
    cap = capsys.readouterr()
    events = [json.loads(x) for x in cap.out.splitlines()]
    assert [e["window_end_step"] for e in events] == [3, 7, 11]
    assert events[0]["verdict"] is None and "warm-up" in events[0]["why"]
    for e in events[1:]:
        assert e["verdict"] == "worker" and e["culprit"]["rank"] == 3 and e["straggler"]
        assert e["findings"][0]["culprit"] == e["culprit"] and e["slowdown"] > 1.05
    assert events[2]["straggler_windows"] == 2
    lines = [x for x in cap.err.splitlines() if x.startswith("step")]
    assert len(lines) == 3 and "worker" in lines[1] and "rank 3" in lines[1] and "cost" in lines[1]


def test_metrics_serve_the_latest_window(store, tmp_path, capsys):
    assert main(["watch", "--store", str(store), "--job", "live", "--once"]) == 0
    out = tmp_path / "m.prom"
    assert main(["metrics", "--store", str(store), "--textfile", str(out)]) == 0
    series = metric_series(out.read_text())
    (step,) = series["rankscope_window_step"]
    assert step.labels == {"job": "live"} and step.value == 11
    (info,) = series["rankscope_straggler_info"]
    assert info.labels == {"job": "live", "rank": "3", "cause": "worker"} and info.value == 1
    (streak,) = series["rankscope_straggler_windows"]
    assert streak.value == 2
    assert series["rankscope_window_slowdown_ratio"][0].value > 1.05


def test_a_live_hang_is_a_series_per_missing_rank(tmp_path):
    st = Store(tmp_path / "st")
    st.write_live("h", {"job": "h", "kind": "hang", "window_start_step": 8, "window_end_step": 7, "slowdown": None,
                        "verdict": None, "culprit": {"rank": 1}, "findings": [], "hangs": [], "straggler": False,
                        "dropped_windows": 0})
    out = tmp_path / "m.prom"
    assert main(["metrics", "--store", str(st.root), "--textfile", str(out)]) == 0
    series = metric_series(out.read_text())
    (hang,) = series["rankscope_live_hang_info"]
    assert hang.labels == {"job": "h", "rank": "1"} and hang.value == 1
    assert "rankscope_straggler_info" not in series


def test_watch_on_a_missing_store_or_a_hop_past_the_window_is_a_usage_error(tmp_path, capsys):
    assert main(["watch", "--store", str(tmp_path / "nope"), "--once"]) == 2
    (tmp_path / "st").mkdir()
    assert main(["watch", "--store", str(tmp_path / "st"), "--once", "--hop-steps", "5"]) == 2
    assert "--hop-steps 5" in capsys.readouterr().err


def test_watch_follows_a_flow_capture_per_job_it_holds(tmp_path, capsys):
    cfg = SimConfig(job="j", dp=4, pp=2, steps=10, gpus_per_host=1, flows=True,
                    faults=(Fault("slow-link", {"rank": 5, "factor": 4.0}),))
    write_store(simulate(cfg), tmp_path / "st")
    assert main(["watch", "--store", str(tmp_path / "st"), "--job", "fabric", "--once", "--window-s", "6",
                 "--events", "-"]) == 0
    cap = capsys.readouterr()
    events = [json.loads(x) for x in cap.out.splitlines()]
    assert events and {e["job"] for e in events} == {"fabric"}
    judged = [e for e in events if e["verdict"]]
    assert judged and all(e["verdict"] == "communication" and "10.0.0.6" in json.dumps(e["culprit"]) for e in judged)
    assert "capture fabric: jobs ['fabric']" in cap.err


def test_watch_topology_reaches_the_analysis_and_a_bad_file_is_named(tmp_path, capsys, monkeypatch):
    from rankscope.cli.commands import watch as watch_cmd

    cfg = SimConfig(job="j", dp=2, pp=2, steps=4, gpus_per_host=1, flows=True)
    write_store(simulate(cfg), tmp_path / "st")
    topo = tmp_path / "topo.csv"
    topo.write_text("endpoint,host,leaf,pod\n" + "".join(f"10.0.0.{i},h{i},l0,p0\n" for i in range(1, 5)))
    seen = {}
    follow = watch_cmd.follow

    def spy(store, job, config, *args):
        seen["config"] = config
        return follow(store, job, config, *args)

    monkeypatch.setattr(watch_cmd, "follow", spy)
    assert main(["watch", "--store", str(tmp_path / "st"), "--job", "fabric", "--once", "--topology", str(topo)]) == 0
    assert seen["config"].diagnose.topology.source == f"file: {topo}"
    assert main(["watch", "--store", str(tmp_path / "st"), "--once", "--topology", str(tmp_path / "nope.csv")]) == 2
    assert "nope.csv" in capsys.readouterr().err
