"""What a new user expects of the command line: help on every option, dates people read, the only job picked
without --job, the report's sections in a terminal, one finding per throttled rank."""

from __future__ import annotations

import importlib
import subprocess
import sys

import click
import pytest

from rankscope.analysis.report.findings import describe, kernel_findings
from rankscope.analysis.report.kernels import Regression, ThroughputCheck
from rankscope.cli.commands.info import duration_text, time_text
from rankscope.cli.main import COMMANDS
from rankscope.datasets.simulator import Fault, SimConfig, simulate, write_store


def run(*args):
    return subprocess.run([sys.executable, "-m", "rankscope.cli.main", *args], capture_output=True, text=True,
                          timeout=600)


def _commands():
    for name, target in sorted(COMMANDS.items()):
        mod, attr = target[0].split(":")
        cmd = getattr(importlib.import_module(mod), attr)
        yield from ((f"{name} {c.name}", c) for c in cmd.commands.values()) if isinstance(cmd, click.Group) \
            else [(name, cmd)]


@pytest.mark.parametrize("name,cmd", list(_commands()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_option_has_a_help_line(name, cmd):
    missing = [p.name for p in cmd.params if isinstance(p, click.Option) and not p.help]
    assert not missing, f"rankscope {name}: options without help: {missing}"


def test_times_read_as_utc_dates_and_durations():
    assert time_text(1_700_000_000_123_456_789, False) == "2023-11-14 22:13:20.123 UTC"
    assert time_text(2_500_000_000, True) == "t+2.500 s"
    assert duration_text(12_500_000) == "12.5 ms"
    assert duration_text(127_500_000_000) == "2 min 07.5 s"
    assert duration_text(3 * 3600 * 10**9 + 5 * 60 * 10**9) == "3 h 05 min"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    out = tmp_path_factory.mktemp("comforts") / "st"
    cfg = SimConfig(job="only", dp=2, pp=2, steps=4, microbatches=4, layers=8, seed=5, flows=False,
                    faults=(Fault("slow-worker", {"rank": 1, "factor": 1.6}),))
    write_store(simulate(cfg), out)
    return out


def test_info_prints_dates_not_epoch_nanoseconds(store):
    r = run("info", "--store", str(store))
    assert r.returncode == 0, r.stderr
    assert " UTC" in r.stdout and "from 1" not in r.stdout


def test_export_picks_the_stores_only_job(store, tmp_path):
    r = run("export", "perfetto", "--store", str(store), "--out", str(tmp_path / "t.json"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "t.json").stat().st_size > 0


def test_analyze_format_text_prints_the_sections_and_names_the_culprit(store, tmp_path):
    r = run("analyze", "--store", str(store), "--out-dir", str(tmp_path / "r"), "--no-html", "--format", "text")
    assert r.returncode == 0, r.stderr
    for section in ("strategy", "steps", "stragglers", "findings", "regressions", "hangs", "data quality"):
        assert f"\n{section}" in r.stdout, section
    assert "verdict worker: rank 1 " in r.stdout


def test_one_kernel_finding_per_throttled_rank():
    def reg(kind, culprit, factor, step, kernel, reason):
        check = ThroughputCheck("throughput", kernel, [kernel], "gemm_other", [step], "bfloat16", "tn", [5],
                                1 / factor, "other ranks", 1.0, 1.5, reason, "regression", "ranks")
        return Regression(check=check, kind=kind, culprit=culprit, factor=factor, steps=[step], evidence={})

    regs = [reg("kernel_regression", 5, 1.4 + i / 100, i, f"k{i}", "slow") for i in range(8)]
    regs.append(reg("misaligned_gemm", "gemm.fc1.fwd", 1.8, 0, "gemm.fc1.fwd", "dim 8190"))
    found = kernel_findings(regs)
    kernel = [f for f in found if f.kind == "kernel_regression"]
    assert len(kernel) == 1 and len(kernel[0].evidence["kernels"]) == 8
    assert kernel[0].factor == pytest.approx(1.47) and kernel[0].steps == list(range(8))
    assert describe(kernel[0]) == "rank 5: 8 GEMM shapes 1.47x slower than elsewhere in the run"
    mis = [f for f in found if f.kind == "misaligned_gemm"]
    assert describe(mis[0]) == "gemm.fc1.fwd 1.80x slower: misaligned for tensor cores"
