"""Black-box accuracy on the outside validation corpus (../shared/validation), reported apart from our own
simulator's figures (bench_strategy.py).

Each IPFIX capture is ingested into a temporary store, every recognised job analysed as `rankscope
analyze` does, and the reports scored with the corpus's own scorer (score.py). Prints one row per capture
(checks passed, step time against truth, verdict and culprit, confidence) and a calibration table: the
share of jobs exactly right (every scored check of the job) per bin of reported strategy confidence.
Step time counts as found when it is within 1 % of the truth; a step time flagged ambiguous or not
evaluated counts as unknown, a step time off by more than 1 % and not flagged counts as wrong.

    python benchmarks/bench_validation.py
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rankscope.analysis.diagnose import DiagnoseConfig  # noqa: E402
from rankscope.analysis.runner.plan import analyse_planned, plan_jobs  # noqa: E402
from rankscope.collectors.importers import contract as formats  # noqa: E402
from rankscope.collectors.ingest.files import ingest  # noqa: E402
from rankscope.collectors.store import Store  # noqa: E402

VALIDATION = (ROOT / ".." / "shared" / "validation").resolve()
BINS = ((0.0, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.01))


def _verdict(st: dict) -> str:
    """The straggler verdict and its culprit; "not evaluated" where the flows found nothing (no S to judge)."""
    if st.get("evaluated") is False:
        return "not evaluated"
    return f"{st['verdict']} {st['top_workers'][0]['endpoint'] if st['top_workers'] else ''}".strip()


def scorer():
    spec = importlib.util.spec_from_file_location("validation_score", VALIDATION / "score.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reports_of(capture: Path) -> tuple[list[dict], float]:
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store")
        ingest(store, [capture], opts=formats.ImportOptions(job="cap"))
        cfg = DiagnoseConfig()
        reps = []
        for planned in plan_jobs(store, None, None, cfg.flow):
            d, _ = analyse_planned(store, planned, cfg)
            reps.append(json.loads(d.to_json()))
    return reps, time.perf_counter() - t


def main() -> int:
    if not (VALIDATION / "flows").is_dir():
        print(f"no validation corpus at {VALIDATION}")
        return 0
    sc = scorer()
    print(f"{'case':<26}{'checks':>8}{'jobs':>6}{'conf':>7}{'step err':>10}{'verdict / culprit':>36}{'s':>7}")
    jobs_rows = []
    total_k = total_n = exact_cases = 0
    step_found = step_unknown = step_wrong = 0
    for case_dir in sorted((VALIDATION / "flows").iterdir()):
        truth = json.loads((case_dir / "truth.json").read_text())
        # a case exported as NetFlow v9 is read from its raw packets (netflow9_file); the test reads its pcap
        capture = next(p for p in (case_dir / n for n in ("flows.ipfix", "flows.nf9", "flows.pcap")) if p.exists())
        reps, secs = reports_of(capture)
        lines: list[str] = []
        k, n = sc.run_checks(truth, reps, "ip", out=lines.append)
        total_k, total_n, exact_cases = total_k + k, total_n + n, exact_cases + (k == n)
        match = sc.pair_jobs(truth["jobs"], reps, "ip")
        errs = []
        for i, job in enumerate(truth["jobs"]):
            rep = reps[match[i]] if match[i] is not None else None
            tag = f"job{i} "
            ok = rep is not None and not any(x.startswith("FAIL " + tag) for x in lines)
            conf = float(rep["strategy"].get("confidence") or 0.0) if rep else 0.0
            jobs_rows.append((conf, ok))
            st = rep["steps"] if rep else {}
            want = job["step_time_s_median"] * 1e9
            if not st or not st.get("median_ns") or st.get("ambiguous") or st.get("evaluated") is False:
                step_unknown += 1
                errs.append("unknown")
            else:
                e = abs(st["median_ns"] - want) / want
                step_found += e <= 0.01
                step_wrong += e > 0.01
                errs.append(f"{e:.2%}")
        v = "; ".join(_verdict(r["stragglers"]) for r in reps)
        confs = ",".join(f"{float(r['strategy'].get('confidence') or 0):.2f}" for r in reps)
        print(f"{case_dir.name:<26}{f'{k}/{n}':>8}{len(reps):>6}{confs:>7}{','.join(errs):>10}{v[:34]:>36}{secs:>7.1f}")
        for x in lines:
            if x.startswith("FAIL"):
                print("    " + x[:160])
    print(f"captures exact (every scored check): {exact_cases}/{len(jobs_rows) and len(list((VALIDATION / 'flows').iterdir()))}"
          f"; checks {total_k}/{total_n}")
    print(f"step time within 1 %: {step_found}, unknown/flagged: {step_unknown}, wrong and unflagged: {step_wrong}"
          f" (of {len(jobs_rows)} jobs)")
    print("calibration (strategy confidence bin -> share of jobs exactly right):")
    for lo, hi in BINS:
        sel = [ok for c, ok in jobs_rows if lo <= c < hi]
        acc = f"{sum(sel) / len(sel):.0%}" if sel else "-"
        print(f"  [{lo:.1f}, {min(hi, 1.0):.1f}]  jobs {len(sel):>3}  exact {acc:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
