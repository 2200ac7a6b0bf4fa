"""The ``rankscope`` command group.

Each subcommand lives in its own module of ``cli/commands/`` and is registered below.
Exit codes (shared/design.md): 0 done, 1 the work could not be done, 2 usage
error (click's own usage errors are 2 already; our UsageError maps to 2 too).
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading

import click

from rankscope.collectors.errors import RankscopeError, UsageError

COMMANDS = {
    # command name -> ("module:attribute", the one-line help `rankscope --help` prints)
    "analyze": ("rankscope.cli.commands.analyze:analyze",
                "Diagnose every job of a store: strategy, steps, stragglers, regressions, hangs."),
    "attach": ("rankscope.cli.commands.attach:attach", "Run COMMAND with rankscope's hook in every rank process."),
    "check": ("rankscope.cli.commands.info:check",
              "Verify every part and manifest entry of a store; list what a repair would do."),
    "collect": ("rankscope.cli.commands.collect:collect", "Run a live collector that writes into a trace store."),
    "dashboard": ("rankscope.cli.commands.dashboard:dashboard",
                  "Serve the rankscope dashboard: strategy, timelines, stragglers, regressions."),
    "diff": ("rankscope.cli.commands.diff:diff", "Compare two runs: step time, phases, GEMM throughput, bandwidth."),
    "expect": ("rankscope.cli.commands.analyze:expect",
               "Expected bytes per endpoint pair per step of a declared job (degrees, sizes, rank order)."),
    "export": ("rankscope.cli.commands.export:export", "Export a job's timelines for other tools."),
    "info": ("rankscope.cli.commands.info:info", "Summarise a trace store: jobs, record kinds, counts, time range."),
    "ingest": ("rankscope.cli.commands.ingest:ingest", "Import trace files (and directories of them) into a trace store."),
    "metrics": ("rankscope.cli.commands.metrics:metrics",
                "Prometheus metrics: step time, slowdown S, straggler scores, bytes, collector counts."),
    "simulate": ("rankscope.cli.commands.simulate:simulate",
                 "Simulate a training job (or several on one fabric) with ground truth."),
    "sql": ("rankscope.cli.commands.sql:sql", "Run DuckDB SQL over views named after the record kinds."),
    "watch": ("rankscope.cli.commands.watch:watch",
              "Diagnose a running job window by window: step, S, verdict, culprit, cost."),
}


class LazyGroup(click.Group):
    """Imports a subcommand's module only when it runs; ``rankscope --help`` lists the commands from
    the table above, so it imports none of them (polars, pyarrow and torch stay unloaded)."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        mod, attr = target[0].split(":")
        return getattr(importlib.import_module(mod), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="rankscope")
def cli():
    """rankscope: why is this distributed training job slow?

    \b
    Example:
      rankscope ingest traces/ --store st
      rankscope info --store st
      rankscope sql --store st "select op, count(*) from comm_op group by op"
    """


def main(argv: list[str] | None = None) -> int:
    try:
        rv = cli.main(args=argv, prog_name="rankscope", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except UsageError as e:
        click.echo(f"rankscope: error: {e}", err=True)
        return 2
    except RankscopeError as e:
        click.echo(f"rankscope: {e}", err=True)
        return 1
    except click.exceptions.Exit as e:
        return e.exit_code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except BrokenPipeError:
        return 0
    return rv if isinstance(rv, int) else 0


def run() -> None:
    """The console script: :func:`main`, then out of the process without tearing the interpreter down.

    Tearing down an interpreter that loaded polars, numpy and pyarrow (every module and object deallocated one
    by one) took 24-37 ms of a 0.6 s ``analyze --ingest`` of the OSDI'25 ST trace and 83-92 ms of the AR trace
    tiled 16x, memory the kernel takes back at once when the process ends. What an exit must still do is done
    first: the exit handlers run (Ray's shutdown, temporary directories, logging) and the standard streams are
    flushed. A command that left a thread working (not a daemon) exits as usual, which waits for it."""
    code = main()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, or a stream the command closed
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
