"""`rankscope --help` imports no heavy library: each command imports only what it uses when it runs."""

import subprocess
import sys

HEAVY = ("polars", "pyarrow", "pandas", "duckdb", "torch", "sklearn", "dash", "plotly", "numpy")

PROBE = """
import sys
from rankscope.cli.main import main
rc = main(["--help"])
loaded = sorted(m for m in {heavy!r} if m in sys.modules)
print("LOADED", ",".join(loaded))
sys.exit(rc)
"""


def test_help_lists_every_command_without_importing_heavy_libraries():
    r = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "LOADED \n" in r.stdout or r.stdout.rstrip().endswith("LOADED"), r.stdout[-300:]
    from rankscope.cli.main import COMMANDS

    for name in COMMANDS:
        assert f"\n  {name} " in r.stdout, name


def test_every_listed_command_resolves_to_a_click_command():
    import click

    from rankscope.cli.main import COMMANDS, cli

    for name in COMMANDS:
        assert isinstance(cli.get_command(None, name), click.Command), name
