"""Strategy inference accuracy, step-time error and speed on simulated jobs (issue 7).

Corpus: random jobs from the simulator (datasets/) spanning 8..4,096 GPUs,
all schedules, both rank orders, ring/tree and ZeRO gradient sync, 1-in-1 to
1-in-1000 sampling, 0.1-60 s active/idle timeouts, 1-4 queue pairs, skewed
exporter clocks, and 1-3 jobs sharing one fabric with storage, checkpoint
and rendezvous traffic. Each host holds one tensor-parallel group (Megatron's
placement); traffic inside a host never reaches a switch.

Default: a small corpus (<= 512 GPUs) that runs in a few minutes;
BENCH_FULL=1: >= 200 jobs up to 4,096 GPUs and the 4,096 x 100-step speed run.
BENCH_SEED, BENCH_JOBS, BENCH_MAX_WORLD, BENCH_BIG_STEPS override the corpus.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rankscope.analysis.fabric.recognise import job_flows, recognise_jobs  # noqa: E402
from rankscope.analysis.model.clocks import apply_exporter_offsets, exporter_clock_offsets  # noqa: E402
from rankscope.analysis.report.codec import to_json  # noqa: E402
from rankscope.analysis.strategy.flows.infer import infer_flows  # noqa: E402
from rankscope.analysis.strategy.whitebox import infer_whitebox  # noqa: E402
from rankscope.datasets.simulator import Fault, SimConfig, simulate_fabric  # noqa: E402

FULL = os.environ.get("BENCH_FULL") == "1"


def random_job(rng: np.random.Generator, name: str, max_world: int) -> SimConfig:
    while True:
        tp = int(rng.choice([1, 2, 4, 8]))
        pp = int(rng.choice([1, 2, 4, 8, 16]))
        dp = int(rng.choice([1, 2, 4, 8, 16, 32, 64]))
        world = tp * pp * dp
        if 8 <= world <= max_world and dp * pp >= 2:
            break
    schedule = str(rng.choice(["gpipe", "1f1b", "interleaved"])) if pp > 1 else "1f1b"
    mb = int(rng.choice([4, 8])) if pp > 1 else 2
    if schedule == "interleaved":
        mb = max(mb, pp) // pp * pp
    faults = ()
    if rng.random() < 0.3:
        faults = (Fault("clock-skew", {"max_ms": 3.0, "exporter_max_ms": float(rng.choice([0.5, 2.0]))}),)
    return SimConfig(
        job=name, dp=dp, pp=pp, tp=tp, steps=int(rng.integers(4, 8)), microbatches=mb, schedule=schedule,
        rank_order=str(rng.choice(["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"])), gpus_per_host=tp,
        seed=int(rng.integers(1 << 30)), dp_sync=str(rng.choice(["allreduce", "zero1", "zero3"])),
        algorithm=str(rng.choice(["ring", "tree"])), qps=int(rng.integers(1, 5)),
        sampling=int(rng.choice([1, 10, 100, 1000])), active_timeout_s=float(rng.choice([0.1, 1.0, 10.0, 60.0])),
        idle_timeout_s=float(rng.choice([0.1, 1.0, 15.0, 60.0])), layers=32, faults=faults)


def same_groups(a, b) -> bool:
    return sorted(sorted(map(str, g)) for g in a) == sorted(sorted(map(str, g)) for g in b)


def score_fabric(fab) -> list[dict]:
    flow = pl.from_arrow(fab.flow)
    flow = apply_exporter_offsets(flow, exporter_clock_offsets(flow))
    found = recognise_jobs(flow, "fabric")
    rows = []
    by_first = {}
    for j in found.jobs:
        inf = infer_flows(job_flows(flow, j.endpoints), one_job=True)
        by_first[frozenset(j.endpoints)] = inf
    for res in fab.jobs:
        t = res.truth
        eps = frozenset(t["endpoints"].values())
        inf = by_first.get(eps)
        s = inf.strategy if inf else None
        deg = t["degrees"]
        shape = bool(s and (s.dp, s.pp) == (deg["dp"], deg["pp"])
                     and same_groups(s.dp_groups, t["dp_groups_by_address"])
                     and sorted(s.pp_groups) == sorted(t["pp_groups_by_address"]))
        ok = shape and s.tp == deg["tp"]
        wb = infer_whitebox(pl.from_arrow(res.tables["comm_op"]))
        wb_ok = ((wb.dp, wb.pp, wb.tp) == (deg["dp"], deg["pp"], deg["tp"])
                 and same_groups(wb.dp_groups, t["dp_groups"]) and sorted(wb.pp_groups) == sorted(t["pp_groups"]))
        truth_step = float(np.median(t["step_times_ns"])) if t["step_times_ns"] else float("nan")
        st = inf.steps if inf else None
        err = abs(st.median_ns - truth_step) / truth_step if st and st.count else float("nan")
        rows.append({"world": t["world_size"], "ok": ok, "shape_ok": shape, "tp_null": bool(s and s.tp is None), "conf": float(s.confidence) if s else 0.0, "recognised": inf is not None, "wb_ok": wb_ok,
                     "step_err": err, "ambiguous": bool(st and to_json(st).get("ambiguous")),
                     "cfg": f"dp{deg['dp']} pp{deg['pp']} tp{deg['tp']} {res.config.schedule} "
                            f"{res.config.rank_order} s{res.config.sampling} a{res.config.active_timeout_s} "
                            f"i{res.config.idle_timeout_s} {res.config.algorithm} {res.config.dp_sync}"})
    return rows


def accuracy(n_jobs: int, max_world: int, seed: int = 7) -> tuple[list[dict], float]:
    rng = np.random.default_rng(seed)
    rows, t0, k = [], time.perf_counter(), 0
    while len(rows) < n_jobs:
        n = int(rng.integers(1, 4))
        cfgs = [random_job(rng, f"job{k}-{i}", max_world) for i in range(n)]
        k += 1
        # the fabric stream (background, sampling, exporter clocks) comes from the jobs' seeds
        # (simulator.fabric_seed), not from k, so corpora with different BENCH_SEEDs share nothing
        fab = simulate_fabric(cfgs, background=True)
        rows.extend(score_fabric(fab))
    return rows, time.perf_counter() - t0


def speed(world_dp: int, pp: int, tp: int, steps: int) -> tuple[int, float]:
    cfg = SimConfig(job="big", dp=world_dp, pp=pp, tp=tp, gpus_per_host=tp, steps=steps, microbatches=8,
                    layers=32, active_timeout_s=0.1, idle_timeout_s=0.1, seed=1)
    fab = simulate_fabric([cfg], background=False)
    flow = pl.from_arrow(fab.flow)
    t = time.perf_counter()
    flow = apply_exporter_offsets(flow, exporter_clock_offsets(flow))
    infer_flows(flow)
    return flow.height, time.perf_counter() - t


def main() -> int:
    n_jobs, max_world = (220, 4096) if FULL else (30, 512)
    n_jobs = int(os.environ.get("BENCH_JOBS", n_jobs))
    max_world = int(os.environ.get("BENCH_MAX_WORLD", max_world))
    print(f"corpus: {'FULL' if FULL else 'default (BENCH_FULL=1 for the full one)'}: "
          f">= {n_jobs} jobs, 8..{max_world} GPUs")
    seed = int(os.environ.get("BENCH_SEED", "7"))
    print(f"corpus seed {seed} (BENCH_SEED)")
    rows, secs = accuracy(n_jobs, max_world, seed)
    df = pl.DataFrame(rows)
    acc = df["ok"].mean()
    wb = df["wb_ok"].mean()
    errs = df.filter(pl.col("step_err").is_not_nan())["step_err"]
    unamb = df.filter(pl.col("step_err").is_not_nan() & ~pl.col("ambiguous"))["step_err"]
    print(f"{'figure':<58}{'value':>14}{'target':>12}")
    print(f"{'jobs (worlds ' + str(df['world'].min()) + '..' + str(df['world'].max()) + ')':<58}{df.height:>14}"
          f"{'>= 200':>12}")
    print(f"{'black-box exact degrees+groups+stage order':<58}{acc:>14.1%}{'>= 99%':>12}")
    print(f"{'black-box exact apart from tp':<58}{df['shape_ok'].mean():>14.1%}{'':>12}")
    print(f"{'tp reported null (RoCE queue pairs: ranks or channels)':<58}{df['tp_null'].mean():>14.1%}{'':>12}")
    print(f"{'white-box exact (comm_op, same jobs)':<58}{wb:>14.1%}{'100%':>12}")
    print(f"{'jobs recognised on their fabric':<58}{df['recognised'].mean():>14.1%}{'':>12}")
    print(f"{'step time found (share of jobs)':<58}{len(errs) / df.height:>14.1%}{'':>12}")
    print(f"{'step-time error, median (all found)':<58}{float(errs.median() or 0):>14.3%}{'<= 0.3%':>12}")
    print(f"{'step-time error, median (not flagged ambiguous)':<58}"
          f"{float(unamb.median() or 0) if len(unamb) else float('nan'):>14.3%}{'<= 0.3%':>12}")
    print(f"{'corpus wall time (simulate + analyse), s':<58}{secs:>14.1f}{'':>12}")
    print("calibration (strategy confidence bin -> share exactly right):")
    for lo, hi in ((0.0, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.01)):
        sel = df.filter((pl.col("conf") >= lo) & (pl.col("conf") < hi))
        acc = f"{sel['ok'].mean():.0%}" if sel.height else "-"
        print(f"  [{lo:.1f}, {min(hi, 1.0):.1f}]  jobs {sel.height:>4}  exact {acc:>5}")
    bad = df.filter(~pl.col("ok"))
    for r in bad.head(8).iter_rows(named=True):
        print(f"  miss: {r['cfg']}")
    sizes = [(16, 4, 8, 5), (16, 4, 8, 10), (16, 4, 8, 20)]
    if FULL:
        sizes.append((64, 8, 8, int(os.environ.get("BENCH_BIG_STEPS", "100"))))
    print(f"{'speed: endpoints x steps':<30}{'records':>12}{'seconds':>10}{'us/record':>12}")
    per = []
    for dp, pp, tp, steps in sizes:
        n, s = speed(dp, pp, tp, steps)
        per.append(s / n * 1e6)
        print(f"{f'{dp * pp * tp} x {steps}':<30}{n:>12,}{s:>10.2f}{per[-1]:>12.2f}")
    print(f"growth: time per record at the largest / smallest size = {per[-1] / per[0]:.2f} (1.0 = linear)")
    if FULL:
        print("target: 4,096 endpoints x 100 steps under 30 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
