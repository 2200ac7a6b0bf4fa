"""Simulator speed and memory: a 4,096-GPU job (TP8 PP8 DP64, 20 steps) with flows.

Targets (issue 3): under 60 s and under 4 GiB peak RSS on the 2-core dev
machine. Anchor: a 64-GPU job of the same shape measured in the same run, so
the per-op cost ratio shows whether the big job scales linearly. BENCH_FULL=1
also writes the store to disk and times that.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time

from rankscope.datasets.simulator import SimConfig, simulate, write_store


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _run(cfg: SimConfig):
    t, c = time.perf_counter(), _cpu()
    res = simulate(cfg)
    wall, cpu = time.perf_counter() - t, _cpu() - c
    ops = res.tables["comm_op"].num_rows + res.tables["compute_op"].num_rows
    return res, wall, cpu, ops


def main() -> int:
    small_res, small_wall, _, small_ops = _run(SimConfig(dp=1, pp=8, tp=8, steps=20, microbatches=8))
    del small_res
    cfg = SimConfig(dp=64, pp=8, tp=8, steps=20, microbatches=8)
    res, wall, cpu, ops = _run(cfg)
    rss = _rss_gib()
    rows = [
        ("4096-GPU simulate wall (s)", f"{wall:.1f}", "< 60", f"{wall / 60:.2f}"),
        ("its CPU time, user+sys (s)", f"{cpu:.1f}", "", ""),
        ("peak RSS (GiB)", f"{rss:.2f}", "< 4", f"{rss / 4:.2f}"),
        ("records (comm+compute)", f"{ops:,}", "", ""),
        ("flow records", f"{res.tables['flow'].num_rows:,}", "", ""),
        ("us per record, 4096 GPUs", f"{wall / ops * 1e6:.2f}", "", ""),
        ("us per record, 64-GPU anchor", f"{small_wall / small_ops * 1e6:.2f}", "",
         f"{(wall / ops) / (small_wall / small_ops):.2f}x"),
    ]
    if os.environ.get("BENCH_FULL") == "1":
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            write_store(res, d)
            rows.append(("write_store (s)", f"{time.perf_counter() - t:.1f}", "", ""))
    w = [max(len(r[i]) for r in rows + [("figure", "value", "target", "ratio")]) for i in range(4)]
    for r in [("figure", "value", "target", "ratio")] + rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    print(f"load average at end: {os.getloadavg()[0]:.1f} (2 cores; figures above include contention)")
    return 0 if wall < 60 and rss < 4 else 1


if __name__ == "__main__":
    sys.exit(main())
