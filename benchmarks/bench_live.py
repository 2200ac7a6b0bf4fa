"""Live diagnosis on a real job: how soon ``attach --live`` names a rank that slows mid-run, over 10 runs.

The job: tests/jobs/train_dp_pp.py under torchrun, 4 ranks, gloo, DP2 x PP2, 60 steps, with rank 3's
compute stretched 2x from step 20 (``TRAIN_SLOW_RANK_FROM=3:2:20``); and the same job without the
slowdown. For each run: the first window that raises a straggler (``straggler``) naming rank 3 with verdict
``worker``, its last step minus 20 (target: <= 3 in every run), and for the clean job the windows that
raise any straggler (target: none in any run). 4-step windows, the default.

Each run takes the shared integration lock (``/tmp/rankscope-integration.lock``) for itself only, so
other torchrun tests can run between them. ``--runs N`` (default 10).

Flows (``--flow-runs N``, default 3 with BENCH_FULL=1, else 0; root and softflowd): the job of
tests/integration/test_live_flows_throttle.py (DP2 x PP2 in network namespaces, one NIC throttled to
30 Mbit/s after step 4, ``collect flows`` + ``watch --window-s 8`` beside it): the job's own steps from the
throttle to the first window naming its ring as a straggler with verdict ``communication`` (target <= 5
each), and the windows that name a culprit without the throttled address (target: none). ~70 s a run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
JOB = REPO / "tests" / "jobs" / "train_dp_pp.py"
LOCK = "/tmp/rankscope-integration.lock"
STEPS, SLOW_RANK, SLOW_FROM, WINDOW = 60, 3, 20, 4


def one_run(base: Path, slow: bool) -> tuple[list[dict], float]:
    events = base / "events.jsonl"
    cmd = [str(BIN / "rankscope"), "attach", "--live", "--store", str(base / "store"), "--job", "live",
           "--window-steps", str(WINDOW), "--events", str(events), "--",
           str(BIN / "torchrun"), "--nproc_per_node=4", "--standalone", str(JOB), "--steps", str(STEPS),
           "--pp", "2", "--microbatches", "4", "--work-ms", "20", "--hidden", "32", "--out", str(base / "out")]
    if shutil.which("flock") and os.path.exists(os.path.dirname(LOCK)):
        cmd = ["flock", LOCK, *cmd]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAIN_SLOW_RANK_FROM": f"{SLOW_RANK}:2:{SLOW_FROM}" if slow else ""}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    if r.returncode:
        raise SystemExit(f"run failed ({r.returncode}): {r.stderr[-2000:]}")
    return [json.loads(x) for x in events.read_text().splitlines()], time.perf_counter() - t0


def detection(events: list[dict]) -> int | None:
    for e in events:
        if e["straggler"] and e["verdict"] == "worker" and (e["culprit"] or {}).get("rank") == SLOW_RANK:
            return e["window_end_step"] - SLOW_FROM
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--flow-runs", type=int, default=3 if os.environ.get("BENCH_FULL") == "1" else 0,
                   help="runs of the netns job with a NIC throttled mid-run (flows row)")
    args = p.parse_args(argv)
    delays, false_alarms, max_clean_s = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-live-") as d:
        for i in range(args.runs):
            ev, wall = one_run(Path(d) / f"slow{i}", True)
            delays.append(detection(ev))
            dropped = ev[-1]["dropped_windows"] if ev else None
            ev, wall_c = one_run(Path(d) / f"clean{i}", False)
            raised = [(e["window_end_step"], e["verdict"], round(e["slowdown"], 3)) for e in ev if e["straggler"]]
            false_alarms.append(raised)
            max_clean_s.append(max((e["slowdown"] or 0) for e in ev))
            print(f"run {i}: slowed job named rank {SLOW_RANK} {delays[-1]} steps after step {SLOW_FROM} "
                  f"({wall:.0f} s with the lock wait, {dropped} windows dropped); clean job raised {raised or 'nothing'}, max window S {max_clean_s[-1]:.3f} "
                  f"({wall_c:.0f} s)", flush=True)
    ok_flows = flow_rows(args.flow_runs)
    ok_delay = all(x is not None and 0 <= x <= 3 for x in delays)
    ok_clean = not any(false_alarms)
    print(f"steps from the slowdown to the window naming rank {SLOW_RANK}: {delays} (target <= 3 each): "
          f"{'ok' if ok_delay else 'MISSED'}")
    print(f"clean runs raising a straggler: {sum(bool(x) for x in false_alarms)} of {args.runs} (target 0): "
          f"{'ok' if ok_clean else 'MISSED'}; largest clean window S per run {[round(x, 3) for x in max_clean_s]}")
    return 0 if ok_delay and ok_clean and ok_flows else 1


def flow_rows(runs: int) -> bool:
    """The flows row: steps from a NIC's throttle to the window naming it, per run (see the module doc)."""
    if runs <= 0:
        print("flows, NIC throttled mid-run: skipped (BENCH_FULL=1 or --flow-runs N runs it)")
        return True
    sys.path.insert(0, str(REPO))
    from tests.integration import test_live_flows_throttle as t
    from tests.integration.netns_job import netns_skip_reason, run_placed_netns_job

    reason = netns_skip_reason()
    if reason:
        print(f"flows, NIC throttled mid-run: skipped ({reason})")
        return True
    steps, wrong = [], []
    with tempfile.TemporaryDirectory(prefix="bench-live-flows-") as d:
        for i in range(runs):
            w0 = time.perf_counter()
            res = run_placed_netns_job(Path(d) / f"run{i}", nodes=4, pp=2, steps=t.STEPS, hidden=256,
                                       microbatch_size=32, step_sleep_ms=2500,
                                       flow_timeouts=("tcp=1", "general=1", "maxlife=60", "expint=1"),
                                       throttle={t.SLOW: ("30mbit", t.AFTER)},
                                       watch_args=("--window-s", str(t.WINDOW_S)))
            slow, at = list(res.address_ranks)[t.SLOW], res.throttled_ns.get(t.SLOW)
            hit = next((e for e in res.watch_events if at and e["straggler"] and e["verdict"] == "communication"
                        and slow in t.named(e["culprit"])), None)
            steps.append(t.steps_between(res, at, hit["at_ns"]) if hit else None)
            wrong.append(sum(1 for e in res.watch_events if t.named(e["culprit"]) and slow not in t.named(e["culprit"])))
            period = t.step_period_ns(res, after=True) / 1e9 if at else float("nan")
            print(f"flows run {i}: named {steps[-1]} steps after the throttle "
                  f"({(hit['at_ns'] - at) / 1e9 if hit else float('nan'):.1f} s, step {period:.2f} s); "
                  f"{wrong[-1]} window(s) naming a healthy NIC; {time.perf_counter() - w0:.0f} s", flush=True)
    ok = all(x is not None and x <= t.WITHIN_STEPS for x in steps) and not any(wrong)
    print(f"flows, NIC throttled mid-run: steps from the throttle to the window naming its ring: {steps} (target "
          f"<= {t.WITHIN_STEPS} each); windows naming a healthy NIC: {sum(wrong)} (target 0): "
          f"{'ok' if ok else 'MISSED'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
