"""The operators' kit in deploy/ against real clients: the alert rules through promtool (check and its unit
tests) where it is installed, and always against the metric families ``rankscope metrics`` serves; the
Grafana dashboard through the Foundation SDK that built it; the systemd units through systemd-analyze and
their command lines through the rankscope CLI's own parser."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rankscope.cli.main import cli
from rankscope.dashboard.prometheus_metrics import FAMILIES

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "rankscope-rules.yml"
DASHBOARD = DEPLOY / "grafana" / "rankscope-live.json"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
PROMTOOL = os.environ.get("PROMTOOL") or shutil.which("promtool")
SERIES = re.compile(r"\brankscope_[a-z_]+\b")


def _exposed(name: str) -> bool:
    """Whether a series name is one `rankscope metrics` serves (counters also as ``<name>``-less ``_total``)."""
    return name in FAMILIES or name + "_total" in FAMILIES


def test_alert_rules_read_only_series_rankscope_serves():
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert {"RankscopeStraggler", "RankscopeJobSlowerThanItsMedian", "RankscopeHang"} <= set(alerts)
    for name, r in alerts.items():
        used = SERIES.findall(r["expr"])
        assert used and all(_exposed(s) for s in used), (name, used)
        assert r["labels"]["severity"] in ("info", "warning", "critical")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian's prometheus package has it)")
def test_alert_rules_pass_promtool_check_and_unit_tests():
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run([PROMTOOL, "test", "rules", "rankscope-rules.test.yml"], capture_output=True, text=True,
                           timeout=60, cwd=RULES.parent)
    assert tests.returncode == 0, tests.stdout + tests.stderr


def test_dashboard_queries_read_only_series_rankscope_serves():
    text = DASHBOARD.read_text()
    exprs = re.findall(r'"expr": "([^"]*)"', text)
    assert len(exprs) >= 6
    for e in exprs:
        assert all(_exposed(s) for s in SERIES.findall(e)), e
    assert "rankscope_straggler_windows" in text and "rankscope_live_hang_info" in text


def test_dashboard_loads_through_the_sdk_that_built_it_and_is_up_to_date():
    pytest.importorskip("grafana_foundation_sdk")
    from grafana_foundation_sdk.models.dashboard import Dashboard

    data = json.loads(DASHBOARD.read_text())
    d = Dashboard.from_json(data)
    assert d.uid == "rankscope-live" and len(d.panels) >= 7
    built = subprocess.run([sys.executable, str(DEPLOY / "grafana" / "build_dashboard.py")], capture_output=True,
                           text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout) == data, "rankscope-live.json is stale: rebuild it with build_dashboard.py"


def _exec_start(unit: Path) -> list[str]:
    line = next(x for x in unit.read_text().splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart=").replace("%i", "llama"))


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_unit_command_lines_parse_with_the_cli(unit):
    argv = _exec_start(unit)
    assert argv[0].endswith("/rankscope")
    ctx = cli.make_context("rankscope", argv[1:2])  # the subcommand name
    cmd = cli.get_command(ctx, argv[1])
    args = argv[2:]
    while hasattr(cmd, "get_command"):  # a group: `collect flows`
        cmd, args = cmd.get_command(ctx, args[0]), args[1:]
    cmd.make_context(cmd.name, list(args))  # raises on an unknown option or a bad value


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_units_pass_systemd_analyze_verify(tmp_path):
    rankscope = Path(sys.executable).parent / "rankscope"
    for unit in UNITS:
        text = unit.read_text().replace("/opt/rankscope/bin/rankscope", str(rankscope))
        name = unit.name.replace("@.", "@llama.")
        (tmp_path / name).write_text(text)
        r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / name)], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"})
        problems = [x for x in (r.stdout + r.stderr).splitlines() if name in x or "Unknown" in x]
        assert not problems, problems
