"""``rankscope watch``: diagnose a live job window by window as its records land in the store."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

import click
import polars as pl

from rankscope.analysis.diagnose import DiagnoseConfig
from rankscope.analysis.live import (
    DEFAULT_HANG_TIMEOUT_S,
    LIVE_KINDS,
    LiveCapture,
    LiveConfig,
    LiveFlowConfig,
    LiveJob,
)
from rankscope.analysis.network import read_topology
from rankscope.analysis.report import WindowEvent, where
from rankscope.collectors.errors import StoreError, UsageError
from rankscope.collectors.store import Store
from rankscope.collectors.tail import StoreTail

ONCE_MAX_PENDING = 1 << 30


def window_line(e: WindowEvent) -> str:
    """The terminal line of one window: step, S, verdict, culprit, cost."""
    s = "-" if e.slowdown is None else f"{e.slowdown:.2f}"
    if e.kind == "hang":
        head = f"step {e.window_end_step:>6}  HANG      {where(e.culprit) if e.culprit is not None else '?'}"
        return f"{head}  {e.why}"
    verdict = (e.verdict or "not evaluated") + ("" if e.straggler or e.culprit is None else "?")
    culprit = where(e.culprit) if e.culprit is not None else "-"
    line = f"step {e.window_end_step:>6}  S {s:>5}  {verdict:<18} {culprit:<28} cost {e.analysis_s * 1e3:6.0f} ms"
    if (e.verdict is None or not e.straggler) and e.why:
        line += f"  ({e.why})"
    if e.dropped_windows:
        line += f"  [{e.dropped_windows} window(s) dropped]"
    return line


class EventSink:
    """Where each window goes: the terminal, the ``--events`` stream, and the store's live file."""

    def __init__(self, store: Store, events: str | None):
        self.store = store
        self.stream = None
        if events == "-":
            self.stream = sys.stdout
        elif events is not None:
            try:
                self.stream = open(events, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            except OSError as e:
                raise UsageError(f"--events {events}: cannot open for writing ({e.strerror or e})") from e
        # with --events -, stdout carries the JSON lines and the terminal lines go to stderr
        self.lines_to_err = events == "-"

    def emit(self, e: WindowEvent) -> None:
        obj = e.to_dict()
        click.echo(window_line(e), err=self.lines_to_err)
        if self.stream is not None:
            self.stream.write(json.dumps(obj, allow_nan=False) + "\n")
            self.stream.flush()
        try:
            self.store.write_live(e.job, obj)
        except StoreError as err:
            click.echo(f"rankscope watch: {err}", err=True)

    def close(self) -> None:
        if self.stream is not None and self.stream is not sys.stdout:
            self.stream.close()


def warm_up() -> None:
    """Run the analysis once on a tiny simulated job, with and without compute records.

    A process's first analysis costs seconds (lazy imports, first calls of polars and of the replay):
    7.7 s on the loaded 2-core machine, which held up a live hang report that long. Paid here, while
    the job itself still starts, not when its first window or its first hang comes."""
    from rankscope.datasets.simulator import SimConfig, simulate

    res = simulate(SimConfig(job="warmup", dp=2, pp=2, steps=2, flows=False, hidden=256, layers=2, seq_len=256))
    frames = {k: pl.from_arrow(res.tables[k]) for k in LIVE_KINDS if k in res.tables}
    for kinds in (LIVE_KINDS, ("comm_op", "step_mark")):
        live = LiveJob("warmup", LiveConfig(window_steps=2, warmup_steps=0))
        live.add({k: v for k, v in frames.items() if k in kinds})
        live.windows()


def follow(store: Store, job: str, config: LiveConfig | LiveFlowConfig, sink: EventSink, poll_s: float,
           stop: threading.Event) -> LiveJob | LiveCapture:
    """Poll the store for new parts and analyse each completed window, until ``stop`` is set (then one
    last poll, so the windows the job completed before it ended are not lost). A flow capture
    (:class:`LiveFlowConfig`) is followed by time windows, per job it holds."""
    tail = StoreTail(store, job, ("flow",) if isinstance(config, LiveFlowConfig) else LIVE_KINDS)
    live = LiveCapture(job, config) if isinstance(config, LiveFlowConfig) else LiveJob(job, config)
    while True:
        last = stop.is_set()
        live.add(tail.poll())
        for e in live.windows():
            sink.emit(e)
        if last:
            break
        stop.wait(poll_s)
    for path, why in tail.unreadable.items():
        click.echo(f"rankscope watch: skipped part {path}: {why}", err=True)
    return live


@click.command()
@click.option("--store", "store_dir", required=True, type=click.Path(file_okay=False),
              help="trace store the job's ranks write into")
@click.option("--job", default="default", show_default=True, help="the job to follow")
@click.option("--window-steps", type=click.IntRange(1), default=4, show_default=True,
              help="steps per window; a window is analysed once every rank has marked its last step")
@click.option("--hop-steps", type=click.IntRange(1), default=None,
              help="steps between window starts (default: --window-steps); 2 with 4-step windows names a "
                   "slowdown within 3 steps wherever it starts")
@click.option("--warmup-steps", type=click.IntRange(0), default=4, show_default=True,
              help="the job's first steps (start-up) are not judged; in a flow capture, each job's first "
                   "steps the capture shows")
@click.option("--events", default=None, metavar="FILE|-",
              help="append one JSON object per window to FILE (- for stdout)")
@click.option("--poll-s", type=click.FloatRange(0.01), default=0.5, show_default=True,
              help="how often to look for new records")
@click.option("--max-pending", type=click.IntRange(1), default=16, show_default=True,
              help="completed windows waiting at most; older ones are dropped (and counted) when analysis lags")
@click.option("--window-s", type=click.FloatRange(0.1), default=10.0, show_default=True,
              help="a flow capture (--job names one): seconds of flows per window")
@click.option("--flows", is_flag=True,
              help="--job is a flow capture (found by itself when the store already holds its flows)")
@click.option("--hang-timeout-s", type=click.FloatRange(0.01), default=DEFAULT_HANG_TIMEOUT_S, show_default=True,
              help="the hook's hang timeout (attach --hang-timeout-s): a rank with no pending call of its own is "
                   "named missing from a hang only once it has been silent this long, plus the watchdog's period "
                   "and 2 s")
@click.option("--topology", "topology_path", default=None, type=click.Path(dir_okay=False),
              help="CSV endpoint,host,leaf,pod[,spine]: where each NIC (or rank) hangs (as analyze --topology)")
@click.option("--once", is_flag=True, help="analyse the windows the store holds now, then exit")
def watch(store_dir, job, window_steps, hop_steps, warmup_steps, events, poll_s, max_pending, window_s, flows,
          hang_timeout_s, topology_path, once):
    """Diagnose a running job window by window: step, S, verdict, culprit and cost per window.

    Each completed window of steps goes through the same analysis as ``analyze``, over that window's
    records only (the cost per window does not grow with the job). A collective stuck past the hook's
    timeout is reported at once with the ranks that never joined. ``rankscope metrics`` on the same store
    serves the latest window. Stops on Ctrl-C or SIGTERM after a last look at the store.

    \b
    Example:
      rankscope watch --store st --job llama --window-steps 4 --events windows.jsonl
      rankscope watch --store st --job fabric --window-s 10     (a flow capture: per job it holds)
    """
    root = Path(store_dir)
    if not root.is_dir():
        raise UsageError(f"--store {store_dir}: no such store directory; expected one that `rankscope attach` "
                         "writes into")
    if hop_steps is not None and hop_steps > window_steps:
        raise UsageError(f"--hop-steps {hop_steps}: expected at most --window-steps ({window_steps})")
    diagnose = DiagnoseConfig()
    if topology_path:
        topology = read_topology(topology_path)
        for note in topology.notes:
            click.echo(f"warning: {note}", err=True)
        diagnose = DiagnoseConfig(topology=topology)
    # --once follows no live job, so it cannot fall behind one: every window is analysed
    config = LiveConfig(window_steps=window_steps, hop_steps=hop_steps, warmup_steps=warmup_steps,
                        max_pending=ONCE_MAX_PENDING if once else max_pending, hang_timeout_s=hang_timeout_s,
                        diagnose=diagnose)
    if flows or is_capture(Store(root), job):
        config = LiveFlowConfig(window_s=window_s, warmup_steps=warmup_steps, diagnose=diagnose)
    stop = threading.Event()
    if once:
        stop.set()
    else:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    if not once and isinstance(config, LiveConfig):
        warm_up()
    sink = EventSink(Store(root), events)
    t0 = time.monotonic()
    try:
        live = follow(Store(root), job, config, sink, poll_s, stop)
    finally:
        sink.close()
    if isinstance(live, LiveCapture):
        click.echo(f"rankscope watch: capture {job}: jobs {sorted(live.jobs) or 'none'} ({live.recognitions} "
                   f"recognition(s)), {time.monotonic() - t0:.1f} s", err=True)
        return
    unplaced = f", {live.unplaced:,} row(s) without a step left out" if live.unplaced else ""
    click.echo(f"rankscope watch: job {job}: steps up to {live.next_step - 1} analysed, "
               f"{live.dropped} window(s) dropped{unplaced}, {time.monotonic() - t0:.1f} s", err=True)


def is_capture(store: Store, job: str) -> bool:
    """A flow capture: flow records under the name, and none of a training job's own."""
    return bool(store.parts("flow", job)) and not any(store.parts(k, job) for k in ("comm_op", "step_mark"))
