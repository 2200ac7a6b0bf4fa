"""Findings kept apart from cost: each slow GPU, link, stage or kernel with its factor and steps.

The verdict says what costs the most; a finding says what is wrong, even when
it costs too little for a verdict (one GPU 1.5x slow among 4,096 costs S 1.04).
Each finding is ``{kind, culprit, factor, steps, evidence}``:

- ``slow_worker``: a GPU whose compute is >= 1.2x its stage peers' (or, from
  hook records alone, whose own work between collectives is);
- ``slow_stage``: a stage whose forward/backward is >= 1.2x the other stages';
- ``slow_link``: a rank whose transfers run >= 1.5x their op type's typical;
- ``sequence_imbalance``: microbatches of unequal work (what balancing saves);
- ``kernel_regression`` / ``misaligned_gemm``: passed in by the kernel analyses.

The verdict's culprit is first; the rest follow by factor.
"""

from __future__ import annotations

from collections.abc import Iterable

from rankscope.analysis.report.causes import FINDING_OF
from rankscope.analysis.report.diagnosis import Diagnosis, Stragglers

KERNEL_KINDS = ("kernel_regression", "misaligned_gemm")


def _worker(row: dict, basis: str) -> dict:
    culprit = {"rank": row["rank"], "stage": row.get("stage"), "dp_rank": row.get("dp_rank")}
    ev = {"basis": basis, "compute_vs_stage_peers": row.get("factor")}
    if row.get("by_optype"):
        ev["by_optype"] = row["by_optype"]
    if row.get("with_stalls"):
        ev["compute_vs_stage_peers"] = None
        ev["own_time_with_stalls_vs_stage_peers"] = row.get("factor")
        ev["stall_ns_per_step"] = row.get("stall_ns_per_step")
    return {"kind": "slow_worker", "culprit": culprit, "factor": row.get("factor"), "steps": row.get("steps", []),
            "evidence": ev}


def straggler_findings(st: Stragglers) -> list[dict]:
    """Findings read off one straggler section's evidence (no verdict ordering yet)."""
    x = st.extra
    if not x.get("evaluated"):
        return []
    ev = x.get("evidence", {})
    basis = x.get("basis", "compute")
    steps = x.get("steps", [])
    out = [_worker(r, basis) for r in ev.get("slow_ranks", [])]
    sev = ev.get("stage_imbalance", {})
    stage_vs = sev.get("stage_vs_others", {}) or {}
    every = set(sev.get("slower_in_every_step", []))
    for stage, f in stage_vs.items():
        # >= 1.2x, or any consistent excess: slower than the other stages in every step
        if f is not None and (f >= 1.2 or int(stage) in every):
            out.append({"kind": "slow_stage", "culprit": {"stage": int(stage)}, "factor": float(f), "steps": steps,
                        "evidence": {"basis": basis, "forward_backward_vs_other_stages": float(f),
                                     "min_over_steps": (sev.get("stage_vs_others_min_over_steps") or {}).get(stage)}})
    for link in ev.get("slow_links", []):
        if "endpoint" in link:  # flows: an address, judged on the rate of each of its pairs
            out.append({"kind": "slow_link", "culprit": {"endpoint": link["endpoint"]}, "factor": link["factor"],
                        "steps": link.get("steps", []), "evidence": {
                            "basis": basis, "pairs": link["pairs"], "min_over_pairs": link["min_over_pairs"],
                            "compared_with": "the median rate of pairs in the same role (ring or pipeline links)"}})
            continue
        out.append({"kind": "slow_link", "culprit": {"rank": link["rank"]}, "factor": link["factor"],
                    "steps": link["steps"], "evidence": {
                        "basis": basis, "slow_transfers": link["slow_transfers"], "transfers": link["transfers"],
                        "compared_with": "all transfers of the same op type at the same rate; a link between "
                                         "hosts is slower than one inside a host by design: check the topology"}})
    seq = ev.get("sequence_imbalance", {})
    if seq.get("detected") and seq.get("t_balanced"):
        out.append({"kind": "sequence_imbalance", "culprit": {"microbatches": "unequal sequence lengths"},
                    "factor": float(x["T_ns"] / seq["t_balanced"]), "steps": steps,
                    "evidence": {"basis": basis, "method": seq.get("method"), "pearson": seq.get("pearson"),
                                 "share": seq.get("share")}})
    for f in out:
        # how consistent: the share of the analysed steps in which the culprit was slow (evidence, not a guess)
        if steps and f["steps"] is not steps:
            f["evidence"]["share_of_steps"] = len(f["steps"]) / len(steps)
    amb = x.get("ambiguous")
    if amb:
        for f in out:
            if f["kind"] in ("slow_worker", "slow_stage"):
                f["evidence"]["ambiguous"] = amb["why"]
    return out


def _verdict_finding(st: Stragglers, found: list[dict]) -> dict | None:
    """The finding that names the verdict's culprit, made from the section's evidence if no threshold listed it."""
    kind = FINDING_OF.get(st.verdict)
    if kind is None:
        return None
    cul = (st.extra.get("culprits") or {})
    if st.verdict == "worker":
        c = cul.get("worker")
        if c and "rank" not in c:
            # flows: the cause is known, the worker only as one of several (a TP group's pipelines)
            return {"kind": kind, "culprit": {"one_of": c.get("ranks"), "stage": c.get("stage")},
                    "factor": c.get("factor"), "steps": st.extra.get("steps", []),
                    "factor_vs": c.get("factor_vs", "stage peers"),
                    "evidence": {"basis": st.extra.get("basis"), "ambiguous": c.get("ambiguous")}}
        match = [f for f in found if f["kind"] == kind and c and f["culprit"].get("rank") == c["rank"]]
        if match or not c:
            return match[0] if match else None
        top = st.top_workers[0] if st.top_workers else {}
        return {"kind": kind, "culprit": {"rank": c["rank"], "stage": c.get("stage"), "dp_rank": c.get("dp_rank")},
                "factor": c.get("factor"), "steps": st.extra.get("steps", []), "factor_vs": c.get("factor_vs", "stage peers"),
                "evidence": {"basis": st.extra.get("basis"), "S_w": top.get("slowdown"),
                             "stall_ns_per_step": top.get("stall_ns_per_step"),
                             "compute_vs_stage_peers": c.get("factor")}}
    if st.verdict == "stage_imbalance":
        stage = st.extra.get("verdict_stage")
        match = [f for f in found if f["kind"] == kind and f["culprit"].get("stage") == stage]
        if match:
            return match[0]
        vs = (st.extra.get("evidence", {}).get("stage_imbalance", {}).get("stage_vs_others") or {}).get(str(stage))
        return {"kind": kind, "culprit": {"stage": stage}, "factor": vs, "steps": st.extra.get("steps", []),
                "evidence": {"basis": st.extra.get("basis"), "stage_fix_share": st.extra.get("verdict_shares", {})
                             .get("stage_imbalance")}}
    match = [f for f in found if f["kind"] == kind]
    if match:
        return match[0]
    if st.verdict == "communication":
        c = cul.get("communication") or {}
        who = {"rank": c["rank"]} if "rank" in c else {"group_id": c.get("group_id"), "ranks": c.get("ranks")}
        return {"kind": kind, "culprit": who, "factor": c.get("transfer_ratio"),
                "steps": st.extra.get("steps", []), "evidence": {"basis": st.extra.get("basis")}}
    return None


def kernel_findings(regressions: Iterable[dict]) -> list[dict]:
    """One finding per (kind, culprit): a throttled rank is slow on every GEMM shape, and each shape is a
    regression of its own, but it is one anomaly; the shapes stay in the evidence."""
    grouped: dict[tuple, dict] = {}
    for r in regressions:
        if not (isinstance(r, dict) and r.get("kind") in KERNEL_KINDS and "culprit" in r):
            continue
        key = (r["kind"], repr(r["culprit"]))
        g = grouped.get(key)
        if g is None:
            g = grouped[key] = {**r, "evidence": {**(r.get("evidence") or {}), "kernels": []}}
        g["evidence"]["kernels"].append({"kernel": r.get("kernel"), "shape": r.get("shape"),
                                         "factor": r.get("factor")})
        g["factor"] = max(g.get("factor") or 0.0, r.get("factor") or 0.0)
        g["steps"] = sorted(set(g.get("steps") or []) | set(r.get("steps") or []))
    return list(grouped.values())


def build_findings(stragglers: Stragglers, regressions: Iterable[dict] = (), extra: Iterable[dict] = ()) -> list[dict]:
    """All findings of one job: the verdict's culprit first, then the rest by factor (largest first).

    ``regressions`` may hold the kernel analyses' findings (dicts with kind kernel_regression or
    misaligned_gemm and a culprit); other entries are not findings and are skipped. ``extra`` adds
    findings of other analyses (flows) as they are.
    """
    found = straggler_findings(stragglers)
    found += kernel_findings(regressions)
    found += [dict(f) for f in extra]
    first = _verdict_finding(stragglers, found)
    rest = [f for f in found if f is not first]
    # by kind (compute before transfers: a transfer ratio also flags links that are slower by design),
    # then by factor
    order = {"slow_worker": 0, "slow_stage": 1, "sequence_imbalance": 2, "kernel_regression": 3,
             "misaligned_gemm": 4, "slow_link": 5}
    # the report contract wants a number: a finding that measured none is no finding
    rest = [f for f in rest if isinstance(f.get("factor"), (int, float))]
    rest.sort(key=lambda f: (order.get(f["kind"], 6), -(f.get("factor") or 0.0)))
    if first is not None:
        first = {**first, "evidence": {**first.get("evidence", {}), "verdict": stragglers.verdict}}
        if not isinstance(first.get("factor"), (int, float)):
            # this basis gives no per-culprit ratio (arrival skew of a collective, a stage the replay
            # blamed): the culprit still carries the cost it was blamed for, the job's S
            first["factor"] = float(stragglers.slowdown)
            first["evidence"]["factor_is"] = "the job's slowdown S: this basis measured no ratio for the culprit"
        return [first, *rest]
    return rest


def _where(c) -> str:
    # kernel findings name a rank (int), several ranks (list) or a kernel class (str)
    if isinstance(c, bool) or not isinstance(c, (dict, list, int, str)):
        return str(c)
    if isinstance(c, int):
        return f"rank {c}"
    if isinstance(c, list):
        return f"ranks {', '.join(map(str, c))}"
    if isinstance(c, str):
        return c
    if "rank" in c and c["rank"] is not None:
        place = [f"{k.replace('dp_rank', 'dp')} {c[k]}" for k in ("stage", "dp_rank") if c.get(k) is not None]
        return f"rank {c['rank']}" + (f" ({', '.join(place)})" if place else "")
    if c.get("one_of") is not None:
        return f"one of {', '.join(map(str, c['one_of']))}" + (
            f" (stage {c['stage']})" if c.get("stage") is not None else "")
    if "stage" in c:
        return f"stage {c['stage']}"
    if c.get("ranks") is not None:
        return f"group {c.get('group_id')} (ranks {', '.join(map(str, c['ranks']))})"
    return ", ".join(f"{k} {v}" for k, v in c.items())


def describe(f: dict) -> str:
    """One finding in words: culprit, what is slow and by how much."""
    fac = f.get("factor")
    x = f"{fac:.2f}x" if isinstance(fac, (int, float)) and fac == fac else "?x"
    kind, who = f["kind"], _where(f.get("culprit", {}))
    stall = f.get("evidence", {}).get("stall_ns_per_step")
    if kind == "slow_worker" and f.get("evidence", {}).get("own_time_with_stalls_vs_stage_peers") is not None:
        return f"{who} takes {x} its stage peers' compute time, with stalls (gc, data) of {stall / 1e6:.0f} ms per step"
    if kind == "slow_worker" and f.get("factor_vs", "stage peers") != "stage peers":
        vs = f["factor_vs"]
        return f"{who} computes {x} " + (vs if vs.startswith(("the ", "its ")) else f"the {vs}")
    if kind == "slow_worker":
        return f"{who} computes {x} its stage peers" + (
            "'" if f.get("evidence", {}).get("basis") != "arrival_skew" else "' (own work between collectives)")
    if kind == "slow_stage":
        return f"{who} computes {x} the other stages'"
    if kind == "slow_link":
        return f"transfers of {who} run {x} their typical"
    if kind == "sequence_imbalance":
        return f"sequence-length imbalance: balanced microbatches would run {x} faster"
    if kind in KERNEL_KINDS:
        kernels = f.get("evidence", {}).get("kernels") or [f]
        what = kernels[0].get("kernel") if len(kernels) == 1 else f"{len(kernels)} GEMM shapes"
        why = "slower: misaligned for tensor cores" if kind == "misaligned_gemm" else "slower than elsewhere in the run"
        return f"{what} {x} {why}" if what == who else f"{who}: {what} {x} {why}"
    return f"{kind}: {who} {x}"


def summary_text(diagnosis: Diagnosis) -> str:
    """The CLI summary line of the straggler side: verdict, its culprit, S (and the top finding below the threshold)."""
    st = diagnosis.stragglers
    unread = st.extra.get("not_evaluated") or {}
    if not st.extra.get("evaluated", True):
        head = f"stragglers not evaluated: {st.extra.get('why', 'unknown')}"
        return head + ("; not checked: " + "; ".join(f"{c} ({why})" for c, why in unread.items()) if unread else "")
    findings = diagnosis.extra.get("findings")
    if findings is None:
        findings = build_findings(st, diagnosis.regressions)
    s = f"S {st.slowdown:.2f}" + (" (noise: S < 1)" if st.extra.get("noise") else "")
    if st.extra.get("slowdown_evaluated") is False:
        s = "S not evaluated"
    basis = st.extra.get("basis")
    s += f", from {basis}" if basis and basis != "compute" else ""
    amb = st.extra.get("ambiguous")
    if amb and "stage" in amb:
        return f"verdict {st.verdict} (ambiguous: worker or stage {amb['stage']}, {amb['why']}); {s}"
    if amb:
        return f"verdict {st.verdict} (ambiguous between {', '.join(map(str, amb['between']))}: {amb['why']}); {s}"
    lead = findings[0] if findings else None
    if st.verdict in FINDING_OF and lead is not None and lead.get("evidence", {}).get("verdict") == st.verdict:
        return f"verdict {st.verdict}: {describe(lead)}; {s}"
    head = f"verdict {st.verdict}; {s}"
    if unread and st.verdict == "none":
        head += "; not evaluated: " + "; ".join(f"{cause} ({why})" for cause, why in unread.items())
    under = (st.extra.get("below_threshold") or [None])[0] if st.verdict == "none" else None
    if under:
        who = under.get("culprit") or "one of " + ", ".join(map(str, under.get("members") or []))
        late = f", {under['late_ns'] / 1e6:.0f} ms late a step" if under.get("late_ns") else ""
        bound = " (a lower bound)" if under.get("cost") else ""
        head += f"; under the bar: {under['kind']} {who}{late}{bound}"
    return f"{head}; finding {lead['kind']}: {describe(lead)}" if lead else head
