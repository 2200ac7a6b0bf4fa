"""Stragglers from switch flow records alone: a slow link or NIC, and a slow endpoint.

Both are read off the data-parallel links of the inferred strategy (links
between members of one DP group), whose traffic every step is the same
collective moving the same bytes:

- *slow link / NIC*: each link's payload rate (bytes over the time its
  payload records were open). A NIC that runs slow drags every DP link it
  sends or receives on; a bad cable only the one link. The endpoint (or link)
  whose rate sits far below the job's spread of link rates is named, with the
  step time its extra transfer time costs (verdict ``communication``).
- *slow endpoint*: a worker that computes slowly finishes its backward pass
  late, so its DP ring link opens late in every step while its ring peers'
  open on time (their first chunk is their own); over RoCE the link into it
  opens late too (the sender writes only into buffers it has posted). The
  endpoint that sends and receives on the late links (or sends on the one
  late link) is named (verdict ``worker``).

A slow NIC or cable usually throttles its whole ring, not one link: every
link of its DP group then runs at the same low rate, and its group stands
out only against the job's *other* DP groups (other pipeline stages, other
TP ranks' rings). The member is then named from its links outside the ring
(pipeline sends and receives, which only it of its group shares with the
slow NIC); a pure pipeline job is read the same way off its pipeline links.
When the evidence cannot single out one address the finding is reported as
ambiguous (the group and its factor) and nobody is named.

Link rates are judged only where they are measured: a record that spans
more than a step holds idle time, and with packet sampling a rate counted
from k sampled packets is uncertain by about 1/sqrt(k).

S is estimated as step / (step - cost); the verdict is ``none`` below
``none_below`` (the contract's 1.05), the finding is listed either way.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.diagnosis import Steps, Stragglers, Strategy
from rankscope.analysis.flow_features import on_pairs
from rankscope.analysis.flow_models import TWO_WAY
from rankscope.analysis.timelines import union_ns

OUTLIER_MADS = 6.0
"""a rate (or a lateness) is an outlier when it lies this many robust standard deviations from the median."""
SLOW_FACTOR = 1.5
"""a group's or endpoint's links count as slow only when their peers run at least this much faster: DP
groups (and pipeline links) that carry different collectives differ by some tens of per cent when
records hold compute gaps, so a smaller difference is no evidence of a fault."""
PEER_BYTES = 1.25
"""a DP ring is a peer of a slower ring only if its links cut their bytes into at most this factor as
many records (one-sided: fewer, longer records can hold the gap between two collectives and read slow,
but a slow ring's transfers outlast the exporter's active timeout and are cut into more); a pipeline
link holds the usual bytes per record within this factor."""
PEER_VOLUME = 2.0
"""and when their links move bytes within this factor of each other: each stage's ring moves its stage's
gradients, and the first and last stages also hold the embedding and the output layer (the two stages of
real gloo DP2 x PP2 jobs moved 1.13x and 1.25-1.3x each other's bytes, tests/data/netns_gloo)."""
LATE_SLACK = 0.25
"""a later stage may absorb at most this share of a slow stage's lateness (jitter, its own bubble)."""
RING_GAP = 0.01
"""a link or NIC is named within its ring only when it runs at least this share below the ring's other
links: healthy links of one ring differ by a fraction of a per cent (clock ticks, per-record jitter)."""
MIN_PACKETS = 30
"""a link's rate counts only with at least this many exported (sampled) packets: ~18 % error."""


def _group_of(strategy: Strategy) -> dict:
    return {x: i for i, g in enumerate(strategy.dp_groups or []) if len(g) > 1 for x in g}


def _dp_links(flow: pl.DataFrame, strategy: Strategy, pairs: frozenset = frozenset()) -> pl.DataFrame:
    """Payload records between members of one DP group (only on ``pairs``, the collectives' own links,
    when given), with the group as ``g``."""
    group = _group_of(strategy)
    if not group or flow.is_empty():
        return flow.head(0)
    f = flow.filter(pl.col("is_data")) if "is_data" in flow.columns else flow
    gs = pl.col("src_addr").replace_strict(group, default=-1, return_dtype=pl.Int64)
    gd = pl.col("dst_addr").replace_strict(group, default=-2, return_dtype=pl.Int64)
    f = f.with_columns(g=gs).filter(pl.col("g") == gd)
    return on_pairs(f, pairs) if pairs else f


def _robust(x: np.ndarray) -> tuple[float, float]:
    med = float(np.median(x))
    return med, float(1.4826 * np.median(np.abs(x - med)))


def link_rates(flow: pl.DataFrame, strategy: Strategy, step_ns: float, resolution_ns: int) -> pl.DataFrame:
    """Payload rate of every directed link between the job's endpoints, and how well it is measured.

    Columns src_addr, dst_addr, g (the DP group both ends share, else -1), b (bytes), d (open time, summed
    over records), busy (wall time some record was open), n (records), rb (its typical record's bytes: the
    bytes-weighted mean, so that a short record the exporter cut off a transfer's tail does not halve it),
    vol (all its payload bytes, records of any length), pk (exported packets), rate, noise (relative sd of
    the rate), trusted. Records shorter than ten clock ticks have no measurable rate; records longer than
    a step hold idle time (the exporter's timeouts let them run over several steps) and measure the job's
    duty cycle, not the link.
    Needs flow src_addr, dst_addr, est_bytes, start_ns, end_ns; is_data, num_packets, sampling_rate if known.
    """
    f = flow.filter(pl.col("is_data")) if "is_data" in flow.columns else flow
    vol = f.group_by("src_addr", "dst_addr").agg(vol=pl.col("est_bytes").sum())
    f = f.with_columns(d=(pl.col("end_ns") - pl.col("start_ns"))).filter(pl.col("d") >= 10 * resolution_ns)
    if step_ns:
        f = f.filter(pl.col("d") <= step_ns)
    sampled = "sampling_rate" in f.columns and "num_packets" in f.columns
    pk = pl.col("num_packets").fill_null(0) if sampled else pl.lit(0)
    rate = pl.col("sampling_rate").fill_null(1).clip(lower_bound=1) if sampled else pl.lit(1)
    links = f.group_by("src_addr", "dst_addr").agg(
        b=pl.col("est_bytes").sum(), b2=(pl.col("est_bytes") ** 2).sum(), d=pl.col("d").sum(), n=pl.len(),
        pk=pk.sum(), smp=(rate > 1).any())
    # wall time some record of the link was open: its connections (one per queue pair or rank) run side
    # by side and their open times overlap
    link = ["src_addr", "dst_addr"]
    links = links.join(union_ns(f.select(*link, "start_ns", "end_ns"), link).rename({"union_ns": "busy"}), on=link)
    group = _group_of(strategy)
    gs = pl.col("src_addr").replace_strict(group, default=-1, return_dtype=pl.Int64)
    gd = pl.col("dst_addr").replace_strict(group, default=-2, return_dtype=pl.Int64)
    # each record's open time is rounded to a clock tick at each end (sd ~0.41 tick); with 1-in-N
    # sampling a link's bytes and open time come from its pk sampled packets (sd ~1/sqrt(pk))
    tick = 0.41 * resolution_ns * pl.col("n").sqrt() / pl.col("d")
    smp = pl.when(pl.col("smp")).then(1.0 / pl.col("pk").clip(lower_bound=1).sqrt()).otherwise(0.0)
    return links.with_columns(
        g=pl.when(gs == gd).then(gs).otherwise(-1), rate=pl.col("b") / pl.col("d"), rb=pl.col("b2") / pl.col("b"),
        noise=(tick ** 2 + smp ** 2).sqrt(),
        trusted=~pl.col("smp") | (pl.col("pk") >= MIN_PACKETS)).filter(pl.col("b") > 0).join(
        vol, on=["src_addr", "dst_addr"], how="left")


def _extra_per_step(sel: pl.DataFrame, ref_rate: float, num_steps: int) -> float:
    """Wall time per step the links were busy beyond what the reference rate needs for their bytes
    (their busy time less the share the faster rate saves; not the records' summed open time, which
    counts parallel connections once each)."""
    saved = (sel["busy"] * (1 - sel["rate"] / ref_rate)).clip(lower_bound=0)
    return float(saved.max()) / max(num_steps, 1)


def slow_links(links: pl.DataFrame, num_steps: int) -> dict | None:
    """The endpoint (slow NIC) or directed link whose DP payload rate is an outlier within its ring, or None.

    A slow member throttles its whole ring (chunks are pipelined round it), so the ring's links all
    slow down; the member itself is the one whose sending *and* receiving links are both at the
    ring's lowest rate (its neighbours have one each). A whole ring at one rate names nobody here
    (see slow_group). Needs link_rates' columns.
    """
    # with packet sampling a record opens and closes at sampled packets: rates within one ring were
    # seen to differ by 1.6x on a healthy sampled capture, so a ring's links are compared only unsampled
    dp = links.filter((pl.col("g") >= 0) & ~pl.col("smp"))
    if dp.height < 3:
        return None
    lr = np.log(dp["rate"].to_numpy())
    med, sd = _robust(lr)
    # rates that agree to the digit still jitter by a few per cent, and sampled rates by their noise
    sd = max(sd, 0.05, float(np.median(dp["noise"].to_numpy())))
    dp = dp.with_columns(z=pl.Series((lr - med) / sd))
    dp = dp.with_columns(at_min=pl.col("rate") <= pl.col("rate").min().over("g") * (1 + 3 * pl.col("noise")))
    found = []
    for _, gl in dp.group_by("g"):
        if gl["z"].min() >= -OUTLIER_MADS:
            continue
        low = gl.filter(pl.col("at_min"))
        ends = pl.concat([low.select(x="src_addr"), low.select(x="dst_addr")]).group_by("x").len()
        both = ends.filter(pl.col("len") >= 2)["x"].to_list()
        if len(both) == 1:
            culprit, kind = both[0], "slow_nic"
            sel = low.filter((pl.col("src_addr") == culprit) | (pl.col("dst_addr") == culprit))
        elif low.height == 1:
            culprit, kind, sel = low["src_addr"][0], "slow_link", low
        else:
            continue  # the whole group at one rate: a slow path or a slow group, nobody to name
        # the named links must stand apart from the rest of their ring, not merely be its lowest: in a
        # ring slowed as a whole, links jitter by a per cent or so and some two always come lowest
        rest = gl.join(sel.select("src_addr", "dst_addr"), on=["src_addr", "dst_addr"], how="anti")
        if rest.height >= 2:
            rl = np.log(rest["rate"].to_numpy())
            r_med, r_sd = _robust(rl)
            # (the plain sd too: a median of absolute deviations of a few links can be near 0 by chance)
            r_sd = max(r_sd, float(np.std(rl, ddof=1)), float(np.median(gl["noise"].to_numpy())))
            if r_med - float(np.log(sel["rate"].max())) < max(OUTLIER_MADS * r_sd, np.log1p(RING_GAP)):
                continue
        found.append({"kind": kind, "culprit": culprit, "factor": round(float(np.exp(med) / sel["rate"].min()), 3),
                      "extra_ns": _extra_per_step(sel, float(np.exp(med)), num_steps),
                      "links": [[r["src_addr"], r["dst_addr"]] for r in sel.iter_rows(named=True)]})
    return max(found, key=lambda x: x["extra_ns"]) if found else None


def _slow_endpoints(other: pl.DataFrame) -> tuple[set, dict]:
    """Endpoints all of whose (trusted) links outside DP rings run SLOW_FACTOR below those links' median,
    and that median; other links are pipeline sends and receives."""
    if other.height >= 3:
        # links whose records hold the usual bytes (see slow_group: bigger records hold gaps too)
        bpr = other["rb"].to_numpy()
        other = other.filter(pl.Series(np.abs(np.log(bpr / np.median(bpr))) <= np.log(PEER_BYTES)))
    if other.height < 3:
        return set(), {}
    lr = np.log(other["rate"].to_numpy())
    med, sd = _robust(lr)
    sd = max(sd, 0.05, float(np.median(other["noise"].to_numpy())))
    cut = med - max(np.log(SLOW_FACTOR), OUTLIER_MADS * sd)
    o = other.with_columns(slow=pl.Series(lr < cut))
    ends = pl.concat([o.select(x="src_addr", slow="slow"), o.select(x="dst_addr", slow="slow")])
    per = ends.group_by("x").agg(all_slow=pl.col("slow").all(), n=pl.len())
    return set(per.filter(pl.col("all_slow"))["x"].to_list()), {"median_rate": float(np.exp(med)), "cut": float(np.exp(cut))}


def slow_group(links: pl.DataFrame, strategy: Strategy, num_steps: int) -> dict | None:
    """A DP group whose ring runs SLOW_FACTOR below the job's other DP groups, and its slow member if the
    links outside the ring single one out; or, with no DP rings (pure pipeline), the one endpoint whose
    pipeline links are all slow. ``culprit`` is None when the evidence cannot decide (``ambiguous``).
    Needs link_rates' columns.
    """
    t = links.filter(pl.col("trusted"))
    dp, other = t.filter(pl.col("g") >= 0), t.filter(pl.col("g") < 0)
    slow_ends, other_stats = _slow_endpoints(other)
    # records per link counted by their bytes (b / rb): a cut-off tail counts for little
    groups = dp.group_by("g").agg(lr=pl.col("rate").log().median(), vol=pl.col("vol").median(),
                                  recs=(pl.col("b") / pl.col("rb")).median(), n=pl.len()).sort("lr")
    if groups.height >= 2:
        # a ring is compared only with rings that move about the same bytes (the same collective: other
        # TP ranks' rings, the other stages' gradients; small or latency-bound collectives run slower by
        # design) in no fewer records: a record that holds two collectives (an exporter with a longer idle
        # timeout) measures the gap between them as well. More records are no objection: the slow ring's
        # own transfers last longer and the exporter's active timeout cuts them more often (a DP8xPP4xTP2
        # RoCE job: 44 records a link on the slow ring, 33 on its peers)
        lrs, vols, recs = groups["lr"].to_numpy(), groups["vol"].to_numpy(), groups["recs"].to_numpy()
        peers = ((np.abs(np.log(vols / vols[0])) <= np.log(PEER_VOLUME))
                 & (recs <= recs[0] * PEER_BYTES))
        peers[0] = False
        if not peers.any():
            return None
        g0, lr0 = int(groups["g"][0]), float(lrs[0])
        rest = lrs[peers]
        ref, sd = _robust(rest) if len(rest) >= 2 else (float(rest[0]), 0.0)
        sd = max(sd, 0.05)
        if ref - lr0 < max(np.log(SLOW_FACTOR), OUTLIER_MADS * sd):
            return None
        members = sorted(strategy.dp_groups[g0])
        cands = sorted(x for x in members if x in slow_ends)
        sel = dp.filter(pl.col("g") == g0)
        out = {"factor": round(float(np.exp(ref - lr0)), 3), "extra_ns": _extra_per_step(sel, float(np.exp(ref)), num_steps),
               "group": g0, "members": members, "group_rates": {str(int(g)): round(float(np.exp(v)), 3) for g, v
                                                              in zip(groups["g"], groups["lr"])},
               "outside_ring": {**other_stats, "slow_members": cands}}
        if len(cands) == 1:
            x = cands[0]
            mine = other.filter((pl.col("src_addr") == x) | (pl.col("dst_addr") == x))
            return {**out, "kind": "slow_nic", "culprit": x,
                    "links": [[r["src_addr"], r["dst_addr"]] for r in mine.iter_rows(named=True)]}
        why = ("no member of the slow ring has measured links outside it" if not other.height else
               f"{len(cands)} members of the slow ring are also slow outside it" if cands else
               "no member of the slow ring is slow outside it")
        return {**out, "kind": "slow_group", "culprit": None, "ambiguous": why, "links": []}
    if dp.height or len(slow_ends) != 1:
        return None
    # a pure pipeline: the one endpoint whose every pipeline link is slow (its neighbours keep a fast one)
    x = next(iter(slow_ends))
    mine = other.filter((pl.col("src_addr") == x) | (pl.col("dst_addr") == x))
    if mine.height < 2:
        return None
    ref = other_stats["median_rate"]
    return {"kind": "slow_nic", "culprit": x, "factor": round(float(ref / mine["rate"].max()), 3),
            "extra_ns": _extra_per_step(mine, ref, num_steps), "outside_ring": other_stats,
            "links": [[r["src_addr"], r["dst_addr"]] for r in mine.iter_rows(named=True)]}


def late_senders(dp: pl.DataFrame, step_ns: float, resolution_ns: int,
                 pipelines: list[list[str]] | None = None) -> dict | None:
    """The endpoint whose DP links open consistently late in its group, or None.

    Needs dp src_addr, dst_addr, g (group), start_ns, end_ns. A burst starts after an idle gap longer
    than a tenth of a step since the link's previous record ended (a record the active timeout cut
    off is followed at once by the next, whose start carries no phase); its lateness is measured
    against the median start of its group's bursts in the same step (the collective's start). A ring
    member's first chunk is its own, so a member that arrives late opens its link to the next member
    late, and over RoCE also the link from the previous one (whose writes wait for its posted
    buffers): the culprit is the endpoint that both sends and receives on late links, or the sender
    of the one late link. A slow worker delays its whole pipeline's backward pass: when several
    endpoints fit (a late pipeline), the finding is ``ambiguous`` and nobody is named.
    """
    if dp.is_empty() or not step_ns:
        return None
    link = ["src_addr", "dst_addr"]
    f = dp.select(*link, "g", "start_ns", "end_ns", "est_bytes").sort(*link, "start_ns")
    # only directions that carry payload: a ring link's other side holds acknowledgements and set-up
    vol = f.group_by(link).agg(v=pl.col("est_bytes").sum())
    vol = vol.join(vol.rename({"src_addr": "dst_addr", "dst_addr": "src_addr", "v": "back"}), on=link, how="left")
    payload = vol.filter(pl.col("v") >= TWO_WAY * pl.col("back").fill_null(0.0)).select(link)
    f = f.join(payload, on=link, how="semi").sort(*link, "start_ns")
    gap = pl.col("start_ns") - pl.col("end_ns").cum_max().shift(1).over(link)
    bursts = f.with_columns(gap=gap).filter(pl.col("gap").is_null() | (pl.col("gap") > 0.1 * step_ns))
    bursts = bursts.with_columns(step=((pl.col("start_ns") - pl.col("start_ns").min()) / step_ns).round().cast(pl.Int64))
    late = bursts.with_columns(late=pl.col("start_ns") - pl.col("start_ns").median().over(["g", "step"]))
    per = late.group_by(link).agg(late=pl.col("late").median(), n=pl.len())
    if per.height < 3:
        return None
    x = per["late"].to_numpy().astype(float)
    med, sd = _robust(x)
    sd = max(sd, 20.0 * resolution_ns)
    # a collective's link carries payload every step; one that bursts in fewer than half of them
    # (connection set-up, the acknowledgement side of a ring link) has no arrival to be late for
    steady = max(2, int(late["step"].n_unique()) // 2)
    bad = per.filter(((pl.col("late") - med) / sd >= OUTLIER_MADS) & (pl.col("n") >= steady))
    if bad.is_empty():
        return None
    senders, receivers = set(bad["src_addr"].to_list()), set(bad["dst_addr"].to_list())
    cands = sorted(senders & receivers) or sorted(senders)
    worst = bad.filter(pl.col("src_addr").is_in(cands)).sort("late", descending=True).row(0, named=True)
    out = {"kind": "slow_worker", "culprit": worst["src_addr"], "extra_ns": float(worst["late"] - med),
           "late_ns": float(worst["late"] - med), "robust_sd_ns": sd,
           "late_links": [[r["src_addr"], r["dst_addr"]] for r in bad.iter_rows(named=True)]}
    if len(cands) == 1:
        return out
    mates = next((p for p in pipelines or [] if set(cands) <= set(p) and len(p) > 1), None)
    why = ("several members of one pipeline open their DP links late: a slow stage delays the pipeline's "
           "whole backward pass, so flows cannot tell which one is slow") if mates else \
        "several endpoints open their DP links late, in no pattern one slow endpoint makes"
    return {**out, "kind": "late_pipeline" if mates else "late_links", "culprit": None, "members": cands,
            "ambiguous": why}


def late_stage(flow: pl.DataFrame, strategy: Strategy, step_ns: float, resolution_ns: int) -> dict | None:
    """The endpoint whose pipeline's forward sends fall behind from its stage on, or None.

    A slow worker's ring links open late only where their records split at steps, and in a pipeline
    its whole backward pass is late (several late members, nobody named); its pipeline's activations
    tell which stage brought the delay in. Each pipeline's first forward send of a burst from stage k
    is compared with the same stage's send in the other pipelines (DP replicas, which start each step
    together after the previous gradient sync): a slow stage s delays its own sends and every later
    stage's, not the earlier ones, so the culprit is the first stage from which its pipeline stays
    late. Needs at least three pipelines with a known stage order; flow src_addr, dst_addr,
    start_ns, end_ns (is_data if known).
    """
    pipes = [p for p in strategy.pp_groups or [] if len(p) > 1]
    if len(pipes) < 3 or not step_ns or not (strategy.extra or {}).get("stage_order_known", False):
        return None
    pos = {(p[k], p[k + 1]): (i, k) for i, p in enumerate(pipes) for k in range(len(p) - 1)}
    f = flow.filter(pl.col("is_data")) if "is_data" in flow.columns else flow
    key = pl.concat_str(["src_addr", "dst_addr"], separator="|")
    keep = {f"{a}|{b}": v for (a, b), v in pos.items()}
    f = f.with_columns(key=key).filter(pl.col("key").is_in(list(keep)))
    if f.is_empty():
        return None
    f = f.with_columns(pipe=pl.col("key").replace_strict({k: v[0] for k, v in keep.items()}, return_dtype=pl.Int64),
                       stage=pl.col("key").replace_strict({k: v[1] for k, v in keep.items()}, return_dtype=pl.Int64))
    f = f.sort("key", "start_ns")
    gap = pl.col("start_ns") - pl.col("end_ns").cum_max().shift(1).over("key")
    b = f.with_columns(gap=gap).filter(pl.col("gap").is_null() | (pl.col("gap") > 0.1 * step_ns))
    # the first forward send of each step only: later ones also wait for the stages after them (1F1B
    # interleaves their backward passes), the first microbatch's waits only for the stages before it.
    # Steps are counted from each stage's first send (a tenth of a step early, for jitter)
    b = b.with_columns(step=((pl.col("start_ns") - pl.col("start_ns").min().over("stage") + 0.1 * step_ns)
                             / step_ns).floor().cast(pl.Int64))
    a = b.group_by("pipe", "stage", "step").agg(t=pl.col("start_ns").min())
    a = a.with_columns(late=pl.col("t") - pl.col("t").median().over("stage", "step"),
                       size=pl.len().over("stage", "step")).filter(pl.col("size") >= 3)
    per = a.group_by("pipe", "stage").agg(late=pl.col("late").median(), n=pl.len())
    if per.height < 3:
        return None
    table = {(r["pipe"], r["stage"]): r["late"] for r in per.iter_rows(named=True)}
    stages = sorted({k for _, k in table})
    z: dict = {}
    for k in stages:
        x = np.array([v for (p, kk), v in table.items() if kk == k], dtype=float)
        if len(x) < 3:
            continue
        med, sd = _robust(x)
        sd = max(sd, 2.0 * resolution_ns, 1e-4 * step_ns)
        for (p, kk), v in table.items():
            if kk == k:
                z[(p, k)] = ((v - med) / sd, v - med)
    if not z:
        return None
    last = max(k for _, k in z)
    worst = max((p for p, k in z if k == last), key=lambda p: z[(p, last)][0])
    row = [(k, *z[(worst, k)]) for k in stages if (worst, k) in z]
    if not row or row[-1][1] < OUTLIER_MADS:
        return None
    # the first stage from which the pipeline stays late
    first = row[-1][0]
    for k, zz, _ in reversed(row):
        if zz < OUTLIER_MADS:
            break
        first = k
    lead = z[(worst, first)][1]
    # lateness, once a stage brings it in, carries on to every later stage (they wait for its
    # activations); a pipeline that is later at its start than further on is late for another
    # reason (its previous step, its gradient sync) and names nobody
    if any(v < (1 - LATE_SLACK) * lead for k, _, v in row if k > first):
        return None
    # as late at an earlier stage whose spread hid it (sampled record starts are noisy): the stage that
    # brought the delay in is not known, and naming the first clear one would name the wrong worker
    if any(v >= (1 - LATE_SLACK) * lead for k, _, v in row if k < first):
        return None
    # its forward time against the same stage's in the other pipelines (the gap from the previous
    # stage's first send to its own; for stage 0, the other stages' median): the worker's compute
    # factor. A slow stage paces its pipeline, and the gradient sync the whole job, so S ~ that factor.
    a = a.sort("pipe", "step", "stage").with_columns(inc=pl.col("t") - pl.col("t").shift(1).over("pipe", "step"),
                       prev=pl.col("stage") - pl.col("stage").shift(1).over("pipe", "step"))
    # other pipelines as late at that stage: no single slow stage. "As late" is judged by lateness, not
    # by the outlier bar alone: a slow worker in a tensor-parallel group delays every pipeline of the
    # group by the same time, and with a coarse clock only one of them may clear the bar (a DP32 x PP2 x
    # TP8 job, millisecond clock: eight pipelines 9-13 ms late, one past 6 robust sd)
    mates = sorted(pp for (pp, k), (zz, v) in z.items()
                   if k == first and pp != worst and (zz >= OUTLIER_MADS
                                                      or (zz >= OUTLIER_MADS / 2 and v >= (1 - LATE_SLACK) * lead)))
    inc = a.filter(~pl.col("pipe").is_in([worst, *mates]) & (pl.col("prev") == 1) & (pl.col("inc") > 0))
    own = inc.filter(pl.col("stage") == first)["inc"]
    fwd = float(own.median()) if own.len() else (float(inc["inc"].median()) if inc.height else 0.0)
    late = float(lead)
    factor = 1.0 + late / fwd if fwd > 0 else None
    out = {"kind": "slow_worker", "culprit": pipes[worst][first],
           "extra_ns": float(step_ns * (1 - 1 / factor)) if factor else late,
           "factor": round(factor, 3) if factor else None, "forward_ns": fwd,
           "late_ns": late, "stage": int(first), "pipeline": pipes[worst],
           "late_by_stage_ns": {str(k): round(float(v), 1) for k, _, v in row}}
    if mates:
        return {**out, "kind": "late_pipelines", "culprit": None, "pipeline": None,
                "members": sorted(pipes[p][first] for p in [worst, *mates]),
                "ambiguous": f"{len(mates) + 1} pipelines are as late from stage {first}: one slow worker of a "
                             "tensor-parallel group (or a cause they share) delays all of them, so flows cannot "
                             "tell which"}
    return out


def _slow_group_if_tied(flow: pl.DataFrame, strategy: Strategy, steps: Steps, resolution_ns: int) -> dict | None:
    """slow_group under the labellings as good as the reported one (a 2 x 2 grid over TCP), or None: a real
    gloo DP2 x PP2 job with a slow NIC on stage 1 was reported with the DP/PP swap first."""
    if not (strategy.extra or {}).get("ambiguous"):
        return None
    for k, alt in enumerate((strategy.extra or {}).get("alternatives") or []):
        other = Strategy(dp=alt.get("dp", 1), pp=alt.get("pp", 1), dp_groups=alt.get("dp_groups") or [])
        if not other.dp_groups:
            continue
        x = slow_group(link_rates(flow, other, float(steps.median_ns), resolution_ns), other, steps.count)
        if x:
            return {**x, "labelling": f"alternatives[{k}]", "labelling_note": "read in an alternative "
                    "labelling that fits as well as the reported one: its members are the slow ring's either way"}
    return None


def _brief(x: dict) -> dict:
    """A finding under the report's bar, as evidence: who (or which group), how late or slow, and whether
    its cost is only a lower bound (no forward time to set a late send against: a two-stage pipeline)."""
    keep = ("kind", "culprit", "members", "stage", "factor", "late_ns", "extra_ns", "ambiguous")
    out = {k: x[k] for k in keep if k in x}
    if x.get("kind") in ("slow_worker", "late_pipelines") and x.get("factor") is None:
        out["cost"] = "a lower bound: the lateness of the first send, with no forward time to set it against"
    return out


def _slowdown(x: dict, step: float) -> float:
    return round(step / (step - min(x["extra_ns"], 0.9 * step)), 4)


def flow_straggler_section(flow: pl.DataFrame, strategy: Strategy, steps: Steps, resolution_ns: int = 1,
                           none_below: float = 1.05, dp_pairs: frozenset = frozenset()) -> Stragglers:
    """Straggler section of a flows-only report (see module doc).

    Needs flow (aligned) src_addr, dst_addr, est_bytes or size_bytes, start_ns, end_ns and is_data,
    num_packets, sampling_rate if known; the inferred strategy's dp_groups, pp_groups and the step time;
    ``dp_pairs``: the heavy pairs labelled data-parallel (FlowInference.dp_pairs), whose links alone are
    read for late arrivals.
    """
    if "est_bytes" not in flow.columns:
        rate = pl.col("sampling_rate").fill_null(1).clip(lower_bound=1) if "sampling_rate" in flow.columns else 1
        flow = flow.with_columns(est_bytes=(pl.col("size_bytes") * rate).cast(pl.Float64))
    step = float(steps.median_ns or 0.0)
    if flow.is_empty() or not step:
        return Stragglers(extra={"basis": "flows", "evaluated": False,
                                 "why": "no step time from flows: link rates and lateness need one"})
    links = link_rates(flow, strategy, step, resolution_ns)
    base = {"basis": "flows", "evaluated": True,
            "link_rates": {"links": int(links.height), "trusted": int(links["trusted"].sum()) if links.height else 0,
                           "dp_links": int((links["g"] >= 0).sum()) if links.height else 0,
                           "min_packets": MIN_PACKETS, "slow_factor": SLOW_FACTOR}}
    if links.height and not links["trusted"].any():
        base["link_rates"]["why"] = f"every link holds fewer than {MIN_PACKETS} sampled packets"
    dp = _dp_links(flow, strategy, dp_pairs)
    # late ring sends: in a tree all-reduce a member sends up only once its children's data arrived, so
    # its sends are late by design; and lateness needs the steps where they are. A period that may be a
    # whole multiple of the step (the exporter hid some steps) still groups whole steps: a late member's
    # links open late in each of them against its group's, so only a period that does not repeat
    # clearly keeps lateness out
    kinds = (strategy.extra or {}).get("dp_group_kinds")
    rings = kinds is None or set(kinds) <= {"ring", "pair"}
    weak = bool(steps.extra.get("period_weak"))
    late = late_senders(dp, step, resolution_ns, strategy.pp_groups) if rings and not weak else None
    base["late_dp_links"] = (
        "not evaluated: in a tree all-reduce members send up only once their children's data arrived"
        if not rings else "not evaluated: the traffic does not repeat clearly at the step time found" if weak
        else "no DP link opens consistently late" if late is None else late["kind"])
    if late is None or not late.get("culprit"):
        late = late_stage(flow, strategy, step, resolution_ns) or late
    # what the flows could not check, so that a verdict "none" is not read as "no straggler"
    unread = {}
    if late is None and base["late_dp_links"].startswith("not evaluated"):
        unread["worker"] = base["late_dp_links"].removeprefix("not evaluated: ")
    if "why" in base["link_rates"] or not links.height:
        unread["communication"] = base["link_rates"].get("why", "no link between the job's endpoints has a rate")
    if unread:
        base["not_evaluated"] = unread
    cands = [slow_links(links, steps.count), slow_group(links, strategy, steps.count), late]
    if not any(cands[:2]):
        cands.append(_slow_group_if_tied(flow, strategy, steps, resolution_ns))
    found = [x for x in cands if x and x.get("culprit")]
    ambiguous = [x for x in cands if x and not x.get("culprit")]
    if ambiguous:
        base["ambiguous_flows"] = [{k: v for k, v in x.items() if k != "links"} for x in ambiguous]
    if not found:
        # evidence that a ring or a TP group's pipelines are slow but not who: the cause is reported,
        # nobody is named
        slow = [x for x in ambiguous if x["kind"] in ("slow_group", "late_pipelines")]
        x = max(slow, key=lambda y: y["extra_ns"], default=None)
        if x is None:
            return Stragglers(extra={**base, "findings_flows": []})
        if _slowdown(x, step) < none_below:
            return Stragglers(slowdown=_slowdown(x, step), verdict="none",
                              extra={**base, "findings_flows": [], "below_threshold": [_brief(x)]})
        s = _slowdown(x, step)
        if x["kind"] == "slow_group":
            cause, who = "communication", {"group_id": x["group"], "ranks": x["members"], "transfer_ratio": x["factor"],
                                           **({"labelling": x["labelling"]} if "labelling" in x else {})}
        else:
            cause, who = "worker", {"ranks": x["members"], "factor": x["factor"], "stage": x["stage"],
                                    "factor_vs": "the same stage's forward time in the other pipelines",
                                    "ambiguous": x["ambiguous"]}
        return Stragglers(slowdown=s, verdict=cause, by_cause={cause: 1.0}, top_workers=[],
                          waste_fraction=round(1 - 1 / s, 4),
                          extra={**base, "findings_flows": [], "steps": [], "culprits": {cause: who}})
    best = max(found, key=lambda x: x["extra_ns"])
    s = _slowdown(best, step)
    cause = "communication" if best["kind"] in ("slow_nic", "slow_link") else "worker"
    if s < none_below:
        # too small to matter: listed as evidence, nobody named (a clean job's member that opens its
        # ring link 2 ms late in a 3.4 s step is no culprit)
        return Stragglers(slowdown=s, verdict="none",
                          extra={**base, "findings_flows": [], "below_threshold": [_brief(x) for x in found]})
    verdict = cause
    top = [{"endpoint": x["culprit"], "slowdown": _slowdown(x, step), "kind": x["kind"]}
           for x in sorted(found, key=lambda x: -x["extra_ns"])]
    # the evidence in the shape the findings read (culprits are addresses: flows know no ranks)
    ev: dict = {"slow_links": [], "slow_ranks": []}
    culprits: dict = {}
    for x in found:
        f = _slowdown(x, step)
        if x["kind"] == "slow_worker":
            ev["slow_ranks"].append({"rank": x["culprit"], "factor": f, "steps": []})
            culprits.setdefault("worker", {"rank": x["culprit"], "factor": f, "factor_vs": "its DP group's senders"})
        else:
            ev["slow_links"].append({"rank": x["culprit"], "factor": x["factor"], "steps": [],
                                     "slow_transfers": len(x["links"]), "transfers": int(links.height)})
            culprits.setdefault("communication", {"rank": x["culprit"], "transfer_ratio": x["factor"],
                                                  **({"labelling": x["labelling"]} if "labelling" in x else {})})
    return Stragglers(slowdown=s, verdict=verdict, by_cause={cause: 1.0}, top_workers=top,
                      waste_fraction=round(1 - 1 / s, 4),
                      extra={**base, "findings_flows": found, "evidence": ev, "culprits": culprits, "steps": []})
