"""The report's ``findings``: each slow GPU, stage, link, batch or kernel, named with its factor and steps.

The verdict says what costs the most; a finding says what is wrong, even when it costs too little for a
verdict (one GPU 1.5x slow among 4,096 costs S 1.04). Every section feeds the one list: the straggler
section (slow_worker, slow_stage, slow_link, sequence_imbalance, from compute, arrivals or flows, under the
verdict's bar too) and the kernel section (kernel_regression, misaligned_gemm). The verdict's culprit comes
first, then by kind (compute before transfers: a transfer ratio also flags links that are slower by
design), then by factor.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from rankscope.analysis.report.codec import doc
from rankscope.analysis.report.kernels import KernelCheck, Regression
from rankscope.collectors.record_class import record

KERNEL_KINDS = ("kernel_regression", "misaligned_gemm")
KIND_ORDER = {"slow_worker": 0, "slow_stage": 1, "sequence_imbalance": 2, "kernel_regression": 3,
              "misaligned_gemm": 4, "slow_link": 5}


@record
class Worker:
    """A rank (or, from flows, an address) with its place in the layout."""

    rank: Any = doc("the rank, or the address from flows.")
    stage: int | None = doc("its pipeline stage.")
    dp_rank: int | None = doc("its data-parallel rank.")


@record
class Rank:
    """A rank (or an address from flows) whose transfers are slow."""

    rank: Any = doc("the rank or address.")


@record
class Stage:
    """A pipeline stage."""

    stage: int | None = doc("the stage.")


@record
class Endpoint:
    """A network address."""

    endpoint: str = doc("the address.")


@record
class OneOf:
    """One of several endpoints that the evidence cannot tell apart (a TP group's pipelines)."""

    one_of: list | None = doc("the candidates.")
    stage: int | None = doc("their stage.")


@record
class Group:
    """A process group (or a DP ring) as a whole."""

    group_id: Any = doc("the group id, or the DP group's index from flows.")
    ranks: list | None = doc("its members.")


@record
class Batches:
    """The microbatches themselves (unequal sequence lengths)."""

    microbatches: str = doc("what is unequal.")


Culprit = Worker | Rank | Stage | Endpoint | OneOf | Group | Batches | int | list | str


@record
class Finding:
    """One anomaly, named with its culprit."""

    kind: str = doc("slow_worker, slow_stage, slow_link, sequence_imbalance, kernel_regression, "
                    "misaligned_gemm, or from the traffic section traffic_slow, traffic_missing, traffic_unexpected "
                    "or traffic_rerouted.")
    culprit: Culprit = doc("who or what is anomalous: a rank, an address, a stage, a group, the batches, or "
                           "a kernel (a rank, ranks, or a kernel name).")
    factor: float = doc("how many times slower than its peers or its expectation (for the verdict's culprit "
                        "without a measured ratio, the job's S: ``evidence.factor_is`` says so).")
    steps: list[int] = doc("the steps it was slow in.")
    evidence: dict[str, Any] = doc("the numbers behind it, and the basis they were measured on.")
    factor_vs: str | None = doc("what the factor is against, when not the culprit's peers.", None, omit="none")
    kernel: KernelCheck | None = doc("the kernel check, for kernel findings.", None, flatten=True)


def kernel_findings(regressions: Iterable[Regression]) -> list[Finding]:
    """One finding per (kind, culprit): a throttled rank is slow on every GEMM shape, and each shape is a
    regression of its own, but it is one anomaly; the shapes stay in the evidence."""
    grouped: dict[tuple, Finding] = {}
    for r in regressions:
        key = (r.kind, repr(r.culprit))
        shape = {"kernel": r.check.kernel, "shape": r.check.shape, "factor": r.factor}
        g = grouped.get(key)
        if g is None:
            grouped[key] = Finding(kind=r.kind, culprit=r.culprit, factor=r.factor, steps=list(r.steps),
                                   evidence={**r.evidence, "kernels": [shape]}, kernel=r.check)
            continue
        grouped[key] = replace(g, factor=max(g.factor or 0.0, r.factor or 0.0),
                               steps=sorted(set(g.steps) | set(r.steps)),
                               evidence={**g.evidence, "kernels": [*g.evidence["kernels"], shape]})
    return list(grouped.values())


def measured(factor) -> bool:
    """Whether a factor is a number (the report contract wants one; a finding that measured none is none)."""
    return isinstance(factor, (int, float)) and not isinstance(factor, bool)


def order_findings(first: Finding | None, found: Iterable[Finding], verdict: str) -> list[Finding]:
    """All findings of one job: the verdict's (``first``) first, then the rest by kind (compute before
    transfers) and factor, largest first."""
    rest = [f for f in found if f is not first and measured(f.factor)]
    rest.sort(key=lambda f: (KIND_ORDER.get(f.kind, 6), -f.factor))
    if first is None:
        return rest
    return [replace(first, evidence={**first.evidence, "verdict": verdict}), *rest]


def where(c: Culprit) -> str:
    """A culprit in words."""
    if isinstance(c, bool):
        return str(c)
    if isinstance(c, int):
        return f"rank {c}"
    if isinstance(c, list):
        return f"ranks {', '.join(map(str, c))}"
    if isinstance(c, str):
        return c
    if isinstance(c, Worker):
        place = [f"{k} {v}" for k, v in (("stage", c.stage), ("dp", c.dp_rank)) if v is not None]
        return f"rank {c.rank}" + (f" ({', '.join(place)})" if place else "")
    if isinstance(c, Rank):
        return f"rank {c.rank}"
    if isinstance(c, OneOf):
        return f"one of {', '.join(map(str, c.one_of or []))}" + (
            f" (stage {c.stage})" if c.stage is not None else "")
    if isinstance(c, Stage):
        return f"stage {c.stage}"
    if isinstance(c, Group):
        return f"group {c.group_id} (ranks {', '.join(map(str, c.ranks or []))})"
    if isinstance(c, Endpoint):
        return f"endpoint {c.endpoint}"
    if isinstance(c, Batches):
        return f"microbatches {c.microbatches}"
    return str(c)


def describe(f: Finding) -> str:
    """One finding in words: culprit, what is slow and by how much."""
    fac = f.factor
    x = f"{fac:.2f}x" if isinstance(fac, (int, float)) and fac == fac else "?x"
    kind, who, ev = f.kind, where(f.culprit), f.evidence
    stall = ev.get("stall_ns_per_step")
    if kind == "slow_worker" and ev.get("late_ns") is not None:
        # flows: a late sender, measured by its lateness, not its compute
        return f"{who} sends {ev['late_ns'] / 1e6:.0f} ms late a step (the step takes {x} its time without that)"
    if kind == "slow_worker" and ev.get("own_time_with_stalls_vs_stage_peers") is not None:
        return f"{who} takes {x} its stage peers' compute time, with stalls (gc, data) of {stall / 1e6:.0f} ms per step"
    if kind == "slow_worker" and (f.factor_vs or "stage peers") != "stage peers":
        vs = f.factor_vs
        return f"{who} computes {x} " + (vs if vs.startswith(("the ", "its ")) else f"the {vs}")
    if kind == "slow_worker":
        return f"{who} computes {x} its stage peers" + (
            "'" if ev.get("basis") != "arrival_skew" else "' (own work between collectives)")
    if kind == "slow_stage":
        return f"{who} computes {x} the other stages'"
    if kind == "slow_link":
        return f"transfers of {who} run {x} their typical"
    if kind == "traffic_slow":
        nic = f" (the pairs share {ev['shared_endpoint']})" if ev.get("shared_by_pairs", 0) > 1 else ""
        return f"link {who} runs {x} slower than its peers{nic}"
    if kind.startswith("traffic_"):
        return f"link {who}: {kind[8:]} traffic ({x} the expected bytes)"
    if kind == "sequence_imbalance":
        return f"sequence-length imbalance: balanced microbatches would run {x} faster"
    if kind in KERNEL_KINDS:
        kernels = ev.get("kernels") or [{"kernel": f.kernel.kernel if f.kernel else who}]
        what = kernels[0].get("kernel") if len(kernels) == 1 else f"{len(kernels)} GEMM shapes"
        why = "slower: misaligned for tensor cores" if kind == "misaligned_gemm" else "slower than elsewhere in the run"
        return f"{what} {x} {why}" if what == who else f"{who}: {what} {x} {why}"
    return f"{kind}: {who} {x}"
