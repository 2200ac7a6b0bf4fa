"""The CLI's start-up imports no data library: `rankscope --help` must stay instant (issue 15)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("polars", "pyarrow", "pandas", "numpy", "dash", "torch", "sklearn", "duckdb", "ray")
COMMANDS = ("analyze", "attach", "collect", "dashboard", "diff", "export", "info", "ingest", "metrics",
            "simulate", "sql")


def _heavy_after(code: str) -> list[str]:
    probe = code + f"\nimport sys\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    return [m for m in out.strip().splitlines()[-1].split(",") if m] if out.strip() else []


def test_importing_the_cli_loads_no_data_library():
    assert _heavy_after("import rankscope.cli.main") == []


def test_top_level_help_loads_no_data_library():
    code = ("import contextlib, io\nfrom rankscope.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as buf:\n    rc = main(['--help'])\n"
            "assert rc == 0 and 'analyze' in buf.getvalue(), (rc, buf.getvalue())")
    assert _heavy_after(code) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_module_loads_no_data_library(command):
    # Listing commands imports every command module; each must defer its library imports to run time.
    assert _heavy_after(f"import rankscope.cli.commands.{command}") == []


def test_ingest_help_still_names_the_expansion_limits():
    from click.testing import CliRunner

    from rankscope.cli.main import cli
    from rankscope.collectors.importers import contract

    out = CliRunner().invoke(cli, ["ingest", "--help"]).output
    assert f"expand {contract.MAX_RATIO:g}x" in out and f"{contract.MIN_EXPANDED_BYTES >> 20} MiB" in out


def test_command_help_loads_no_data_library():
    code = ("import contextlib, io\nfrom rankscope.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    for c in " + repr(COMMANDS) + ":\n        assert main([c, '--help']) == 0, c")
    assert _heavy_after(code) == []
