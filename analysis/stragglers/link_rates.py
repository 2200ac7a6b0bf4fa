"""Payload rates of a job's links from switch flow records: a slow link or NIC.

Read off the data-parallel links of the inferred strategy (links between
members of one DP group), whose traffic every step is the same collective
moving the same bytes. Each link's payload rate is its bytes over the time its
payload records were open. A NIC that runs slow drags every DP link it sends
or receives on; a bad cable only the one link. The endpoint (or link) whose
rate sits far below the job's spread of link rates is named, with the step
time its extra transfer time costs.

A slow NIC or cable usually throttles its whole ring, not one link: every
link of its DP group then runs at the same low rate, and its group stands
out only against the job's *other* DP groups (other pipeline stages, other
TP ranks' rings). The member is then named from its links outside the ring
(pipeline sends and receives, which only it of its group shares with the
slow NIC); a pure pipeline job is read the same way off its pipeline links.
When the evidence cannot single out one address the finding is ambiguous
(the group and its factor) and names nobody.

Link rates are judged only where they are measured: a record that spans
more than a step holds idle time, and so may a record that holds its TCP
connection's set-up (SYN in its flags): it is open from the handshake to the
first data, and gloo connects every pair when the process group starts, well
before the first step. A real gloo DP2 x PP2 job's first pipeline record was
open 2.26 s from its SYN for 0.14 MB that later steps moved in 0.03-0.05 s
(softflowd, 1 s idle timeout, which cut the other pipeline's SYN into a record
of its own), and that link read as a ring 10.6x slower than its peer. A FIN is
no such sign: jobs that exit right after their last step close their
connections inside the last payload record, whose rate is the data's (the
nfpcapd DP2 x PP2 x TP2 capture's ring records, 5.5 MB in 0.58 s with FIN).
With packet sampling a rate counted from k sampled packets is uncertain by
about 1/sqrt(k).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.model.timelines import union_ns
from rankscope.analysis.report.strategy import Strategy
from rankscope.analysis.strategy.flows.link_dating import SETUP_FLAGS

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
RING_GAP = 0.01
"""a link or NIC is named within its ring only when it runs at least this share below the ring's other
links: healthy links of one ring differ by a fraction of a per cent (clock ticks, per-record jitter)."""
MIN_PACKETS = 30
"""a link's rate counts only with at least this many exported (sampled) packets: ~18 % error."""

RATE_COLUMNS = ("src_addr", "dst_addr", "est_bytes", "start_ns", "end_ns", "is_data", "num_packets", "sampling_rate",
                "tcp_flags")
"""the record columns link_rates reads (the last four where known)."""


def _pairs(links: pl.DataFrame) -> list[list[str]]:
    """The (src, dst) pairs of some links, sorted: the report lists them the same way on every run."""
    return sorted([a, b] for a, b in links.select("src_addr", "dst_addr").iter_rows())


def group_of(strategy: Strategy) -> dict:
    return {x: i for i, g in enumerate(strategy.dp_groups or []) if len(g) > 1 for x in g}


def robust(x: np.ndarray) -> tuple[float, float]:
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
    duty cycle, not the link; a record that holds its connection's set-up may measure the wait for the
    first data (see the module's note).
    Needs flow src_addr, dst_addr, est_bytes, start_ns, end_ns; is_data, num_packets, sampling_rate, tcp_flags
    if known.
    """
    # only the columns read: the filters below copy what they are given
    f = flow.select([c for c in RATE_COLUMNS if c in flow.columns])
    f = f.filter(pl.col("is_data")) if "is_data" in f.columns else f
    vol = f.group_by("src_addr", "dst_addr").agg(vol=pl.col("est_bytes").sum())
    f = f.with_columns(d=(pl.col("end_ns") - pl.col("start_ns"))).filter(pl.col("d") >= 10 * resolution_ns)
    if step_ns:
        f = f.filter(pl.col("d") <= step_ns)
    if "tcp_flags" in f.columns:
        f = f.filter(((pl.col("tcp_flags") & SETUP_FLAGS) == 0).fill_null(True))
    sampled = "sampling_rate" in f.columns and "num_packets" in f.columns
    pk = pl.col("num_packets").fill_null(0) if sampled else pl.lit(0)
    rate = pl.col("sampling_rate").fill_null(1).clip(lower_bound=1) if sampled else pl.lit(1)
    # lazy: the eager group_by held ~0.2 GiB more for 1.6M records (it materialises the computed aggregations)
    links = f.lazy().group_by("src_addr", "dst_addr").agg(
        b=pl.col("est_bytes").sum(), b2=(pl.col("est_bytes") ** 2).sum(), d=pl.col("d").sum(), n=pl.len(),
        pk=pk.sum(), smp=(rate > 1).any()).collect()
    # wall time some record of the link was open: its connections (one per queue pair or rank) run side
    # by side and their open times overlap
    link = ["src_addr", "dst_addr"]
    links = links.join(union_ns(f.select(*link, "start_ns", "end_ns"), link).rename({"union_ns": "busy"}), on=link)
    group = group_of(strategy)
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
    med, sd = robust(lr)
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
            r_med, r_sd = robust(rl)
            # (the plain sd too: a median of absolute deviations of a few links can be near 0 by chance)
            r_sd = max(r_sd, float(np.std(rl, ddof=1)), float(np.median(gl["noise"].to_numpy())))
            if r_med - float(np.log(sel["rate"].max())) < max(OUTLIER_MADS * r_sd, np.log1p(RING_GAP)):
                continue
        found.append({"kind": kind, "culprit": culprit, "factor": round(float(np.exp(med) / sel["rate"].min()), 3),
                      "extra_ns": _extra_per_step(sel, float(np.exp(med)), num_steps),
                      "links": _pairs(sel)})
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
    med, sd = robust(lr)
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
        ref, sd = robust(rest) if len(rest) >= 2 else (float(rest[0]), 0.0)
        sd = max(sd, 0.05)
        if ref - lr0 < max(np.log(SLOW_FACTOR), OUTLIER_MADS * sd):
            return None
        # one slow NIC slows one DP ring; rings about as slow as it (12 of a clean DP2 x PP16 x TP4 job's 64,
        # 2.6-3.0 against 10 for the rest: a topology's slower paths) are no single slow ring
        if (lrs[peers] < lr0 + 0.5 * (ref - lr0)).any():
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
                    "links": _pairs(mine)}
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
            "links": _pairs(mine)}
