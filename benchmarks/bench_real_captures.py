"""Black-box strategy, steps and verdict on the real captures we keep (tests/data/netns_gloo/SOURCE.md):
gloo jobs in network namespaces metered by softflowd, nfdump's nfpcapd, pmacct's sFlow probe.

Outside evidence of another kind than the validation corpus: a real kernel, TCP stack and exporter, and the
jobs' own record of what they did. Each capture is ingested into a temporary store as `rankscope ingest`
would (the nfdump JSON as nfdump printed it; the Parquet flows as the collector stored them) and analysed
as `rankscope analyze --control-port <the job's rendezvous port>` does. Scored per capture:

- strategy: right (dp, pp, DP groups and pipelines exact; the stage order where the report claims it),
  a standing tie that lists the truth first / among its labellings, unknown (no job found), wrong at a
  confidence under 0.5, or WRONG (a wrong grid at 0.5 or more: the script exits 1);
- step time: unknown, flagged uncertain, or claimed (these jobs' compute steps are 30-500 ms between
  seconds of start-up or 2.5 s sleeps, so a claimed period is printed for reading, not scored);
- verdict: for the captures with a fault, whether the slow NIC's address or its ring is named; for the
  clean ones, that nothing is.

    python benchmarks/bench_real_captures.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import polars as pl  # noqa: E402

from rankscope.analysis.diagnose import DiagnoseConfig, analyze_job  # noqa: E402
from rankscope.analysis.fabric.config import FlowConfig  # noqa: E402
from rankscope.analysis.report.codec import to_json  # noqa: E402
from rankscope.analysis.runner.plan import load_planned, plan_jobs  # noqa: E402
from rankscope.collectors.importers import contract as formats  # noqa: E402
from rankscope.collectors.ingest.files import ingest  # noqa: E402
from rankscope.collectors.schema import conform  # noqa: E402
from rankscope.collectors.store import Store  # noqa: E402

DATA = ROOT / "tests" / "data" / "netns_gloo"


def diagnose(name: str, truth: dict):
    """The capture's diagnosis, as `rankscope analyze --control-port` gives it (None: no job found)."""
    flow = FlowConfig.with_rendezvous(truth["master_port"])
    cfg = DiagnoseConfig(flow=flow)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "st")
        nfdump = DATA / f"{name}.nfdump.json"
        if nfdump.exists():
            ingest(store, [nfdump], opts=formats.ImportOptions(job="fabric", extra={"tz_offset_s": "0"}))
        else:
            flows = pl.read_parquet(DATA / f"{name}.flows.parquet")
            source = "sflow" if "sflow" in name else "ipfix"
            store.write("flow", conform(flows.with_columns(job=pl.lit("fabric"), source=pl.lit(source)), "flow"),
                        job="fabric")
        plans = [p for p in plan_jobs(store, None, None, flow) if p.kind == "capture"]
        if not plans:
            return None
        frames = load_planned(store, plans[0])
        d, _ = analyze_job(frames, cfg)
    return d


def score_strategy(s, truth: dict) -> str:
    dp_true = sorted(sorted(g) for g in truth["dp_groups"])
    pipes_true = sorted(map(list, truth["pipelines_first_stage_first"]))
    x = to_json(s)
    links = sorted(sorted(p) for g in s.pp_groups for p in zip(g, g[1:]))
    links_true = sorted(sorted(p) for g in pipes_true for p in zip(g, g[1:]))
    exact = sorted(sorted(g) for g in s.dp_groups) == dp_true and links == links_true
    order_ok = sorted(map(list, s.pp_groups)) == pipes_true or not x.get("stage_order_known", True)
    if exact and order_ok:
        return "tie, truth first" if x.get("ambiguous") else "right"
    if x.get("ambiguous") and any(sorted(sorted(g) for g in a.get("dp_groups") or []) == dp_true
                                  for a in x.get("alternatives") or []):
        return "tie, truth listed"
    # a wrong grid is a wrong claim only at a confidence that claims it
    return "WRONG" if s.confidence >= 0.5 else "wrong at < 0.5"


def score_verdict(st, truth: dict) -> str:
    slow = (truth.get("slow_nic") or "").split(":")[0] or None
    if "slow_rank" in truth:
        slow = truth["slow_rank"].split("(")[1].split(")")[0]
    named = [w.endpoint for w in st.top_workers or []]
    ring = (to_json(st).get("culprits") or {}).get("communication", {}).get("ranks") or []
    # no step time, or nothing found in the flows: no S and no verdict (stragglers.from_flows), an unknown
    unread = to_json(st).get("evaluated") is False
    if slow is None:
        if unread:
            return "unknown (not evaluated)"
        return "right (none)" if st.verdict == "none" else f"WRONG ({st.verdict} {named or ring})"
    if unread:
        return "missed (not evaluated)"
    if slow in named or slow in ring:
        return f"named ({st.verdict})"
    if named or (ring and slow not in ring):
        return f"WRONG ({st.verdict} {named or ring})"
    return f"missed ({st.verdict})"


def main() -> int:
    truths = json.loads((DATA / "truth.json").read_text())
    print(f"{'capture':<28}{'exporter':<10}{'strategy':<34}{'score':<18}{'step':<26}verdict")
    tally: dict[str, int] = {}
    t0 = time.perf_counter()
    for name, truth in truths.items():
        d = diagnose(name, truth)
        exporter = truth.get("exporter", "softflowd").split()[0]
        if d is None:  # nothing claimed
            print(f"{name:<28}{exporter:<10}{'no job found':<34}{'unknown':<18}")
            tally["unknown"] = tally.get("unknown", 0) + 1
            continue
        s, steps = d.strategy, d.steps
        score = score_strategy(s, truth)
        tally[score] = tally.get(score, 0) + 1
        x = to_json(steps)
        step = ("unknown" if not x.get("evaluated", True) else
                f"{(steps.median_ns or 0) / 1e6:,.0f} ms {'flagged' if x.get('ambiguous') else 'claimed'}")
        strat = f"dp{s.dp} pp{s.pp} tp{s.tp} {s.confidence:.2f} {to_json(s).get('confidence_evidence', '')}"
        print(f"{name:<28}{exporter:<10}{strat[:33]:<34}{score:<18}{step:<26}{score_verdict(d.stragglers, truth)}")
    print(f"\n{len(truths)} captures in {time.perf_counter() - t0:.1f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    return 1 if tally.get("WRONG") else 0


if __name__ == "__main__":
    sys.exit(main())
