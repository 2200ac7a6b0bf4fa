"""The straggler section's findings: each slow GPU, stage, link or batch it measured, and the verdict's
culprit first (made from the section's culprits when no finding threshold listed it).

- ``slow_worker``: a GPU whose compute is >= 1.2x its stage peers' (or, from hook records alone, whose own
  work between collectives is; from flows, an address that sends late);
- ``slow_stage``: a stage whose forward/backward is >= 1.2x the other stages', or slower in every step;
- ``slow_link``: a rank whose transfers run >= 1.5x their op type's typical (from flows: an address whose
  links run slow against their peers', or a DP ring as a whole against its peer rings when no member
  stands out);
- ``sequence_imbalance``: microbatches of unequal work (what balancing saves).
Findings under the verdict's bar that the flows measured are listed too (evidence ``below_threshold``):
a slow NIC that costs 2 % of the step gets no verdict, but it is named.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from rankscope.analysis.report.causes import FINDING_OF
from rankscope.analysis.report.findings import (
    Batches,
    Endpoint,
    Finding,
    Group,
    OneOf,
    Rank,
    Stage,
    Worker,
    kernel_findings,
    measured,
    order_findings,
)
from rankscope.analysis.report.kernels import Regression
from rankscope.analysis.report.stragglers import Stragglers

FLOW_KINDS = {"slow_nic": "slow_link", "slow_link": "slow_link", "slow_group": "slow_link",
              "slow_worker": "slow_worker", "late_pipelines": "slow_worker", "late_tp_group": "slow_worker",
              "late_stage_or_ring": "slow_worker", "slow_group_or_late_stage": "slow_link"}
"""what the flows found -> the finding kind that names it."""


def _worker(row: dict, basis: str) -> Finding:
    ev = {"basis": basis, "compute_vs_stage_peers": row.get("factor")}
    if row.get("by_optype"):
        ev["by_optype"] = row["by_optype"]
    if row.get("with_stalls"):
        ev["compute_vs_stage_peers"] = None
        ev["own_time_with_stalls_vs_stage_peers"] = row.get("factor")
        ev["stall_ns_per_step"] = row.get("stall_ns_per_step")
    return Finding(kind="slow_worker", culprit=Worker(row["rank"], row.get("stage"), row.get("dp_rank")),
                   factor=row.get("factor"), steps=row.get("steps", []), evidence=ev)


def _stages(sev: dict, basis: str, steps: list) -> list[Finding]:
    every = set(sev.get("slower_in_every_step", []))
    out = []
    for stage, f in (sev.get("stage_vs_others", {}) or {}).items():
        # >= 1.2x, or any consistent excess: slower than the other stages in every step
        if f is not None and (f >= 1.2 or int(stage) in every):
            out.append(Finding(kind="slow_stage", culprit=Stage(int(stage)), factor=float(f), steps=steps,
                               evidence={"basis": basis, "forward_backward_vs_other_stages": float(f),
                                         "min_over_steps": (sev.get("stage_vs_others_min_over_steps") or {})
                                         .get(stage)}))
    return out


def _link(link: dict, basis: str) -> Finding:
    if "endpoint" in link:  # flows: an address, judged on the rate of each of its pairs
        return Finding(kind="slow_link", culprit=Endpoint(link["endpoint"]), factor=link["factor"],
                       steps=link.get("steps", []), evidence={
                           "basis": basis, "pairs": link["pairs"], "min_over_pairs": link["min_over_pairs"],
                           "compared_with": "the median rate of pairs in the same role (ring or pipeline links)"})
    return Finding(kind="slow_link", culprit=Rank(link["rank"]), factor=link["factor"], steps=link["steps"],
                   evidence={"basis": basis, "slow_transfers": link["slow_transfers"], "transfers": link["transfers"],
                             "compared_with": "all transfers of the same op type at the same rate; a link between "
                                              "hosts is slower than one inside a host by design: check the topology"})


def _ring(g: dict, basis: str) -> Finding:
    """flows: a DP ring whose payload rate sits SLOW_FACTOR below its peer rings', no member singled out."""
    return Finding(kind="slow_link", culprit=Group(g["group_id"], g["members"]), factor=g["factor"], steps=[],
                   evidence={"basis": basis, "ambiguous": g.get("ambiguous"),
                             "compared_with": "the median payload rate of the peer DP rings (same bytes per step)"})


def _below_the_bar(x: dict) -> Finding:
    """A flows finding whose cost is under the verdict's bar: no verdict names it, the findings do."""
    kind = FLOW_KINDS.get(x["kind"], "slow_worker")
    who = x.get("culprit")
    if who is not None:
        culprit = Endpoint(who)
    elif kind == "slow_link":
        culprit = Group(None, x.get("members"))
    else:
        culprit = OneOf(x.get("members"), x.get("stage"))
    evidence = {"basis": "flows", "below_threshold": True, "found": x["kind"], "slowdown": x["slowdown"],
                **{k: x[k] for k in ("late_ns", "extra_ns", "cost", "ambiguous") if k in x}}
    factor = x.get("factor")
    if not measured(factor):
        factor = x["slowdown"]
        evidence["factor_is"] = "the step's slowdown this costs (under the verdict's bar)"
    return Finding(kind=kind, culprit=culprit, factor=factor, steps=[], evidence=evidence)


def measured_findings(st: Stragglers) -> list[Finding]:
    """Findings read off one straggler section's evidence (no verdict ordering yet)."""
    if not st.evaluated:
        return []
    ev = st.evidence or {}
    basis = st.basis or "compute"
    steps = st.steps or []
    out = [_worker(r, basis) for r in ev.get("slow_ranks", [])]
    out += _stages(ev.get("stage_imbalance", {}), basis, steps)
    out += [_link(link, basis) for link in ev.get("slow_links", [])]
    out += [_ring(g, basis) for g in ev.get("slow_groups", [])]
    seq = ev.get("sequence_imbalance", {})
    if seq.get("detected") and seq.get("t_balanced"):
        out.append(Finding(kind="sequence_imbalance", culprit=Batches("unequal sequence lengths"),
                           factor=float(st.whatif.T_ns / seq["t_balanced"]), steps=steps,
                           evidence={"basis": basis, "method": seq.get("method"), "pearson": seq.get("pearson"),
                                     "share": seq.get("share")}))
    for f in out:
        # how consistent: the share of the analysed steps in which the culprit was slow (evidence, not a guess)
        if steps and f.steps is not steps:
            f.evidence["share_of_steps"] = len(f.steps) / len(steps)
    if st.ambiguous is not None:
        for f in out:
            if f.kind in ("slow_worker", "slow_stage"):
                f.evidence["ambiguous"] = st.ambiguous.why
    return out + [_below_the_bar(x) for x in st.below_threshold or []]


def _worker_verdict(st: Stragglers, found: list[Finding], c: dict | None) -> Finding | None:
    kind = FINDING_OF["worker"]
    steps = st.steps or []
    if c and "rank" not in c:
        # flows: the cause is known, the worker only as one of several (a TP group's pipelines)
        return Finding(kind=kind, culprit=OneOf(c.get("ranks"), c.get("stage")), factor=c.get("factor"), steps=steps,
                       factor_vs=c.get("factor_vs", "stage peers"),
                       evidence={"basis": st.basis, "ambiguous": c.get("ambiguous")})
    match = [f for f in found if f.kind == kind and c and isinstance(f.culprit, Worker) and f.culprit.rank == c["rank"]]
    if match or not c:
        return match[0] if match else None
    top = st.top_workers[0] if st.top_workers else None
    return Finding(kind=kind, culprit=Worker(c["rank"], c.get("stage"), c.get("dp_rank")), factor=c.get("factor"),
                   steps=steps, factor_vs=c.get("factor_vs", "stage peers"),
                   evidence={"basis": st.basis, "S_w": top.slowdown if top is not None else None,
                             "stall_ns_per_step": getattr(top, "stall_ns_per_step", None),
                             "compute_vs_stage_peers": c.get("factor")})


def _stage_verdict(st: Stragglers, found: list[Finding]) -> Finding:
    kind = FINDING_OF["stage_imbalance"]
    stage = st.whatif.verdict_stage if st.whatif is not None else None
    match = [f for f in found if f.kind == kind and isinstance(f.culprit, Stage) and f.culprit.stage == stage]
    if match:
        return match[0]
    vs = ((st.evidence or {}).get("stage_imbalance", {}).get("stage_vs_others") or {}).get(str(stage))
    return Finding(kind=kind, culprit=Stage(stage), factor=vs, steps=st.steps or [],
                   evidence={"basis": st.basis, "stage_fix_share": (st.whatif.verdict_shares if st.whatif else {})
                             .get("stage_imbalance")})


def verdict_finding(st: Stragglers, found: list[Finding]) -> Finding | None:
    """The finding that names the verdict's culprit, made from the section's culprits if no threshold
    listed it; None for verdicts without one (none, mixed). Where its basis measured no ratio for the
    culprit (arrival skew of a collective, a stage the replay blamed), its factor is the cost it was blamed
    for, the job's S, and the evidence says so."""
    f = _verdict_finding(st, found)
    if f is None or measured(f.factor):
        return f
    return replace(f, factor=float(st.slowdown), evidence={
        **f.evidence, "factor_is": "the job's slowdown S: this basis measured no ratio for the culprit"})


def _verdict_finding(st: Stragglers, found: list[Finding]) -> Finding | None:
    kind = FINDING_OF.get(st.verdict)
    if kind is None:
        return None
    cul = st.culprits or {}
    if st.verdict == "worker":
        return _worker_verdict(st, found, cul.get("worker"))
    if st.verdict == "stage_imbalance":
        return _stage_verdict(st, found)
    match = [f for f in found if f.kind == kind]
    if match:
        return match[0]
    if st.verdict == "communication":
        c = cul.get("communication") or {}
        who = Rank(c["rank"]) if "rank" in c else Group(c.get("group_id"), c.get("ranks"))
        return Finding(kind=kind, culprit=who, factor=c.get("transfer_ratio"), steps=st.steps or [],
                       evidence={"basis": st.basis})
    return None


def straggler_findings(st: Stragglers) -> tuple[Finding | None, list[Finding]]:
    """(the verdict's finding or None, the findings its evidence lists; the first may be among them)."""
    found = measured_findings(st)
    return verdict_finding(st, found), found


def findings_of(st: Stragglers, regressions: Iterable[Regression] = ()) -> list[Finding]:
    """A job's one list of findings: the straggler section's (the verdict's first) and the kernel
    section's, in the report's order."""
    first, found = straggler_findings(st)
    return order_findings(first, [*found, *kernel_findings(regressions)], st.verdict)
