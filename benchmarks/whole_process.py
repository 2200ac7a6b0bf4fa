"""Whole-process measurement for the benchmarks, and the bench-only venvs the anchors run in.

Every speed row compares whole processes, start-up included, measured in the
same run: the median wall time of ``RUNS`` runs and the peak RSS of the whole
process tree (``os.wait4``'s ``ru_maxrss``: the largest of the process and the
children it waited for, taken by a small launcher so that the benchmark's own
size does not leak in). Anchors are installed from the package registry into
``bench-out/anchor-<name>`` (never into the project's venv); an anchor that
cannot be installed or run is reported as skipped, never given a figure.
"""

from __future__ import annotations

import compileall
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH_OUT = Path(os.environ.get("RANKSCOPE_BENCH_OUT", REPO / "bench-out"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
RANKSCOPE = [sys.executable, "-m", "rankscope.cli.main"]
"""the `rankscope` command, as the venv's console script runs it."""
PACKAGES = ("collectors", "analysis", "datasets", "dashboard", "cli")


@functools.cache
def compile_bytecode() -> None:
    """Write rankscope's bytecode before anything is timed, as an installed package has it.

    Where PYTHONDONTWRITEBYTECODE is set (this project's machines set it), a module edited since its
    .pyc was written is compiled again in every process, and each timed run paid for that."""
    for pkg in PACKAGES:
        compileall.compile_dir(REPO / pkg, quiet=1)


@dataclass
class Measure:
    walls_s: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    cpus_s: list[float] = field(default_factory=list)
    """user + system CPU of the process tree (children waited for included): on a loaded machine the
    figure that wall time inflates and this does not"""
    error: str | None = None

    @property
    def wall_s(self) -> float:
        return statistics.median(self.walls_s)

    @property
    def cpu_s(self) -> float:
        return statistics.median(self.cpus_s) if self.cpus_s else float("nan")

    @property
    def peak_mib(self) -> float:
        return max(self.rss_mib)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.walls_s)


def run_once(cmd: list[str] | str, *, cwd: Path | None = None, env: dict | None = None,
             timeout_s: float = 1800) -> tuple[float, float, int, str, float]:
    """(wall s, peak RSS MiB of the process tree, exit status, stderr tail, CPU s) of one whole process.

    The command is forked by a small launcher (``spawn_measured.py``), not by this process: a child's
    ``ru_maxrss`` starts at its parent's RSS, and a benchmark that analysed in-process first is large."""
    err = tempfile.TemporaryFile()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = Path(f.name)
    shell = isinstance(cmd, str)
    launcher = [sys.executable, "-S", str(Path(__file__).with_name("spawn_measured.py")), str(result),
                "1" if shell else "0", *([cmd] if shell else cmd)]
    t = time.perf_counter()
    p = subprocess.Popen(launcher, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    wall = time.perf_counter() - t
    err.seek(0)
    tail = err.read()[-600:].decode(errors="replace")
    try:
        r = json.loads(result.read_text())
    except (OSError, ValueError):  # killed before it wrote
        return wall, float("nan"), p.returncode or -9, tail, float("nan")
    finally:
        result.unlink(missing_ok=True)
    return r["wall_s"], r["maxrss_kib"] / 1024, r["rc"], tail, r["cpu_s"]


def measure(cmd, *, runs: int = RUNS, before=None, **kw) -> Measure:
    """``runs`` whole-process runs; ``before()`` (e.g. a fresh output folder) runs untimed before each."""
    compile_bytecode()
    m = Measure()
    for _ in range(runs):
        if before is not None:
            before()
        wall, rss, rc, tail, cpu = run_once(cmd, **kw)
        if rc != 0:
            m.error = f"exit {rc}: {tail.strip()}"
            return m
        m.walls_s.append(wall)
        m.rss_mib.append(rss)
        m.cpus_s.append(cpu)
    return m


def _tree_pss_kib(pid: int) -> int:
    """Proportional set size of a process and all its descendants (Linux /proc), in KiB."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
            for t in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def tree_pss_peak_mib(cmd: list[str], *, env: dict | None = None, before=None, every_s: float = 0.02) -> float | None:
    """Peak of the memory summed over the whole process tree (PSS: shared pages split between the
    processes that share them), sampled every ``every_s`` during one run; None where /proc cannot tell.
    ``ru_maxrss`` (the peak column) is the largest single process, so a tree of workers needs this too."""
    if not Path("/proc/self/smaps_rollup").exists():
        return None
    if before is not None:
        before()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while p.poll() is None:
        peak = max(peak, _tree_pss_kib(p.pid))
        time.sleep(every_s)
    return peak / 1024 if p.returncode == 0 else None


def interleaved(jobs: dict[str, tuple], runs: int = RUNS) -> dict[str, Measure]:
    """``measure`` for several commands, round-robin: one untimed warm-up each (bytecode caches, page
    cache), then ``runs`` rounds of one run per command, so a load change on a shared machine hits every
    command alike. ``jobs``: name -> (cmd, keyword arguments of ``measure``)."""
    out = {name: Measure() for name in jobs}
    for rnd in range(runs + 1):
        for name, (cmd, kw) in jobs.items():
            m = out[name]
            if m.error is not None:
                continue
            one = measure(cmd, runs=1, **kw)
            if one.error is not None:
                m.error = one.error
            elif rnd > 0:
                m.walls_s += one.walls_s
                m.rss_mib += one.rss_mib
                m.cpus_s += one.cpus_s
    return out


def anchor_python(name: str, requirements: list[str]) -> Path | None:
    """A bench-only venv with ``requirements`` from the registry; None (with the reason printed) if it fails."""
    venv = BENCH_OUT / f"anchor-{name}"
    py = venv / "bin" / "python"
    stamp = venv / ".requirements"
    want = "\n".join(requirements)
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return py
    print(f"installing anchor {name} into {venv}: {' '.join(requirements)} ...", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if r.returncode == 0:
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
                           capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        print(f"anchor {name} skipped: could not install it ({(r.stderr or r.stdout).strip()[-300:]})")
        return None
    stamp.write_text(want)
    return py


def load_note() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def print_rows(rows: list[tuple], anchor_name: str) -> None:
    """Rows of (figure, rankscope Measure, anchor Measure | None | str (why skipped), target text)."""
    head = (f"{'figure':38} {'rankscope s':>11} {'MiB':>6} {anchor_name + ' s':>14} {'MiB':>6} "
            f"{'speed-up':>8} {'mem ratio':>9}  target")
    print(head)
    print("-" * len(head))
    for label, ours, theirs, target in rows:
        o = f"{ours.wall_s:11.2f} {ours.peak_mib:6.0f}" if ours.ok else f"{'failed':>11} {'':>6}"
        if isinstance(theirs, Measure) and theirs.ok:
            a = f"{theirs.wall_s:14.2f} {theirs.peak_mib:6.0f}"
            r = (f"{theirs.wall_s / ours.wall_s:7.2f}x {ours.peak_mib / theirs.peak_mib:9.2f}" if ours.ok
                 else f"{'-':>8} {'-':>9}")
        else:
            why = theirs if isinstance(theirs, str) else (theirs.error if isinstance(theirs, Measure) else "none")
            a, r = f"{'skipped':>14} {'':>6}", f"{'-':>8} {'-':>9}"
            target = f"{target}  (anchor: {str(why)[:80]})"
        print(f"{label:38} {o} {a} {r}  {target}")
        if not ours.ok:
            print(f"    rankscope failed: {ours.error}")
    print(f"whole processes, {RUNS} runs each: wall the median, peak the largest of the runs (each run's listed "
          f"below); peak RSS: ru_maxrss, the largest single process of the tree (worker processes are not summed); "
          f"speed-up = anchor wall / rankscope wall; mem ratio = rankscope / anchor peak "
          f"(<= 1 is at or under the anchor); {load_note()}")
    for label, ours, theirs, _ in rows:
        ow = ", ".join(f"{w:.2f}" for w in ours.walls_s)
        tw = ", ".join(f"{w:.2f}" for w in theirs.walls_s) if isinstance(theirs, Measure) else "-"
        om = ", ".join(f"{m:.0f}" for m in ours.rss_mib)
        tm = ", ".join(f"{m:.0f}" for m in theirs.rss_mib) if isinstance(theirs, Measure) else "-"
        print(f"    {label}: rankscope [{ow}] s [{om}] MiB  anchor [{tw}] s [{tm}] MiB")
        if ours.ok and isinstance(theirs, Measure) and theirs.ok:
            print(f"      CPU (user+sys, median): rankscope {ours.cpu_s:.2f} s, anchor {theirs.cpu_s:.2f} s, "
                  f"ratio {theirs.cpu_s / ours.cpu_s:.2f}x (the figure to read when the machine is loaded)")
