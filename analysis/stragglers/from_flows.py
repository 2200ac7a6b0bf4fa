"""The straggler section of a flows-only report, from switch flow records alone.

Both kinds of evidence are read off the data-parallel links of the inferred strategy (links between
members of one DP group), whose traffic every step is the same collective moving the same bytes:

- *slow link / NIC* (stragglers.link_rates): a link, an endpoint or a whole ring whose payload rate sits far
  below its peers' (verdict ``communication``);
- *slow endpoint* (stragglers.late_arrivals): a worker whose ring links open late every step, or whose pipeline's
  forward sends fall behind from its stage on (verdict ``worker``).

When the evidence points at a group but cannot single out one address (a slow ring, the pipelines of a
TP group), the verdict names the cause and the group, and no address. S is estimated as
step / (step - cost); below ``none_below`` (the contract's 1.05) the verdict is ``none`` and the
finding is kept as evidence (``below_threshold``), naming nobody. With no finding at all, the section
is not evaluated: nothing gives S, and the checks miss too many slow ranks for a "none" (see
``_nothing_found``).
"""

from __future__ import annotations

import polars as pl

from rankscope.analysis.fabric.pair_traffic import on_pairs
from rankscope.analysis.report.steps import Steps
from rankscope.analysis.report.stragglers import FlowsChecks, FlowWorker, RingOrWorker, Stragglers
from rankscope.analysis.report.strategy import Strategy
from rankscope.analysis.stragglers.flow_cost import step_cost
from rankscope.analysis.stragglers.late_arrivals import late_senders, late_stage, late_stage_unread
from rankscope.analysis.stragglers.link_rates import (
    MIN_PACKETS,
    SLOW_FACTOR,
    group_of,
    link_rates,
    slow_group,
    slow_links,
)

NO_STEP_TIME = "no step time from flows: link rates and lateness need one"
NOTHING_FOUND = ("no slow link, NIC or late endpoint found in the flows: with no such finding they give no S (no "
                 "ideal step time), and finding none does not show that every rank is healthy")


def _dp_links(flow: pl.DataFrame, strategy: Strategy, pairs: frozenset = frozenset()) -> pl.DataFrame:
    """Payload records between members of one DP group (only on ``pairs``, the collectives' own links,
    when given), with the group as ``g``."""
    group = group_of(strategy)
    if not group or flow.is_empty():
        return flow.head(0)
    f = flow.filter(pl.col("is_data")) if "is_data" in flow.columns else flow
    gs = pl.col("src_addr").replace_strict(group, default=-1, return_dtype=pl.Int64)
    gd = pl.col("dst_addr").replace_strict(group, default=-2, return_dtype=pl.Int64)
    f = f.with_columns(g=gs).filter(pl.col("g") == gd)
    return on_pairs(f, pairs) if pairs else f


def _slow_group_if_tied(flow: pl.DataFrame, strategy: Strategy, steps: Steps, resolution_ns: int) -> dict | None:
    """slow_group under the labellings as good as the reported one (a 2 x 2 grid over TCP), or None: a real
    gloo DP2 x PP2 job with a slow NIC on stage 1 was reported with the DP/PP swap first."""
    for k, alt in enumerate(strategy.tied_labellings):
        other = Strategy(dp=alt.dp, pp=alt.pp, dp_groups=alt.dp_groups or [])
        if not other.dp_groups:
            continue
        x = slow_group(link_rates(flow, other, float(steps.median_ns), resolution_ns), other, steps.count)
        if x:
            return {**x, "labelling": f"alternatives[{k}]", "labelling_note": "read in an alternative "
                    "labelling that fits as well as the reported one: its members are the slow ring's either way"}
    return None


def _ring_and_late_stage(ring: dict | None, late: dict | None) -> tuple[dict | None, dict | None, dict | None]:
    """A slow ring (no member singled out) and a late pipeline stage, read together: (ring, late, ambiguity).

    Each can cause the other's symptom. A slow NIC slows its DP ring and holds up its pipeline's
    activations, so its pipeline runs late (a DP32 x PP16 RoCE job, one NIC slowed 3.7x: its ring 3.5x
    its peers', its pipeline 16 ms late at the last stage, whose worker flows named). A slow worker
    holds up the backward pass of the stages before it, whose rings then wait and read slow (a DP4 x
    PP8 job, stage 1 slowed 1.8x: stage 0's ring 2.2x its peers'). Where the ring crosses the late
    pipeline, the finding with the larger cost is kept and the other becomes its alternative, and the
    report says it is ambiguous; on the late stage itself, that address is named either way.
    """
    if not ring or ring.get("culprit") or not late or not late.get("pipeline") or not late.get("culprit"):
        return ring, late, None
    on = sorted(set(late["pipeline"]) & set(ring["members"]))
    if not on:
        return ring, late, None
    x = late["culprit"]
    costs = {"communication_extra_ns": float(ring["extra_ns"]), "worker_extra_ns": float(late["extra_ns"])}
    nic = ring["extra_ns"] >= late["extra_ns"]
    if on == [x]:
        why = (f"{x}: its DP ring is slow and its pipeline falls behind from its stage; a slow NIC and a slow "
               "worker both do that, so the cause is the one with the larger cost")
        merged = {**(ring if nic else late), "kind": "slow_nic" if nic else "slow_worker", "culprit": x,
                  "links": [], "ambiguous_cause": why}
        return None, merged, {"between": ["communication", "worker"], "rank": x, **costs, "why": why}
    why = (f"the slow ring crosses the late pipeline at {on[0]}, not at its late stage {x}: a slow NIC there "
           f"holds up the pipeline, or a slow worker at {x} keeps the ring waiting; the larger cost is reported")
    amb = {"between": ["communication", "worker"], "ring": ring["members"], "rank": x, **costs, "why": why}
    if nic:
        return ring, {**late, "culprit": None, "kind": "late_stage_or_ring", "ambiguous": why}, amb
    return {**ring, "kind": "slow_group_or_late_stage"}, late, amb


def _brief(x: dict, step: float) -> dict:
    """A finding under the report's bar, as evidence: who (or which group), how late or slow, the step's
    slowdown it costs, and whether that cost is only a lower bound (no forward time to set a late send
    against: a two-stage pipeline)."""
    keep = ("kind", "culprit", "members", "stage", "factor", "late_ns", "extra_ns", "ambiguous")
    out = {k: x[k] for k in keep if k in x}
    out["slowdown"] = _slowdown(x, step)
    # (a late ring arrival is the whole cost: the ring waits for it; only a late forward send is a part)
    if "stage" in x and x.get("factor") is None:
        out["cost"] = "a lower bound: the lateness of the first send, with no forward time to set it against"
    return out


def _nothing_found(base: dict, strategy: Strategy) -> Stragglers:
    """A flows-only section with no finding: not evaluated, with what was checked.

    Flows give no ideal step time: S is measured only from a finding's cost. And finding nothing is weak
    evidence of health: on the flow-diagnosis corpus (dev seeds 1-7), 188 of 259 jobs slowed 5 % or more
    by one slow rank or link showed nothing these checks read, against 165 of 167 clean jobs. A "none"
    there, with S 1.00, was a wrong "no straggler" more often than a right one."""
    checks: FlowsChecks = base["flows"]
    rates = checks.link_rates
    checked = {"link_rates": f"{rates['trusted']} of {rates['links']} links' rates compared",
               "late_dp_links": checks.late_dp_links,
               "late_pipelines": late_stage_unread(strategy) or "no pipeline falls behind from a stage on"}
    return Stragglers(**base, evaluated=False, why=NOTHING_FOUND, checked=checked, findings_flows=[])


def _slowdown(x: dict, step: float) -> float:
    return round(step / (step - min(x["extra_ns"], 0.9 * step)), 4)


def _late_dp_links(flow, strategy: Strategy, steps: Steps, step: float, resolution_ns: int, dp_pairs) -> tuple:
    """(the lateness found on DP links or None, what the check says).

    In a tree all-reduce a member sends up only once its children's data arrived, so its sends are late
    by design; and lateness needs the steps where they are. A period that may be a whole multiple of the
    step (the exporter hid some steps) still groups whole steps: a late member's links open late in each
    of them against its group's, so only a period that does not repeat clearly keeps lateness out."""
    kinds = strategy.flows.dp_group_kinds if strategy.flows is not None else None
    # (a pure pipeline's one-member groups hold no DP link to be late on)
    multi = set(kinds or {}) - {"single"}
    rings = kinds is None or multi <= {"ring", "pair"}
    weak = bool(steps.period is not None and steps.period.period_weak)
    readable = rings and (kinds is None or bool(multi)) and not weak
    dp = _dp_links(flow, strategy, dp_pairs)
    late = late_senders(dp, step, resolution_ns, strategy.pp_groups) if readable else None
    said = ("not evaluated: no data-parallel group has two members" if kinds is not None and not multi
            else "not evaluated: in a tree all-reduce members send up only once their children's data arrived"
            if not rings else "not evaluated: the traffic does not repeat clearly at the step time found" if weak
            else "no DP link opens consistently late" if late is None else late["kind"])
    return late, said


def _checks(flow: pl.DataFrame, strategy: Strategy, steps: Steps, step: float, resolution_ns: int, dp_pairs,
            clocks) -> tuple[dict, pl.DataFrame, list[dict], list[dict]]:
    """Every flows check of the section: (the section's fields so far, the link rates, what names a
    culprit, what names only a group)."""
    links = link_rates(flow, strategy, step, resolution_ns)
    rates = {"links": int(links.height), "trusted": int(links["trusted"].sum()) if links.height else 0,
             "dp_links": int((links["g"] >= 0).sum()) if links.height else 0,
             "min_packets": MIN_PACKETS, "slow_factor": SLOW_FACTOR}
    if links.height and not links["trusted"].any():
        rates["why"] = f"every link holds fewer than {MIN_PACKETS} sampled packets"
    late, said = _late_dp_links(flow, strategy, steps, step, resolution_ns, dp_pairs)
    if late is None or not late.get("culprit"):
        late = late_stage(flow, strategy, step, resolution_ns, clocks) or late
    # what the flows could not check, so that a verdict "none" is not read as "no straggler"
    unread = {}
    if late is None and said.startswith("not evaluated"):
        unread["worker"] = said.removeprefix("not evaluated: ")
    if "why" in rates or not links.height:
        unread["communication"] = rates.get("why", "no link between the job's endpoints has a rate")
    ring0, link = slow_group(links, strategy, steps.count), slow_links(links, steps.count)
    ring, late, crossing = _ring_and_late_stage(ring0, late)
    cands = [link, ring, late]
    if not (link or ring0):
        cands.append(_slow_group_if_tied(flow, strategy, steps, resolution_ns))
    cands = [_costed(x, flow, strategy, step, clocks) if x else x for x in cands]
    found = [x for x in cands if x and x.get("culprit")]
    ambiguous = [x for x in cands if x and not x.get("culprit")]
    base = {"basis": "flows", "flows": FlowsChecks(link_rates=rates, late_dp_links=said),
            "not_evaluated": unread or None, "ambiguous": RingOrWorker(**crossing) if crossing else None,
            "ambiguous_flows": [{k: v for k, v in x.items() if k != "links"} for x in ambiguous] or None}
    return base, links, found, ambiguous


def _costed(x: dict, flow: pl.DataFrame, strategy: Strategy, step: float, clocks) -> dict:
    """The finding with its cost as a what-if on the step's structure (stragglers.flow_cost), where the flows
    show that structure: a slow part the job does not wait for costs nothing (never more than the finding's own
    estimate, an upper bound). Else the finding's own estimate stays (its whole lateness, or the step times its rate factor), and the report says so."""
    who = {x["culprit"]} if x.get("culprit") else set(x.get("members") or [])
    if not who:
        return x
    c = step_cost(flow, strategy, step, who, clocks)
    if c["extra_ns"] is None:
        return {**x, "cost_basis": f"the finding's own lateness or rate ({c['why']})"}
    # the replay can only hide part of the culprit's own extra time: more than that is other lateness the
    # step structure picked up (sampled or batched record times, a clean gloo job's jitter), not its cost
    capped = c["extra_ns"] > x["extra_ns"]
    return {**x, "extra_ns": min(c["extra_ns"], x["extra_ns"]), "extra_ns_unreplayed": x["extra_ns"],
            "cost_basis": ("the finding's own lateness or rate: the what-if read more, which is other lateness"
                           if capped else "what-if: the step with the culprit at its peers' pace"),
            "cost_parts": {k: c[k] for k in ("pipeline_late_ns", "sync_tail_ns", "steps")}}


def _group_section(x: dict, step: float, none_below: float, base: dict) -> Stragglers:
    """Evidence that a ring or a TP group's pipelines are slow, but not who: the cause is reported, nobody
    is named."""
    s = _slowdown(x, step)
    if s < none_below:
        return Stragglers(**base, slowdown=s, verdict="none", findings_flows=[], below_threshold=[_brief(x, step)])
    ev = None
    if x["kind"] == "slow_group":
        cause, who = "communication", {"group_id": x["group"], "ranks": x["members"], "transfer_ratio": x["factor"],
                                       **({"labelling": x["labelling"]} if "labelling" in x else {})}
        # the ring's rate against its peer rings is measured over the bar (SLOW_FACTOR) like any slow link:
        # a finding of the section's own, only its member is not singled out
        ev = {"slow_groups": [{"group_id": x["group"], "members": x["members"], "factor": x["factor"],
                               "ambiguous": x.get("ambiguous")}]}
    else:
        cause, who = "worker", {"ranks": x["members"], "ambiguous": x["ambiguous"],
                                **({"factor": x["factor"], "stage": x["stage"], "factor_vs": x["factor_vs"]}
                                   if x["kind"] == "late_pipelines" else
                                   {"late_ns": x["late_ns"], "factor": s,
                                    "factor_vs": "the step without the group's lateness on its DP links"})}
    # a TP group's endpoints run in lock step: the worker is one of them, each as right as the others
    top = ([FlowWorker(endpoint=x["one_of"][0], slowdown=s, kind="slow_worker", one_of=list(x["one_of"]))]
           if cause == "worker" and x.get("one_of") else [])
    return Stragglers(**base, slowdown=s, verdict=cause, by_cause={cause: 1.0}, top_workers=top,
                      waste_fraction=round(1 - 1 / s, 4), findings_flows=[], steps=[], culprits={cause: who},
                      evidence=ev)


def _named_section(found: list[dict], step: float, none_below: float, base: dict, links: pl.DataFrame) -> Stragglers:
    """Evidence that names addresses: the costliest is the verdict's culprit."""
    best = max(found, key=lambda x: x["extra_ns"])
    s = _slowdown(best, step)
    cause = "communication" if best["kind"] in ("slow_nic", "slow_link") else "worker"
    if s < none_below:
        # too small to matter: listed as evidence, nobody named (a clean job's member that opens its
        # ring link 2 ms late in a 3.4 s step is no culprit)
        return Stragglers(**base, slowdown=s, verdict="none", findings_flows=[],
                          below_threshold=[_brief(x, step) for x in found])
    top = [FlowWorker(endpoint=x["culprit"], slowdown=_slowdown(x, step), kind=x["kind"])
           for x in sorted(found, key=lambda x: -x["extra_ns"])]
    # the evidence in the shape the findings read (culprits are addresses: flows know no ranks)
    ev: dict = {"slow_links": [], "slow_ranks": []}
    culprits: dict = {}
    for x in found:
        f = _slowdown(x, step)
        if x["kind"] == "slow_worker":
            ev["slow_ranks"].append({"rank": x["culprit"], "factor": f, "steps": []})
            culprits.setdefault("worker", {"rank": x["culprit"], "factor": f,
                                           "factor_vs": x.get("factor_vs", "its DP group's senders")})
        else:
            ev["slow_links"].append({"rank": x["culprit"], "factor": x["factor"], "steps": [],
                                     "slow_transfers": len(x["links"]), "transfers": int(links.height)})
            culprits.setdefault("communication", {"rank": x["culprit"], "transfer_ratio": x["factor"],
                                                  **({"labelling": x["labelling"]} if "labelling" in x else {})})
    return Stragglers(**base, slowdown=s, verdict=cause, by_cause={cause: 1.0}, top_workers=top,
                      waste_fraction=round(1 - 1 / s, 4), findings_flows=found, evidence=ev, culprits=culprits,
                      steps=[])


def flow_straggler_section(flow: pl.DataFrame, strategy: Strategy, steps: Steps, resolution_ns: int = 1,
                           none_below: float = 1.05, dp_pairs: frozenset = frozenset(),
                           clocks: dict[str, str] | None = None) -> Stragglers:
    """Straggler section of a flows-only report (see module doc).

    Needs flow (aligned) src_addr, dst_addr, est_bytes or size_bytes, start_ns, end_ns and is_data,
    num_packets, sampling_rate if known; the inferred strategy's dp_groups, pp_groups and the step time;
    ``dp_pairs``: the heavy pairs labelled data-parallel (FlowInference.dp_pairs), whose links alone are
    read for late arrivals; ``clocks``: exporter -> the clock its times are on (model.clocks.exporter_clocks).
    """
    if "est_bytes" not in flow.columns:
        rate = pl.col("sampling_rate").fill_null(1).clip(lower_bound=1) if "sampling_rate" in flow.columns else 1
        flow = flow.with_columns(est_bytes=(pl.col("size_bytes") * rate).cast(pl.Float64))
    step = float(steps.median_ns or 0.0)
    if flow.is_empty() or not step:
        return Stragglers(basis="flows", evaluated=False, why=NO_STEP_TIME)
    base, links, found, ambiguous = _checks(flow, strategy, steps, step, resolution_ns, dp_pairs, clocks)
    if found:
        return _named_section(found, step, none_below, base, links)
    slow = [x for x in ambiguous if x["kind"] in ("slow_group", "late_pipelines", "late_tp_group")]
    x = max(slow, key=lambda y: y["extra_ns"], default=None)
    return _nothing_found(base, strategy) if x is None else _group_section(x, step, none_below, base)
