"""Expert parallelism (MoE, EP carved out of DP) from flows and from comm_op, on simulated jobs, reported
apart from the outside capture (../shared/validation V7, scored by its own scorer in the validation test).

Each job (``SimConfig(ep_in_dp=True)``): dp x ep data-parallel ranks per (stage, TP rank), EP groups of
``ep`` consecutive DP ranks doing a dispatch and a combine all_to_all per layer, microbatch and pass with
sizes drawn per call, dense gradients over the whole DP group, the experts' over expert-DP groups of
``dp`` (>= 3: an expert ring of two members sends both ways, as a pipeline link does, and is not told
from one without lag evidence; such jobs are counted apart as ``ep-pairs``). Black-box: the job is
recognised on its capture (fabric.recognise) and inferred from its flows alone; *right as reported* is
dp, pp, the DP groups, the pipelines (in stage order where the report claims it), ep and the EP groups,
with tp null or right. Claims at confidence >= 0.9 are counted with how many of them are right.
White-box: infer_whitebox on the comm_op records, dp/pp/tp/ep and all groups exact.

    python benchmarks/bench_moe.py            # 12 jobs
    BENCH_FULL=1 python benchmarks/bench_moe.py   # 48 jobs
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_corpus import same_pipelines, same_pipelines_any_direction, same_sets  # noqa: E402

from rankscope.analysis.fabric.recognise import job_flows, recognise_jobs  # noqa: E402
from rankscope.analysis.strategy.flows.infer import infer_flows  # noqa: E402
from rankscope.analysis.strategy.whitebox import infer_whitebox  # noqa: E402
from rankscope.datasets.sim.job_config import SimConfig  # noqa: E402
from rankscope.datasets.simulator import simulate  # noqa: E402


def one_job(i: int, rng: np.random.Generator) -> dict:
    ep, dp = int(rng.choice([3, 4])), int(rng.choice([2, 3, 4]))
    pp, tp = int(rng.choice([1, 2])), int(rng.choice([1, 2]))
    cfg = SimConfig(job=f"moe{i}", dp=dp, ep=ep, pp=pp, tp=tp, gpus_per_host=tp, ep_in_dp=True, steps=4,
                    microbatches=4, layers=4, hidden=int(rng.choice([1024, 2048])), seed=1000 + i)
    res = simulate(cfg)
    t = res.truth
    flow = pl.from_arrow(res.tables["flow"])
    found = recognise_jobs(flow, "fabric")
    eps = frozenset(t["endpoints"].values())
    rec = next((j for j in found.jobs if frozenset(j.endpoints) == eps), None)
    s = infer_flows(job_flows(flow, rec.endpoints), one_job=True).strategy if rec else None
    deg = t["degrees"]
    ok = bool(s and (s.dp, s.pp) == (deg["dp"], deg["pp"]) and same_sets(s.dp_groups, t["dp_groups_by_address"])
              and (same_pipelines(s.pp_groups, t["pp_groups_by_address"]) if s.flows.stage_order_known
                   else same_pipelines_any_direction(s.pp_groups, t["pp_groups_by_address"]))
              and s.ep == deg["ep"] and same_sets(s.ep_groups or [], t["ep_groups_by_address"])
              and s.tp in (None, deg["tp"]))
    wb = infer_whitebox(pl.from_arrow(res.tables["comm_op"]))
    wb_ok = ((wb.dp, wb.pp, wb.tp, wb.ep) == (deg["dp"], deg["pp"], deg["tp"], deg["ep"])
             and same_sets(wb.dp_groups, t["dp_groups"]) and same_sets(wb.ep_groups or [], t["ep_groups"])
             and same_sets(wb.tp_groups or [], t["tp_groups"]))
    return {"kind": "ep-pairs" if dp == 2 else "ep", "cfg": f"dp{deg['dp']}(ep{ep}xedp{dp}) pp{pp} tp{tp}",
            "recognised": rec is not None, "ok": ok, "confidence": float(s.confidence) if s else 0.0,
            "undecided_ep": bool(s and any(u.field == "ep" for u in s.undecided)), "wb_ok": wb_ok,
            "found": f"dp{s.dp} pp{s.pp} ep{s.ep}" if s else "unrecognised"}


def main() -> int:
    n = 48 if os.environ.get("BENCH_FULL") == "1" else 12
    rng = np.random.default_rng(36)
    df = pl.DataFrame([one_job(i, rng) for i in range(n)])
    print(f"{n} simulated MoE jobs (EP carved out of DP), black-box from flows and white-box from comm_op")
    print(f"{'jobs':10} {'n':>3} {'recognised':>10} {'right as reported':>18} {'claims >=0.9':>12} "
          f"{'right':>6} {'white-box exact':>15}")
    for kind in ("ep", "ep-pairs"):
        d = df.filter(pl.col("kind") == kind)
        if not d.height:
            continue
        claims = d.filter(pl.col("confidence") >= 0.9)
        print(f"{kind:10} {d.height:>3} {d['recognised'].mean():>10.3f} {d['ok'].mean():>18.3f} "
              f"{claims.height:>12} {claims['ok'].mean() if claims.height else float('nan'):>6.3f} "
              f"{d['wb_ok'].mean():>15.3f}")
    for r in df.filter(~pl.col("ok") | ~pl.col("wb_ok")).iter_rows(named=True):
        print(f"  miss {r['kind']}: {r['cfg']} -> {r['found']} (confidence {r['confidence']:.2f}, "
              f"white-box {'ok' if r['wb_ok'] else 'wrong'})")
    print("target: right as reported >= 0.98 and every claim at >= 0.9 right on ep jobs; ep-pairs: no claim "
          "at >= 0.9 wrong")
    return 0


if __name__ == "__main__":
    sys.exit(main())
