"""``rankscope attach``: run any command with the live hook injected into its rank processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import click

from rankscope.cli.paths import output_dir
from rankscope.collectors.errors import UsageError
from rankscope.collectors.hooks.hook_config import ENV_SWITCH, HookConfig


def bootstrap_dir() -> Path:
    """The directory holding the ``sitecustomize.py`` that activates the hook."""
    from rankscope.collectors import hooks

    return Path(hooks.__file__).resolve().parent / "hook_bootstrap"


def attach_env(config: HookConfig, base: dict | None = None, force: bool = False) -> dict:
    """The environment for the attached command: bootstrap first on PYTHONPATH plus the config."""
    env = dict(os.environ if base is None else base)
    boot = str(bootstrap_dir())
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot]
    env["PYTHONPATH"] = os.pathsep.join([boot, *rest])
    env.update(config.to_env())
    if force:
        env[ENV_SWITCH] = "1"
    return env


def hook_reports(store_root: Path, job: str, since_s: float) -> list:
    """Loss reports the ranks of this run wrote into the store's manifest."""
    from rankscope.collectors.store import Store

    try:
        return [m for m in Store(store_root).manifest()
                if m.format == "hook" and m.job == job and m.ingested_at >= since_s]
    except Exception:  # noqa: BLE001 - a broken store is reported by the ranks themselves
        return []


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--store", "store_dir", required=True, type=click.Path(file_okay=False),
              help="trace store the ranks write into (created if missing)")
@click.option("--job", default="default", show_default=True, help="job name the records are stored under")
@click.option("--flush-interval-s", type=float, default=None,
              help="write a new Parquet part at least this often  [default: 5, 0.5 with --live]")
@click.option("--buffer-mb", type=float, default=64.0, show_default=True,
              help="per-rank memory cap of the record buffer (oldest rows are dropped and counted)")
@click.option("--hang-timeout-s", type=float, default=300.0, show_default=True,
              help="dump a rank's pending calls when one waits this long")
@click.option("--no-watchdog", is_flag=True, help="do not run the hang watchdog")
@click.option("--all-processes", is_flag=True,
              help="hook every Python process of the command, not only torch.distributed ranks")
@click.option("--live", is_flag=True, help="run `rankscope watch` beside the job: a line per window of steps")
@click.option("--window-steps", type=click.IntRange(1), default=4, show_default=True, help="with --live: steps per window")
@click.option("--hop-steps", type=click.IntRange(1), default=None, help="with --live: steps between window starts")
@click.option("--events", default=None, metavar="FILE|-", help="with --live: one JSON object per window to FILE")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def attach(store_dir, job, flush_interval_s, buffer_mb, hang_timeout_s, no_watchdog, all_processes, live,
           window_steps, hop_steps, events, command):
    """Run COMMAND with rankscope's hook in every rank process; exits with COMMAND's exit code.

    Each rank records its torch.distributed calls (comm_op), steps (step_mark)
    and, with CUDA and cupti-python, kernels (compute_op) into the store, with
    no change to the training code. Put ``--`` before the command.

    \b
    Example:
      rankscope attach --store st --job llama -- torchrun --nproc_per_node=4 train.py --steps 10
      rankscope info --store st
      rankscope attach --live --store st --job llama -- torchrun --nproc_per_node=4 train.py
    """
    if flush_interval_s is None:
        flush_interval_s = 0.5 if live else 5.0
    root = Path(store_dir).resolve()
    config = HookConfig(store=str(root), job=job, flush_interval_s=flush_interval_s,
                        buffer_bytes=int(buffer_mb * (1 << 20)), hang_timeout_s=hang_timeout_s,
                        watchdog=not no_watchdog)
    output_dir(root, "--store")
    started = time.time()
    watcher = start_watch(root, job, window_steps, events, hop_steps, hang_timeout_s) if live else None
    try:
        child = subprocess.Popen(list(command), env=attach_env(config, force=all_processes))
    except OSError as e:
        stop_watch(watcher)
        raise UsageError(f"cannot run {command[0]!r}: {e}") from None

    def forward(signum, _frame):
        try:
            child.send_signal(signum)
        except OSError:
            pass

    # Ctrl-C reaches the command through the terminal's process group already; forwarding it
    # too would make torchrun see two. SIGTERM (from a scheduler) goes to this process only.
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
                signal.SIGTERM: signal.signal(signal.SIGTERM, forward)}
    try:
        code = child.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        stop_watch(watcher)
    _summarise(root, job, started)
    return code if code >= 0 else 128 - code


WATCH_NICE = 10
"""the watcher runs this much nicer than the job: on a busy host the ranks get the CPU first."""
WATCH_STOP_S = 120.0
"""how long the watcher may take to analyse the windows the job completed before it ended."""


def start_watch(root: Path, job: str, window_steps: int, events: str | None,
                hop_steps: int | None = None, hang_timeout_s: float | None = None) -> subprocess.Popen:
    """``rankscope watch`` as a separate, nicer process: the job never waits for the analysis (the ranks
    hand rows to their writer thread's bounded buffer; the watcher reads the parts it writes and drops
    windows, counted, when it falls behind)."""
    cmd = [sys.executable, "-m", "rankscope.cli.main", "watch", "--store", str(root), "--job", job,
           "--window-steps", str(window_steps)]
    if events is not None:
        cmd += ["--events", events]
    if hop_steps is not None:
        cmd += ["--hop-steps", str(hop_steps)]
    if hang_timeout_s is not None:
        cmd += ["--hang-timeout-s", repr(hang_timeout_s)]
    try:
        return subprocess.Popen(cmd, preexec_fn=lambda: os.nice(WATCH_NICE))  # noqa: PLW1509 - nice only
    except OSError as e:
        raise UsageError(f"cannot start rankscope watch: {e}") from None


def stop_watch(watcher: subprocess.Popen | None) -> None:
    """Let the watcher analyse what the job completed, then end it."""
    if watcher is None:
        return
    watcher.send_signal(signal.SIGTERM)
    try:
        watcher.wait(WATCH_STOP_S)
    except subprocess.TimeoutExpired:
        watcher.kill()
        watcher.wait()
        click.echo(f"rankscope attach: watch did not finish within {WATCH_STOP_S:.0f} s; stopped", err=True)


def _summarise(root: Path, job: str, since_s: float) -> None:
    reps = hook_reports(root, job, since_s)
    if not reps:
        click.echo(f"rankscope attach: no rank reported to {root} (job {job})", err=True)
        return
    rows, lost = Counter(), Counter()
    for m in reps:
        rows.update(m.records)
        lost.update(m.rejects)
    text = ", ".join(f"{k} {v:,}" for k, v in sorted(rows.items())) or "nothing"
    click.echo(f"rankscope attach: {len(reps)} rank(s) wrote {text} to {root} (job {job})", err=True)
    if lost:
        click.echo("rankscope attach: lost " + ", ".join(f"{v:,} ({k})" for k, v in lost.items()), err=True)
