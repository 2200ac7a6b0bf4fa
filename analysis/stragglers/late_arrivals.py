"""Late arrivals from switch flow records: a slow endpoint.

A worker that computes slowly finishes its backward pass late, so its DP
ring link opens late in every step while its ring peers' open on time (their
first chunk is their own); over RoCE the link into it opens late too (the
sender writes only into buffers it has posted). The endpoint that sends and
receives on the late links (or sends on the one late link) is named. In a
pipeline, its pipeline's forward sends fall behind from its stage on. Late
is judged with the outlier rule of the link rates (stragglers.link_rates).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import polars as pl

from rankscope.analysis.fabric.link_models import TWO_WAY
from rankscope.analysis.report.strategy import Strategy
from rankscope.analysis.stragglers.link_rates import OUTLIER_MADS, robust
from rankscope.analysis.strategy.flows.ranks_per_address import ROCE_PORT

LATE_SLACK = 0.25
"""a later stage may absorb at most this share of a slow stage's lateness (jitter, its own bubble)."""
UPSTREAM_LATE_Z = 1.5
"""a pipeline late from some stage to the one before its last by this many noise units (the stages' robust z
pooled, sum over sqrt(count)) may owe its last stage's lateness to that stage: see _named_or_ambiguous."""
MAX_FACTOR = 10.0
"""a stage read as more times slower than this is a misread send (no compute straggler runs 10x its peers
and keeps the job running), and names nobody."""
_LINK = ["src_addr", "dst_addr"]
"""a directed link's columns."""


def late_senders(dp: pl.DataFrame, step_ns: float, resolution_ns: int,
                 pipelines: list[list[str]] | None = None) -> dict | None:
    """The endpoint whose DP links open consistently late in its group, or None.

    Needs dp src_addr, dst_addr, g (group), start_ns, end_ns. A burst starts after an idle gap longer
    than a tenth of a step, or half the link's longest one, since the link's previous record ended (a
    record the active timeout cut off is followed at once by the next, whose start carries no phase);
    a link's first burst in a step is measured against the median of its group's in the same step
    (the collective's start). A ring
    member's first chunk is its own, so a member that arrives late opens its link to the next member
    late, and over RoCE also the link from the previous one (whose writes wait for its posted
    buffers): the culprit is the endpoint that both sends and receives on late links, or the sender
    of the one late link. A slow worker delays its whole pipeline's backward pass: when several
    endpoints fit (a late pipeline), the finding is ``ambiguous`` and nobody is named.
    """
    if dp.is_empty() or not step_ns:
        return None
    late = _arrival_lateness(_payload_records(dp), step_ns, resolution_ns)
    per = late.group_by(_LINK).agg(late=pl.col("late").median(), n=pl.len(), g=pl.col("g").first())
    if per.height < 3:
        return None
    med, sd = robust(per["late"].to_numpy().astype(float))
    sd = max(sd, 20.0 * resolution_ns)
    # a collective's link carries payload every step; one that bursts in fewer than half of them
    # (connection set-up, the acknowledgement side of a ring link) has no arrival to be late for
    steady = max(2, int(late["step"].n_unique()) // 2)
    bad = per.filter(((pl.col("late") - med) / sd >= OUTLIER_MADS) & (pl.col("n") >= steady))
    if bad.is_empty():
        return None
    cands = _late_endpoints(bad, over_roce=_over_roce(dp))
    if not cands:
        return None
    off = per.filter(((pl.col("late") - med).abs() / sd >= OUTLIER_MADS) & (pl.col("n") >= steady))
    return _late_sender_finding(bad, set(off["src_addr"].to_list()), cands, med, sd, pipelines)


def _payload_records(dp: pl.DataFrame) -> pl.DataFrame:
    """The DP records of the directions that carry payload, sorted by link and start.

    Takes dp src_addr, dst_addr, g, start_ns, end_ns, est_bytes; returns those columns. A ring link's
    other direction holds acknowledgements and set-up, whose timing says nothing of an arrival: a
    direction is kept when it carries at least TWO_WAY times its reverse's bytes.
    """
    f = dp.select(*_LINK, "g", "start_ns", "end_ns", "est_bytes").sort(*_LINK, "start_ns")
    vol = f.group_by(_LINK).agg(v=pl.col("est_bytes").sum())
    vol = vol.join(vol.rename({"src_addr": "dst_addr", "dst_addr": "src_addr", "v": "back"}), on=_LINK, how="left")
    payload = vol.filter(pl.col("v") >= TWO_WAY * pl.col("back").fill_null(0.0)).select(_LINK)
    return f.join(payload, on=_LINK, how="semi").sort(*_LINK, "start_ns")


def _arrival_lateness(f: pl.DataFrame, step_ns: float, resolution_ns: int) -> pl.DataFrame:
    """Each link's first burst of each step against its group's in the same step.

    Takes payload records sorted by link and start (see _payload_records); returns one row per link,
    group and step: src_addr, dst_addr, g, step, start_ns (the burst's start) and late (its start less
    the median of its group's first bursts in that step).
    """
    gap = pl.col("start_ns") - pl.col("end_ns").cum_max().shift(1).over(_LINK)
    f = f.with_columns(gap=gap).with_columns(big=pl.col("gap").max().over(_LINK))
    # a burst follows the idle time between steps: a tenth of a step, or, where the collectives fill
    # most of the step (ZeRO's bucketed reduce-scatters and all-gathers over a 34 s step left 1.7 s
    # idle), half the link's longest idle gap; a record that follows its predecessor within a few
    # clock ticks is the same burst cut by the active timeout
    edge = pl.min_horizontal(pl.lit(0.1 * step_ns), 0.5 * pl.col("big"))
    bursts = f.filter(pl.col("gap").is_null() | ((pl.col("gap") > edge) & (pl.col("gap") > 10 * resolution_ns)))
    # steps are counted from the group's first burst, a quarter step early (late arrivals stay in their
    # step); a link's first burst in a step is its arrival at the step's first collective
    first = pl.col("start_ns").min().over("g")
    bursts = (bursts.with_columns(step=((pl.col("start_ns") - first + 0.25 * step_ns) / step_ns).floor().cast(pl.Int64))
              .group_by(*_LINK, "g", "step").agg(pl.col("start_ns").min()))
    return bursts.with_columns(late=pl.col("start_ns") - pl.col("start_ns").median().over(["g", "step"]))


def _over_roce(dp: pl.DataFrame) -> bool:
    """Whether most of the records are RoCE (dst_port, where known, is its port)."""
    return "dst_port" in dp.columns and bool((dp["dst_port"] == ROCE_PORT).fill_null(False).mean() > 0.5)


def _late_endpoints(bad: pl.DataFrame, over_roce: bool) -> list[str]:
    """The endpoints that may have arrived late, sorted: those that both send and receive on late links,
    else (not over RoCE) the senders of late links."""
    senders, receivers = set(bad["src_addr"].to_list()), set(bad["dst_addr"].to_list())
    # over RoCE a late member's writes and the writes into it both wait for it: a late link whose other
    # direction is on time is no late arrival there (a DP2 pair of a clean RoCE job read one direction
    # 0.14 s late, its records cut at other times by the exporter's timers)
    return sorted(senders & receivers) or ([] if over_roce else sorted(senders))


def _late_sender_finding(bad: pl.DataFrame, off_senders: set[str], cands: list[str], med: float, sd: float,
                         pipelines: list[list[str]] | None) -> dict:
    """The finding for late links ``bad`` (src_addr, dst_addr, g, late): one slow worker, or who may be.

    ``off_senders``: the senders of all links off their group's time, late or early; ``cands``: the
    endpoints that may have arrived late (see _late_endpoints); ``med``, ``sd``: the links' median
    lateness and its robust spread. The culprit is named when one candidate fits and no mate of its
    pipeline is off as well; else the finding is a late pipeline, a late TP group, or late links, with
    its ``members`` and why nobody is named (``ambiguous``).
    """
    worst = bad.filter(pl.col("src_addr").is_in(cands)).sort("late", descending=True).row(0, named=True)
    out = {"kind": "slow_worker", "culprit": worst["src_addr"], "extra_ns": float(worst["late"] - med),
           "late_ns": float(worst["late"] - med), "robust_sd_ns": sd,
           "late_links": sorted([a, b] for a, b in bad.select("src_addr", "dst_addr").iter_rows())}
    mates = next((p for p in pipelines or [] if set(cands) <= set(p) and len(p) > 1), None)
    # a slow stage shifts its whole pipeline's backward pass: its mates' DP links are off too, late or
    # early (a DP16 x PP16 job, stage 6 slowed 1.9x: stage 0's links 0.3 s late, stages 1-15's a step
    # phase early), so one member off among mates that are off as well names nobody
    if len(cands) == 1 and not (mates and off_senders & (set(mates) - set(cands))):
        return out
    if mates:
        return {**out, "kind": "late_pipeline", "culprit": None,
                "members": sorted(set(cands) | (off_senders & set(mates))), "ambiguous": _WHY_LATE_PIPELINE}
    if _one_per_group(bad, cands) and not any(len(p) > 1 for p in pipelines or []):
        # a slow worker of a TP group holds up every member of the group (they meet at each layer's
        # all-reduce), and each member sits in its own DP ring (a DP16 x TP2 job on two rails: 10.0.0.6
        # and 10.1.0.6 both 0.33 s late): the group is slow, flows cannot tell which member
        group_late = float(bad["late"].median() - med)
        return {**out, "kind": "late_tp_group", "culprit": None, "members": cands, "one_of": cands,
                "late_ns": group_late, "extra_ns": group_late, "ambiguous": _why_late_tp_group(len(cands))}
    return {**out, "kind": "late_links", "culprit": None, "members": cands, "ambiguous": _WHY_LATE_LINKS}


def _one_per_group(bad: pl.DataFrame, cands: list[str]) -> bool:
    """Each candidate sends late links in one DP group of its own, and all are about as late (within
    LATE_SLACK of the latest): the footprint of one late TP group, not of several slow workers."""
    own = bad.filter(pl.col("src_addr").is_in(cands)).group_by("src_addr").agg(g=pl.col("g").n_unique(),
                                                                                 first=pl.col("g").first(),
                                                                                 late=pl.col("late").median())
    if own.height != len(cands) or len(cands) < 2 or (own["g"] != 1).any() or own["first"].n_unique() != len(cands):
        return False
    return float(own["late"].min()) >= (1 - LATE_SLACK) * float(own["late"].max())



def on_time(x: np.ndarray) -> tuple[float, float]:
    """Median and robust spread of the pipelines that keep time at one stage, from their sorted lateness.

    The late ones are those above the widest gap, if at most half are: a slow worker of a TP group
    delays every pipeline of the group alike (two of four pipelines on one clock 40 ms late), and with
    the median of all of them the late half sits one spread away. Where the
    widest gap leaves more than half above it, no set is late (a DP8 x PP16 job: five of eight
    pipelines' last stages read a burst 0.44 s later, records cut at other times) and all are the
    reference. The spread is measured on the reference when three or more are in it, else it is 0
    (the caller takes the step-to-step noise)."""
    n = len(x)
    cut = int(np.argmax(np.diff(x))) + 1 if n > 1 else n
    rest = x[:cut] if n - cut <= n // 2 else x
    return (float(np.median(rest)), robust(rest)[1] if len(rest) >= 3 else 0.0)


def _upstream_late(z: dict, pipe: int, last: int) -> float:
    """How clearly ``pipe`` runs late from some stage before ``last`` on: the largest, over start stages k, of
    its robust z at stages k..last-1 summed over the square root of their count (0 with no such stage)."""
    up = sorted((k, zz) for (p, k), (zz, _) in z.items() if p == pipe and k < last)
    return max((sum(zz for _, zz in up[i:]) / np.sqrt(len(up) - i) for i in range(len(up))), default=0.0)


def late_stage_unread(strategy: Strategy) -> str | None:
    """Why late_stage cannot read the job's pipelines at all (None when it can): the report says so where
    nothing was found (a real gloo DP2 x PP2 job with rank 0 slowed has two pipelines, which tell a late one
    from a steady difference between them no better than two DP members do)."""
    pipes = [p for p in strategy.pp_groups or [] if len(p) > 1]
    if not pipes:
        return "not evaluated: no pipeline"
    if (strategy.dp or 1) < 2:
        return ("not evaluated: one data-parallel replica: its pipelines (copies over tensor-parallel ranks) keep "
                "time with each other, so none runs late against another")
    if len(pipes) < 3:
        return (f"not evaluated: {len(pipes)} pipelines; a late one is told from a steady difference only "
                "against at least two others")
    if not (strategy.flows is not None and strategy.flows.stage_order_known):
        return "not evaluated: the stage order is not known"
    return None


def late_stage(flow: pl.DataFrame, strategy: Strategy, step_ns: float, resolution_ns: int,
               clocks: dict[str, str] | None = None) -> dict | None:
    """The endpoint whose pipeline's forward sends fall behind from its stage on, or None.

    A slow worker's ring links open late only where their records split at steps, and in a pipeline
    its whole backward pass is late (several late members, nobody named); its pipeline's activations
    tell which stage brought the delay in. Each pipeline's first forward send of a burst from stage k
    is compared with the same stage's send in the other pipelines (DP replicas, which start each step
    together after the previous gradient sync): a slow stage s delays its own sends and every later
    stage's, not the earlier ones, so the culprit is the first stage from which its pipeline stays
    late. The last stage's first gradient sent back stands in for its forward send. Needs at least
    three pipelines of at least two DP replicas with a known stage order, each compared with the others
    on its exporter's clock where there are some; flow src_addr, dst_addr, start_ns, end_ns (is_data,
    exporter if known). ``clocks``: exporter -> its clock (exporters aligned to one another share one);
    an exporter not in it keeps its own.
    """
    pipes = [p for p in strategy.pp_groups or [] if len(p) > 1]
    # the pipelines of one DP replica on several rails are its TP copies: they keep time with each other
    if (strategy.dp or 1) < 2 or len(pipes) < 3 or not step_ns or not (strategy.flows is not None and strategy.flows.stage_order_known):
        return None
    reading = _stage_lateness(flow, pipes, step_ns, resolution_ns, clocks)
    if reading is None:
        return None
    sends, z, clock_of, stages = reading
    latest = _latest_pipeline(z, stages)
    if latest is None:
        return None
    worst, row = latest
    first = _first_late_stage(row)
    lead = z[(worst, first)][1]
    if _late_on_own_clock(row, first, worst, clock_of) or _unlike_one_slow_stage(row, first, lead):
        return None
    mates = _pipelines_as_late(z, worst, first, lead)
    # a slow stage paces its pipeline, and the gradient sync the whole job, so S ~ the worker's compute factor
    fwd = _forward_time(sends, [worst, *mates], first)
    late = float(lead)
    factor = 1.0 + late / fwd if fwd > 0 else None
    # a first send later than many forward times is a burst of another phase of the step taken for it
    # (records cut at other times: a last stage 0.44 s "late" against a 1.4 ms forward), not a slow worker
    if factor is not None and factor > MAX_FACTOR:
        return None
    out = {"kind": "slow_worker", "culprit": pipes[worst][first],
           "extra_ns": float(step_ns * (1 - 1 / factor)) if factor else late,
           "factor": round(factor, 3) if factor else None, "forward_ns": fwd,
           "late_ns": late, "stage": int(first), "pipeline": pipes[worst],
           "factor_vs": "the same stage's forward time in the other pipelines",
           "late_by_stage_ns": {str(k): round(float(v), 1) for k, _, v in row}}
    return _named_or_ambiguous(out, z, pipes, [worst, *mates], first)


def _stage_lateness(flow: pl.DataFrame, pipes: list[list[str]], step_ns: float, resolution_ns: int,
                    clocks: dict[str, str] | None) -> tuple[pl.DataFrame, dict, dict, list[int]] | None:
    """How late each pipeline's first sends are at each stage, against the other pipelines'.

    Returns (the first sends of :func:`_first_sends`; z: (pipe, stage) -> (robust z, lateness in ns) where a
    stage has enough pipelines to compare; clock_of: (pipe, stage) -> the clock its sends are timed on;
    the stages in order), or None with fewer than three (pipe, stage) readings or none comparable.
    """
    sends = _first_sends(flow, pipes, step_ns, clocks)
    if sends is None:
        return None
    per = sends.group_by("pipe", "stage").agg(late=pl.col("late").median(), n=pl.len(),
                                              clock=pl.col("clock").mode().sort().first())
    if per.height < 3:
        return None
    table = {(r["pipe"], r["stage"]): r["late"] for r in per.iter_rows(named=True)}
    clock_of = {(r["pipe"], r["stage"]): r["clock"] for r in per.iter_rows(named=True)}
    stages = sorted({k for _, k in table})
    z = _lateness_z(table, clock_of, stages, (_step_noise(sends), 2.0 * resolution_ns, 1e-4 * step_ns))
    return (sends, z, clock_of, stages) if z else None


def _pipeline_link_records(flow: pl.DataFrame, pipes: list[list[str]]) -> pl.DataFrame | None:
    """The data records of the pipelines' stage links, or None when there are none.

    A stage's link is the one to its next stage; the last stage's, the one back to the stage before it.
    Returns the records with key (src|dst), pipe (its index in ``pipes``) and stage, sorted by key and
    start.
    """
    pos = {(p[k], p[k + 1]): (i, k) for i, p in enumerate(pipes) for k in range(len(p) - 1)}
    # the last stage sends no activations: its first gradient back, after its forward and backward of
    # the first microbatch, stands for its send (without it a slow last stage, as in a DP64 x PP2 job,
    # shows only as a whole late pipeline on its DP links, which names nobody)
    pos.update({(p[-1], p[-2]): (i, len(p) - 1) for i, p in enumerate(pipes)})
    f = flow.filter(pl.col("is_data")) if "is_data" in flow.columns else flow
    key = pl.concat_str(["src_addr", "dst_addr"], separator="|")
    keep = {f"{a}|{b}": v for (a, b), v in pos.items()}
    f = f.with_columns(key=key).filter(pl.col("key").is_in(list(keep)))
    if f.is_empty():
        return None
    f = f.with_columns(pipe=pl.col("key").replace_strict({k: v[0] for k, v in keep.items()}, return_dtype=pl.Int64),
                       stage=pl.col("key").replace_strict({k: v[1] for k, v in keep.items()}, return_dtype=pl.Int64))
    return f.sort("key", "start_ns")


def _first_sends(flow: pl.DataFrame, pipes: list[list[str]], step_ns: float,
                 clocks: dict[str, str] | None) -> pl.DataFrame | None:
    """Each pipeline's first send of each step at each stage, and how late it is against the other pipelines'.

    Takes flow src_addr, dst_addr, start_ns, end_ns (is_data, exporter where known) and ``clocks`` (exporter
    -> its clock). Returns pipe, stage, step, t (the send's start), clock, late (t less the median of the
    stage's sends in that step, on its clock where another pipeline shares it) and size (how many pipelines
    send at that stage and step), where at least three do; None when no record is on a pipeline link.
    """
    f = _pipeline_link_records(flow, pipes)
    if f is None:
        return None
    gap = pl.col("start_ns") - pl.col("end_ns").cum_max().shift(1).over("key")
    b = f.with_columns(gap=gap).filter(pl.col("gap").is_null() | (pl.col("gap") > 0.1 * step_ns))
    # the first forward send of each step only: later ones also wait for the stages after them (1F1B
    # interleaves their backward passes), the first microbatch's waits only for the stages before it.
    # Steps are counted from each stage's first send (a tenth of a step early, for jitter)
    b = b.with_columns(step=((pl.col("start_ns") - pl.col("start_ns").min().over("stage") + 0.1 * step_ns)
                             / step_ns).floor().cast(pl.Int64))
    # a send is compared only with sends timed on the same clock: exporters that share no flow keep their
    # own offsets (two rails' exporters of a DP8 x PP4 x TP8 job, 0.68 ms apart, made a whole rail's
    # pipelines read late from stage 0 in a clean job)
    clock = (pl.col("exporter").replace_strict(clocks or {}, default=pl.col("exporter"), return_dtype=pl.String)
             if "exporter" in b.columns else pl.lit(""))
    a = b.with_columns(clock=clock).group_by("pipe", "stage", "step").agg(
        t=pl.col("start_ns").min(), clock=pl.col("clock").sort_by("start_ns").first())
    own_clock = pl.len().over("stage", "step", "clock") >= 2
    return a.with_columns(late=pl.when(own_clock).then(pl.col("t") - pl.col("t").median().over("stage", "step", "clock"))
                          .otherwise(pl.col("t") - pl.col("t").median().over("stage", "step")),
                          size=pl.len().over("stage", "step")).filter(pl.col("size") >= 3)


def _step_noise(sends: pl.DataFrame) -> float:
    """How much one pipeline's send moves from step to step against its stage's median (a robust sd, ns).

    The noise a late set must clear when too few pipelines stay on time to measure their spread.
    """
    wobble = sends.group_by("pipe", "stage").agg((pl.col("late") - pl.col("late").median()).abs().median())
    return 1.4826 * float(wobble["late"].median() or 0.0)


def _lateness_z(table: dict, clock_of: dict, stages: list[int], floors: tuple[float, ...]) -> dict:
    """Each pipeline's lateness at each stage in units of the on-time pipelines' spread.

    ``table``: (pipe, stage) -> its median lateness; ``clock_of``: (pipe, stage) -> its clock; ``floors``:
    the least spread taken (step-to-step noise, clock resolution, a share of the step). Returns
    (pipe, stage) -> (robust z, lateness in ns against the on-time median), for the pipelines of a stage
    compared with at least three.
    """
    z: dict = {}
    # each pipeline against the others on its clock where there are some (a rail's exporter), else against
    # all of its stage (an exporter per host times one stage of each pipeline: an offset there moves one
    # stage, never a pipeline from one stage on, which is what a slow stage does)
    for k in stages:
        here = {p: v for (p, kk), v in table.items() if kk == k}
        count = Counter(clock_of[(p, k)] for p in here)
        # the clock a pipeline is compared on: its own where others share it, else None (all of the stage)
        on = {p: clock_of[(p, k)] if count[clock_of[(p, k)]] >= 2 else None for p in here}
        for c in set(on.values()):
            peers = {p: v for p, v in here.items() if on[p] == c}
            ref = peers if c is not None else here
            # two alone cannot tell a late one from a steady difference between them (a clean DP16 x PP2
            # job, two pipelines per rail: one read 1.9 ms late at its last stage, 1.74x its forward time)
            if len(ref) < 3:
                continue
            med, sd = on_time(np.array(sorted(ref.values()), dtype=float))
            sd = max(sd, *floors)
            for p, v in peers.items():
                z[(p, k)] = ((v - med) / sd, v - med)
    return z


def _latest_pipeline(z: dict, stages: list[int]) -> tuple[int, list[tuple]] | None:
    """The pipeline latest at the last stage read, and its (stage, z, lateness) at each stage in order; None
    when even it is no outlier there."""
    last = max(k for _, k in z)
    # ties (a TP group's pipelines late alike on a coarse clock) go to the lowest pipeline, whatever order
    # the tables came in
    worst = max(sorted(p for p, k in z if k == last), key=lambda p: z[(p, last)][0])
    row = [(k, *z[(worst, k)]) for k in stages if (worst, k) in z]
    if not row or row[-1][1] < OUTLIER_MADS:
        return None
    return worst, row


def _first_late_stage(row: list[tuple]) -> int:
    """The first stage from which the pipeline of ``row`` ((stage, z, lateness) in stage order) stays late."""
    first = row[-1][0]
    for k, zz, _ in reversed(row):
        if zz < OUTLIER_MADS:
            break
        first = k
    return first


def _late_on_own_clock(row: list[tuple], first: int, worst: int, clock_of: dict) -> bool:
    """Whether pipeline ``worst`` is late from its first stage on, all of it timed on one clock no other
    pipeline's stages from ``first`` on share: that clock's unknown offset would read the same."""
    own = {clock_of[(worst, k)] for k, _, _ in row if k >= first}
    return first == row[0][0] and len(own) == 1 and not any(
        clock_of[(p, k)] in own for (p, k) in clock_of if p != worst and k >= first)


def _unlike_one_slow_stage(row: list[tuple], first: int, lead: float) -> bool:
    """Whether a pipeline's lateness by stage (``row``: (stage, z, lateness)), ``lead`` ns from stage ``first``
    on, is no footprint of one slow stage there."""
    # lateness, once a stage brings it in, carries on to every later stage (they wait for its
    # activations); a pipeline that is later at its start than further on is late for another
    # reason (its previous step, its gradient sync) and names nobody
    if any(v < (1 - LATE_SLACK) * lead for k, _, v in row if k > first):
        return True
    # as late at an earlier stage whose spread hid it (sampled record starts are noisy): the stage that
    # brought the delay in is not known, and naming the first clear one would name the wrong worker
    if any(v >= (1 - LATE_SLACK) * lead for k, _, v in row if k < first):
        return True
    # a slow stage leaves the stages before it on time: earlier stages clearly late by part of it (a DP32 x
    # PP4 job, 1 in 1,000 packets sampled: stage 1 slowed, stages 1-2 read 9 ms late under the bar and the
    # last stage's gradient 20 ms over it) are no single slow stage's footprint
    return any(v >= LATE_SLACK * lead and zz >= 2.0 for k, zz, v in row if k < first)


def _pipelines_as_late(z: dict, worst: int, first: int, lead: float) -> list[int]:
    """The other pipelines as late as ``worst`` (``lead`` ns) at stage ``first``, sorted."""
    # "as late" is judged by lateness, not by the outlier bar alone: a slow worker in a tensor-parallel
    # group delays every pipeline of the group by the same time, and with a coarse clock only one of them
    # may clear the bar (a DP32 x PP2 x TP8 job, millisecond clock: eight pipelines 9-13 ms late, one past
    # 6 robust sd)
    return sorted(pp for (pp, k), (zz, v) in z.items()
                  if k == first and pp != worst and (zz >= OUTLIER_MADS
                                                     or (zz >= OUTLIER_MADS / 2 and v >= (1 - LATE_SLACK) * lead)))


def _forward_time(sends: pl.DataFrame, late_pipes: list[int], stage: int) -> float:
    """A stage's forward time in the pipelines that keep time (ns; 0 when none is measured).

    The gap from the previous stage's first send to its own, in the pipelines not in ``late_pipes``; for
    stage 0, or a stage with no such gap, the other stages' median.
    """
    a = sends.sort("pipe", "step", "stage").with_columns(inc=pl.col("t") - pl.col("t").shift(1).over("pipe", "step"),
                                                        prev=pl.col("stage") - pl.col("stage").shift(1).over("pipe", "step"))
    inc = a.filter(~pl.col("pipe").is_in(late_pipes) & (pl.col("prev") == 1) & (pl.col("inc") > 0))
    own = inc.filter(pl.col("stage") == stage)["inc"]
    return float(own.median()) if own.len() else (float(inc["inc"].median()) if inc.height else 0.0)


def _named_or_ambiguous(out: dict, z: dict, pipes: list[list[str]], late: list[int], first: int) -> dict:
    """The slow-worker finding ``out`` for the first of the ``late`` pipelines, as it stands, or, where flows
    cannot tell which worker is slow, the late pipelines' ``members`` and why nobody is named."""
    if first == len(pipes[late[0]]) - 1 and max(_upstream_late(z, p, first) for p in late) >= UPSTREAM_LATE_Z:
        # the last stage is read from its first gradient back, which follows the forwards it runs first:
        # one under 1F1B, every micro-batch's under GPipe, whose arrivals an earlier slow stage delays each
        # time. So a pipeline late from an earlier stage on by less than the bar shows at the last stage
        # multiplied (slow workers at stages 1, 2 and 6, 1-10 ms late from there on, read 13-118 ms late
        # at the last stage): naming the last stage would name the wrong worker
        members = sorted({x for p in late for x in pipes[p]})
        return {**out, "kind": "late_pipelines", "culprit": None, "pipeline": None, "members": members,
                "ambiguous": _why_late_only_at_last_stage(out["late_ns"])}
    if len(late) > 1:
        at = sorted(pipes[p][first] for p in late)
        return {**out, "kind": "late_pipelines", "culprit": None, "pipeline": None, "members": at, "one_of": at,
                "ambiguous": _why_pipelines_as_late(len(late), first)}
    return out


# The findings' sentences: why nobody is named (golden reports compare them byte for byte).

_WHY_LATE_PIPELINE = ("members of one pipeline open their DP links off the other pipelines' (late, or a step phase "
                      "early): a slow stage shifts the pipeline's whole backward pass, so flows cannot tell which one "
                      "is slow")
_WHY_LATE_LINKS = "several endpoints open their DP links late, in no pattern one slow endpoint makes"


def _why_late_tp_group(n: int) -> str:
    return (f"{n} endpoints, one in each of {n} DP groups, open their links equally late: one slow worker of a "
            "tensor-parallel group (or a cause they share) delays all of them, so flows cannot tell which")


def _why_late_only_at_last_stage(late_ns: float) -> str:
    return (f"the pipeline is clearly late only at its last stage's first gradient ({late_ns / 1e6:.1f} ms), "
            "and slightly late from an earlier stage on: a slow last stage, or an earlier one whose delay adds "
            "up over the micro-batches the last stage runs forward before its first backward (GPipe), so flows "
            "cannot tell which")


def _why_pipelines_as_late(n: int, first: int) -> str:
    return (f"{n} pipelines are as late from stage {first}: one slow worker of a tensor-parallel group (or a "
            "cause they share) delays all of them, so flows cannot tell which")
