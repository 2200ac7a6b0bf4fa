"""Black-box strategy accuracy and calibration on the de-idealised corpus (issue 13).

Corpus (datasets/sim/corpus.py): fabrics of 1-3 jobs, 8..4,096 GPUs, with
RoCE ACK/CTS flows or TCP, millisecond exporter clocks, per-pod-and-rail
exporters with independent offsets, jittered rails, storage/checkpoint/
replication/monitoring traffic on arbitrary ports, several ranks per address,
ring / binary-tree / double-tree all-reduce, pure-PP and pure-DP jobs, and
white-box records without layout columns. Its seed (``--seed``, default
CORPUS_SEED) was never used while the simulator or the inference was built;
development used ``--seed 1``.

Scored per job, by address (ranks that share an address count once):
recognised (the job found on its fabric with exactly its endpoints), exact
(dp, pp, tp, DP groups and pipelines in stage order), right as reported (the
same, but ``tp`` null and, where the report says ``stage_order_known`` false,
the pipelines' common direction are not claims and not scored; nor, where the
pipelines close into cycles and the report says where they wrap is unknown
(``wrap_unknown``), where each wraps), and
calibration: the share right per bin of the reported confidence and per
evidence class, each with its 95 % interval and the issue's 10-point check.

    python benchmarks/bench_corpus.py --jobs 30 --max-world 512   # reduced
    BENCH_FULL=1 python benchmarks/bench_corpus.py                  # >= 200 jobs, 8..4,096 GPUs
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rankscope.analysis.fabric.recognise import job_flows, recognise_jobs  # noqa: E402
from rankscope.analysis.model.clocks import apply_exporter_offsets, exporter_clock_offsets  # noqa: E402
from rankscope.analysis.report.codec import to_json  # noqa: E402
from rankscope.analysis.strategy.flows.infer import infer_flows  # noqa: E402
from rankscope.analysis.strategy.whitebox import infer_whitebox  # noqa: E402
from rankscope.datasets.sim.corpus import corpus_fabrics  # noqa: E402
from rankscope.datasets.simulator import Realism, simulate_fabric  # noqa: E402

CORPUS_SEED = 13_2026_12
FULL = os.environ.get("BENCH_FULL") == "1"
BINS = (0.0, 0.4, 0.6, 0.8, 0.9, 0.95, 1.0001)
"""fine enough that each level of evidence (strategy.flows.confidence.evidence_class) has its own bin:
invalid grid (0.3), k-way ties (0.99 / k and less), split stage-order votes (0.86), a unique grid with
clear votes or no order claimed (0.98-0.99); the table by evidence class shows each class on its own."""
CALIBRATION_TOLERANCE = 0.10
"""issue 13: confidence within 10 points of the share right in every bin."""


def unique_groups(groups) -> list[list[str]]:
    """Address groups with repeats removed (ranks sharing an address appear once; order kept)."""
    out, seen = [], set()
    for g in groups:
        g = list(dict.fromkeys(map(str, g)))
        key = tuple(sorted(g))
        if key not in seen:
            seen.add(key)
            out.append(g)
    return out


def same_sets(a, b) -> bool:
    return sorted(sorted(g) for g in unique_groups(a)) == sorted(sorted(g) for g in unique_groups(b))


def same_pipelines(a, b) -> bool:
    return sorted(unique_groups(a)) == sorted(unique_groups(b))


def same_pipelines_any_direction(a, b) -> bool:
    """Same pipelines, all read first to last or all last to first (a report that does not claim the
    direction still claims that its pipelines run alike through the stages)."""
    return same_pipelines(a, b) or same_pipelines([list(reversed(g)) for g in a], b)


def same_cycles(a, b) -> bool:
    """Same pipelines read as cycles (each with its link from last stage back to first): a report whose
    interleaved pipelines' order is unknown claims neither direction nor where each wraps."""
    def cycles(gs):
        return sorted(sorted(sorted(x) for x in zip(g, [*g[1:], g[0]])) for g in unique_groups(gs))
    return cycles(a) == cycles(b)


def evidence_class(s) -> str:
    """The kind of evidence behind a flow strategy's confidence (the report's own label when it has one)."""
    x = to_json(s)
    if x.get("confidence_evidence"):
        return x["confidence_evidence"]
    if not x.get("grid_valid", False):
        return "invalid grid"
    k = len(x.get("alternatives") or [])
    if k:
        return f"{k + 1}-way tie"
    if (s.pp or 1) == 1:
        return "unique grid, no pipeline"
    return "unique grid, order voted" if x.get("stage_order_agreement", 0.0) > 0 else "unique grid, order unknown"


def _features(cfg) -> dict:
    r = cfg.realism
    return {"tcp": r.transport == "tcp", "reverse": r.transport == "tcp" or r.reverse,
            "ms_clock": r.timestamp_ns >= 1_000_000, "pods": r.hosts_per_pod > 0,
            "exporter_offsets": r.exporter_offset_ms > 0, "rail_jitter": r.rail_jitter_us > 0,
            "shared_address": r.ranks_per_address > 1, "tree": cfg.algorithm == "tree",
            "wild_background": r.wild_background, "pure_pp": cfg.dp == 1 and cfg.tp == 1,
            "pure_dp": cfg.pp == 1, "sampled": cfg.sampling > 1,
            "scattered_hosts": getattr(r, "host_order", "rank") == "scattered",
            "teardown": getattr(r, "close_lag_s", 0.0) > 0}


def score_fabric(fab) -> list[dict]:
    flow = pl.from_arrow(fab.flow)
    flow = apply_exporter_offsets(flow, exporter_clock_offsets(flow))
    found = recognise_jobs(flow, "fabric")
    by_eps = {frozenset(j.endpoints): j for j in found.jobs}
    rows = []
    job_sets = [frozenset(r.truth["endpoints"].values()) for r in fab.jobs]
    # a recognised endpoint set that is no true job (storage servers taken for a job, a job split or merged)
    # is a wrong answer that the per-job rows alone never show; it is counted once, on the fabric's first row
    phantom = [sorted(e) for e in by_eps if e not in job_sets]
    phantom_conf = max((infer_flows(job_flows(flow, p), one_job=True).strategy.confidence for p in phantom),
                       default=float("nan"))
    for i, res in enumerate(fab.jobs):
        t, cfg = res.truth, res.config
        eps = job_sets[i]
        rec = by_eps.get(eps)
        s = infer_flows(job_flows(flow, rec.endpoints), one_job=True).strategy if rec else None
        deg = t["degrees"]
        shape = bool(s and (s.dp, s.pp) == (deg["dp"], deg["pp"])
                     and same_sets(s.dp_groups, t["dp_groups_by_address"])
                     and same_pipelines(s.pp_groups, t["pp_groups_by_address"]))
        groups_ok = bool(s and (s.dp, s.pp) == (deg["dp"], deg["pp"])
                         and same_sets(s.dp_groups, t["dp_groups_by_address"])
                         and same_pipelines_any_direction(s.pp_groups, t["pp_groups_by_address"]))
        x = to_json(s) if s else {}
        # a standing tie names its other labellings (dp, pp and up to four DP groups each): the truth among
        # them is an ambiguous answer, not a wrong one
        true_sets = {tuple(sorted(g)) for g in unique_groups(t["dp_groups_by_address"])}
        truth_listed = bool(x.get("ambiguous")) and any(
            (a["dp"], a["pp"]) == (deg["dp"], deg["pp"])
            and all(tuple(sorted(dict.fromkeys(map(str, g)))) in true_sets for g in a.get("dp_groups") or [])
            for a in x.get("alternatives") or [])
        # a report that says it does not know the stage order claims only the pipelines, not their direction
        order_claimed = bool(x.get("stage_order_known", True))
        if not order_claimed and x.get("wrap_unknown"):
            groups_ok = bool(s and (s.dp, s.pp) == (deg["dp"], deg["pp"])
                             and same_sets(s.dp_groups, t["dp_groups_by_address"])
                             and same_cycles(s.pp_groups, t["pp_groups_by_address"]))
        shape_reported = shape if order_claimed else groups_ok
        wb = infer_whitebox(pl.from_arrow(res.tables["comm_op"]))
        wb_ok = ((wb.dp, wb.pp, wb.tp) == (deg["dp"], deg["pp"], deg["tp"])
                 and same_sets(wb.dp_groups, t["dp_groups"]) and same_pipelines(wb.pp_groups, t["pp_groups"]))
        rows.append({"world": t["world_size"], "recognised": rec is not None, "found_jobs": len(found.jobs),
                     "true_jobs": len(fab.jobs), "phantom_jobs": len(phantom) if i == 0 else 0,
                     "phantom_first": (phantom[0][0] if phantom and i == 0 else ""),
                     "phantom_confidence": phantom_conf if i == 0 else float("nan"),
                     "shape_ok": shape, "ok": shape and s.tp == deg["tp"],
                     "ok_reported": shape_reported and s.tp in (None, deg["tp"]),
                     "groups_ok": groups_ok, "order_claimed": order_claimed, "truth_in_tie": truth_listed,
                     "evidence": evidence_class(s) if s else "unrecognised",
                     "order_share": float(x.get("stage_order_agreement", float("nan"))),
                     "stage_order_confidence": float(x.get("stage_order_confidence") or float("nan")),
                     "model_fit": float(x.get("model_fit", float("nan"))),
                     "alt_fits": ",".join(f"{a['fit']:.4f}" for a in x.get("alternatives") or []),
                     "alt_shapes": ",".join(f"dp{a['dp']}pp{a['pp']}" for a in x.get("alternatives") or []),
                     "true_dp": deg["dp"], "true_pp": deg["pp"], "true_tp": deg["tp"],
                     "found": f"dp{s.dp}pp{s.pp}" if s else "",
                     "tp_null": bool(s and s.tp is None), "tp_one_wrong": bool(s and s.tp == 1 and deg["tp"] > 1),
                     "confidence": float(s.confidence) if s else float("nan"),
                     "wb_ok": wb_ok, "kineto": cfg.realism.kineto_records, **_features(cfg),
                     "wb_miss": "" if wb_ok else f"{cfg.job}: dp{deg['dp']} pp{deg['pp']} tp{deg['tp']} {cfg.schedule} "
                                f"-> dp{wb.dp} pp{wb.pp} tp{wb.tp} conf {wb.confidence:.2f}",
                     "cfg": f"dp{deg['dp']} pp{deg['pp']} tp{deg['tp']} rpa{cfg.realism.ranks_per_address} "
                            f"{cfg.realism.transport} s{cfg.sampling} {cfg.algorithm} {cfg.schedule} "
                            f"-> {'unrecognised' if not s else f'dp{s.dp} pp{s.pp} tp{s.tp}'}"})
    return rows


def keep_only(r: Realism, fields: tuple[str, ...] | None) -> Realism:
    """``r`` with only ``fields`` kept (None: all of them; (): the idealised control)."""
    if fields is None:
        return r
    return Realism(**{f: getattr(r, f) for f in fields})


def run(n_jobs: int, max_world: int, seed: int, only: tuple[str, ...] | None = None, save: str | None = None
        ) -> tuple[pl.DataFrame, float, int]:
    rows, t0, errors = [], time.perf_counter(), 0
    for fab_spec in corpus_fabrics(seed, n_jobs, max_world):
        if save and rows:  # per-job rows so far, so that a long run cut short still reports
            pl.DataFrame(rows, infer_schema_length=None).write_parquet(save)
        try:
            cfgs = [dataclasses.replace(c, realism=keep_only(c.realism, only)) for c in fab_spec.configs]
            fab = simulate_fabric(cfgs, background=True, realism=keep_only(fab_spec.realism, only))
            rows.extend(score_fabric(fab))
        except Exception:  # a crash is a miss for every job of the fabric, and is shown
            errors += 1
            traceback.print_exc(limit=3)
            for c in fab_spec.configs:
                rows.append({"world": c.world_size, "recognised": False, "ok": False, "shape_ok": False,
                             "confidence": float("nan"), "cfg": f"crashed: {c.job}", **_features(c)})
    return pl.DataFrame(rows, infer_schema_length=None), time.perf_counter() - t0, errors


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % interval of a share of k in n (Wilson): how far a small bin's share may sit from its truth."""
    if not n:
        return float("nan"), float("nan")
    p = k / n
    mid, half = (p + z * z / (2 * n)), z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5)
    return max(0.0, (mid - half) / (1 + z * z / n)), min(1.0, (mid + half) / (1 + z * z / n))


def _calibration_rows(rows, title: str) -> None:
    print(f"  {title:<30}{'jobs':>6}{'conf':>8}{'right':>9}{'gap':>9}  {'95% interval':<15}10-pt check")
    for label, k, conf, acc in rows:
        if not k:
            print(f"  {label:<30}{k:>6}")
            continue
        lo, hi = wilson(acc * k, k)
        check = "pass" if abs(acc - conf) <= CALIBRATION_TOLERANCE + 1e-9 else "MISS"
        print(f"  {label:<30}{k:>6}{conf:>8.2f}{acc:>9.1%}{(acc - conf) * 100:>+7.0f}pt  "
              f"[{lo:.2f}, {hi:.2f}]    {check}")


def calibration_by_evidence(df: pl.DataFrame, col: str = "ok_reported") -> list[tuple[str, int, float, float]]:
    """(evidence class, jobs, mean confidence, share right by ``col``) over jobs with a strategy."""
    d = df.filter(pl.col("confidence").is_not_nan() & pl.col("evidence").is_not_null())
    g = d.group_by("evidence").agg(n=pl.len(), conf=pl.col("confidence").mean(),
                                   acc=pl.col(col).fill_null(False).mean()).sort("conf", descending=True)
    return [(r["evidence"], r["n"], r["conf"], r["acc"]) for r in g.iter_rows(named=True)]


def calibration(df: pl.DataFrame, col: str = "ok") -> list[tuple[str, int, float, float]]:
    """(bin, jobs, mean confidence, share right by ``col``) per confidence bin, over jobs with a strategy."""
    d = df.filter(pl.col("confidence").is_not_nan())
    out = []
    for lo, hi in zip(BINS[:-1], BINS[1:]):
        b = d.filter((pl.col("confidence") >= lo) & (pl.col("confidence") < hi))
        label = f"[{lo:.2f}, {min(hi, 1.0):.2f}{']' if hi > 1 else ')'}"
        out.append((label, b.height, float(b["confidence"].mean()) if b.height else float("nan"),
                    float(b[col].mean()) if b.height else float("nan")))
    return out


def misses_by_kind(df: pl.DataFrame) -> list[tuple[str, int]]:
    """(kind, jobs) of the jobs not exact apart from tp: unrecognised; a standing tie that lists the truth
    as its alternative; pipelines and groups right with the stage order not claimed (listed the wrong way
    round); a reported field wrong; anything else."""
    need = {"recognised", "shape_ok", "ok_reported", "order_claimed", "groups_ok", "truth_in_tie"}
    if not need <= set(df.columns):
        return []
    m = df.filter(~pl.col("shape_ok"))
    rec = pl.col("recognised").fill_null(False)
    tie = rec & pl.col("truth_in_tie").fill_null(False)
    unclaimed = rec & ~tie & ~pl.col("order_claimed").fill_null(True) & pl.col("groups_ok").fill_null(False)
    wrong = rec & ~tie & ~unclaimed & ~pl.col("ok_reported").fill_null(False)
    kinds = [("unrecognised (no job found with exactly its endpoints)", ~rec),
             ("standing tie, the truth listed as its alternative", tie),
             ("stage order not claimed, groups and pipelines right", unclaimed),
             ("a reported field wrong", wrong)]
    out = [(label, int(m.filter(e).height)) for label, e in kinds]
    rest = m.height - sum(k for _, k in out)
    return out + ([("other", rest)] if rest else [])


def _share(d: pl.DataFrame) -> str:
    return f"{d['ok'].mean():6.1%} of {d.height:<4}" if d.height else "   -          "


def report(df: pl.DataFrame, secs: float, errors: int) -> None:
    n = df.height
    print(f"{'figure':<60}{'value':>12}{'target':>10}")
    print(f"{'jobs (worlds ' + str(df['world'].min()) + '..' + str(df['world'].max()) + ')':<60}{n:>12}"
          f"{'>= 200':>10}")
    print(f"{'black-box exact: dp, pp, tp, groups, stage order':<60}{df['ok'].mean():>12.1%}{'>= 98%':>10}")
    print(f"{'black-box exact apart from tp':<60}{df['shape_ok'].mean():>12.1%}{'':>10}")
    if "ok_reported" in df.columns:
        print(f"{'black-box right as reported (tp null allowed, never wrong)':<60}"
              f"{df['ok_reported'].fill_null(False).mean():>12.1%}{'':>10}")
        wrong = df.filter(pl.col("recognised").fill_null(False) & ~pl.col("ok_reported").fill_null(False))
        print(f"{'black-box wrong answers (recognised, a reported field wrong)':<60}"
              f"{wrong.height / max(df.height, 1):>12.1%}{'':>10}")
        if "truth_in_tie" in df.columns:
            tie = wrong.filter(pl.col("truth_in_tie").fill_null(False))
            print(f"{'  of which a standing tie listing the truth as its alternative':<60}"
                  f"{tie.height / max(df.height, 1):>12.1%}{'':>10}")
    print(f"{'jobs recognised on their fabric (exact endpoint set)':<60}{df['recognised'].mean():>12.1%}{'':>10}")
    if "phantom_jobs" in df.columns:
        print(f"{'phantom jobs (a recognised endpoint set that is no true job)':<60}"
              f"{int(df['phantom_jobs'].fill_null(0).sum()):>12}{'0':>10}")
        if "phantom_confidence" in df.columns:
            high = int((df["phantom_confidence"].fill_nan(0.0).fill_null(0.0) >= 0.9).sum())
            print(f"{'  of which fabrics with one claimed at confidence >= 0.9 (wrong)':<60}{high:>12}{'0':>10}")
    if "tp_null" in df.columns:
        shared = df.filter(pl.col("shared_address"))
        print(f"{'tp reported null (share of jobs)':<60}{df['tp_null'].fill_null(False).mean():>12.1%}{'':>10}")
        print(f"{'tp reported 1 where tp > 1 (wrong, not unknown)':<60}"
              f"{df['tp_one_wrong'].fill_null(False).mean():>12.1%}{'':>10}")
        if shared.height:
            print(f"{'exact where ranks share an address (' + str(shared.height) + ' jobs)':<60}"
                  f"{shared['ok'].mean():>12.1%}{'':>10}")
        kin = df.filter(pl.col("kineto").fill_null(False))
        lay = df.filter(~pl.col("kineto").fill_null(True))
        for label, d in (("without layout columns", kin), ("with layout columns", lay)):
            if d.height:
                print(f"{'white-box exact, comm_op ' + label + ' (' + str(d.height) + ')':<60}"
                      f"{d['wb_ok'].mean():>12.1%}{'':>10}")
    print(f"{'fabrics that crashed the analysis':<60}{errors:>12}{'0':>10}")
    print(f"{'corpus wall time (simulate + analyse), s':<60}{secs:>12.1f}{'':>10}")
    print("calibration against 'exact' (jobs with a strategy; tp null and an unclaimed stage order count "
          "as wrong here):")
    _calibration_rows(calibration(df), "confidence bin")
    if "ok_reported" in df.columns:
        print("calibration against 'right as reported' (the confidence is of the fields reported: tp null "
              "and, where extra.stage_order_known is false, the pipelines' direction are not claimed):")
        _calibration_rows(calibration(df.with_columns(pl.col("ok_reported").fill_null(False)), "ok_reported"),
                          "confidence bin")
    if "evidence" in df.columns:
        print("the same by evidence class (strategy_flows.evidence_class):")
        _calibration_rows(calibration_by_evidence(df), "evidence")
    kinds = misses_by_kind(df)
    if kinds:
        print("misses apart from tp, by kind (a tie's labelling listed first, or an unclaimed order's direction, "
              "is right or wrong by chance where the records read the same either way):")
        for kind, k in kinds:
            print(f"  {kind:<66}{k:>6}")
        rec = pl.col("recognised").fill_null(False)
        chance = df.filter(rec & (pl.col("truth_in_tie").fill_null(False) | (
            ~pl.col("order_claimed").fill_null(True) & pl.col("groups_ok").fill_null(False))))
        print(f"  jobs whose exactness the records leave to chance (the two kinds above, exact or not): "
              f"{chance.height}, exact among them {int(chance['shape_ok'].sum())}")
    print("exact share by realism feature (jobs with it / without it):")
    for feat in ("tcp", "reverse", "ms_clock", "pods", "exporter_offsets", "rail_jitter", "shared_address",
                 "tree", "wild_background", "pure_pp", "pure_dp", "sampled", "scattered_hosts"):
        if feat not in df.columns:
            continue
        on, off = df.filter(pl.col(feat)), df.filter(~pl.col(feat))
        print(f"  {feat:<20}{_share(on)}  /  {_share(off)}")
    for r in df.filter(~pl.col("ok")).head(10).iter_rows(named=True):
        print(f"  miss: {r['cfg']}")
    if "wb_miss" in df.columns:
        for r in df.filter(pl.col("wb_miss").fill_null("") != "").iter_rows(named=True):
            print(f"  white-box miss ({'no ' if r['kineto'] else ''}layout columns): {r['wb_miss']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=220 if FULL else 24, help="jobs in the corpus (>= 200 for the "
                    "figure of record; default 24, or 220 with BENCH_FULL=1)")
    ap.add_argument("--max-world", type=int, default=4096 if FULL else 256, help="largest job (GPUs)")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("BENCH_CORPUS_SEED", CORPUS_SEED)),
                    help="corpus seed (default: the unseen one)")
    ap.add_argument("--ideal", action="store_true", help="control: the same jobs with every realism option off")
    ap.add_argument("--save", help="write the per-job rows to this Parquet file after every fabric")
    ap.add_argument("--report", help="only print the report of rows saved earlier with --save")
    ap.add_argument("--only", help="ablation: keep only these Realism fields (comma-separated), e.g. transport,mtu")
    a = ap.parse_args(argv)
    only = () if a.ideal else tuple(x.strip() for x in a.only.split(",") if x.strip()) if a.only else None
    bad = set(only or ()) - {f.name for f in dataclasses.fields(Realism)}
    if bad:
        ap.error(f"--only: unknown Realism field(s) {sorted(bad)}")
    if a.jobs < 1 or a.max_world < 8:
        ap.error("--jobs must be >= 1 and --max-world >= 8")
    if a.report:
        df = pl.read_parquet(a.report)
        print(f"report of saved rows {a.report} ({df.height} jobs; the run may have been cut short)")
        report(df, float("nan"), 0)
        return 0
    kind = "IDEALISED control" if only == () else f"ablation ({', '.join(only)} only)" if only else "de-idealised"
    print(f"{kind} corpus: {a.jobs} jobs, 8..{a.max_world} GPUs, "
          f"seed {a.seed}{' (unseen)' if a.seed == CORPUS_SEED else ' (not the unseen seed)'}")
    df, secs, errors = run(a.jobs, a.max_world, a.seed, only, a.save)
    if a.save:
        df.write_parquet(a.save)
    report(df, secs, errors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
