"""The report's ``traffic`` section: the strategy's expected pairs against the flows, ranked by extra transfer time

Sizing: the strategy gives links, not message sizes, so each (class, stage) is sized by the median
observed bytes per step of its links that carry that class alone (the rings of one stage hold the same
parameters; first and last stages hold more, embeddings and logits). A pair that carries several
classes expects their sum. Peers for the rate are the same (class, stage) links.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import polars as pl

from rankscope.analysis.network.expected import expected_traffic, expert_dp_groups
from rankscope.analysis.network.observed import observed_pairs
from rankscope.analysis.network.topology import Topology, infer_topology, leaf_exporters, payload_records
from rankscope.analysis.report.findings import Finding
from rankscope.analysis.report.strategy import Traffic, TrafficClass, TrafficPair

LISTED = 50
"""pairs listed in the report beyond those that are not ok (a job has thousands)."""
MISSING_SHARE = 0.1
"""an expected pair carrying less than this share of its expected bytes is missing: far beyond any
sampling error or bucket difference, a link that does not carry its class."""
UNEXPECTED_SHARE = 0.1
"""an unexpected pair is listed once it carries this share of the lightest expected link (below: control
and set-up chatter)."""
SLOW_MADS = 5.0
"""a rate this many scaled median absolute deviations below its peers' median is slow."""
SLOW_FLOOR = 0.25
"""and at least this share below it: peers that agree to the byte have a MAD of zero, and a link's rate
moves by 10-15 % with transfer-time jitter and millisecond record stamps alone (11 % on a fault-free
capture); a bad NIC or cable that matters (a lane of four down, a link at half rate) is a quarter or more."""
MIN_PEERS = 3
"""timed links a (class, stage) needs before one of them can be called slow against the others."""
SIZING = ("each (class, stage) sized by the median observed bytes per step of its single-class links; "
          "a pair with several classes expects their sum")


def _stage_of(strategy) -> dict:
    return {str(x): i for p in strategy.pp_groups for i, x in enumerate(p)}


def _joined(strategy, obs: pl.DataFrame) -> pl.DataFrame:
    exp = expected_traffic(strategy)
    stage = _stage_of(strategy)
    rows = [{"src": a, "dst": b, "classes": sorted(c), "key": [f"{k}@{stage.get(a, 0)}" for k in sorted(c)]}
            for (a, b), c in exp.items()]
    e = pl.DataFrame(rows, schema={"src": pl.Utf8, "dst": pl.Utf8, "classes": pl.List(pl.Utf8),
                                   "key": pl.List(pl.Utf8)})
    return e.join(obs, on=["src", "dst"], how="full", coalesce=True)


def _scales(j: pl.DataFrame) -> tuple[dict[str, float], dict[str, float]]:
    """(class@stage) -> bytes per step of one link, from its single-class links (all of them if none), and
    the relative spread of those links (scaled MAD: all-to-all sizes follow the routing, buckets may differ)."""
    single = j.filter(pl.col("key").list.len() == 1).with_columns(pl.col("key").list.first().alias("k"),
                                                                  pl.col("observed").fill_null(0).alias("o"))
    stats = single.group_by("k").agg(pl.col("o").median().alias("m"),
                                     ((pl.col("o") - pl.col("o").median()).abs().median() * 1.4826).alias("mad"))
    scale = dict(zip(stats["k"].to_list(), stats["m"].to_list()))
    spread = {k: (mad / m if m else 0.0) for k, m, mad in stats.select("k", "m", "mad").iter_rows()}
    for k in j["key"].explode().drop_nulls().unique().to_list():
        if k not in scale:
            sub = j.filter(pl.col("key").list.contains(k))
            scale[k] = float(sub["observed"].fill_null(0).median()) / max(1, int(sub["key"].list.len().median()))
            spread[k] = 0.0
    return scale, spread


def _with_units(j: pl.DataFrame, strategy) -> pl.DataFrame:
    """Each expected pair's unit of independent timing: its ring for the ring classes (dp, expert_dp), the
    pair itself for the others. A ring moves at its slowest link's pace (each step of a ring collective
    waits for the chunk from upstream), so a slow NIC paces every link of its ring alike: the links of one
    ring are one witness, not several, and within a ring nothing tells the NIC's links from the others."""
    rows = [(cls, str(x), f"{cls}{i}")
            for cls, groups in (("dp", strategy.dp_groups if (strategy.dp or 1) > 1 else []),
                                ("expert_dp", expert_dp_groups(strategy.dp_groups, strategy.ep_groups or [])))
            for i, g in enumerate(groups) for x in g]
    rings = pl.DataFrame(rows, schema={"_cls": pl.Utf8, "src": pl.Utf8, "_ring": pl.Utf8}, orient="row")
    cls = pl.col("key").list.first().str.split("@").list.first()
    j = (j.with_row_index("_row").with_columns(cls.alias("_cls"))
         .join(rings.unique(["_cls", "src"]), on=["_cls", "src"], how="left").sort("_row"))
    unit = (pl.when(pl.col("key").is_null() | (pl.col("key").list.len() == 0)).then(None)
            .otherwise(pl.coalesce("_ring", pl.concat_str("src", pl.lit(">"), "dst"))))
    return j.with_columns(unit.alias("_unit")).drop("_row", "_cls", "_ring")


def _peer_rates(j: pl.DataFrame) -> pl.DataFrame:
    """per pair, the median rate and scaled MAD of the links of its first (class, stage), where that
    (class, stage) has MIN_PEERS timed links (the links of one ring are compared with each other: a link
    slower than the rest of its ring is slow; a ring slowed alike is seen only against other rings)."""
    k = j.filter(pl.col("key").is_not_null()).with_columns(pl.col("key").list.first().alias("k"))
    stats = k.group_by("k").agg(pl.col("rate").median().alias("peer_rate"),
                                ((pl.col("rate") - pl.col("rate").median()).abs().median() * 1.4826).alias("mad"),
                                pl.col("rate").drop_nulls().len().alias("peers"))
    # with fewer than MIN_PEERS timed links a median cannot single one out: slow is not evaluated there
    stats = stats.with_columns(pl.when(pl.col("peers") >= MIN_PEERS).then(pl.col("mad")).otherwise(None))
    return k.join(stats, on="k", how="left").select("src", "dst", "peer_rate", "mad")


def _kinds(j: pl.DataFrame, owner: dict, leaf: dict) -> pl.DataFrame:
    lightest = j.filter(pl.col("expected") > 0)["expected"].min() or 0.0
    slow = ((pl.col("rate") < pl.col("peer_rate") - SLOW_MADS * pl.col("mad"))
            & (pl.col("rate") < (1 - SLOW_FLOOR) * pl.col("peer_rate")))
    own = pl.struct("src", "exporters").map_elements(
        lambda r: _rerouted(r["src"], r["exporters"], owner, leaf), return_dtype=pl.Boolean)
    kind = (pl.when(pl.col("_not_ring")).then(pl.lit("not_judged"))
            .when(pl.col("expected").is_not_null() & (pl.col("observed").fill_null(0)
                                                        < MISSING_SHARE * pl.col("expected"))).then(pl.lit("missing"))
            .when(pl.col("expected").is_null()).then(pl.lit("unexpected"))
            .when(own).then(pl.lit("rerouted"))
            .when(slow.fill_null(False)).then(pl.lit("slow")).otherwise(pl.lit("ok")))
    j = j.with_columns(kind.alias("kind"))
    return j.filter((pl.col("kind") != "unexpected") | (pl.col("observed") >= UNEXPECTED_SHARE * lightest))


def _rerouted(src, exporters, owner: dict, leaf: dict) -> bool:
    home = owner.get(leaf.get(src))
    return bool(home and exporters and any(x != home for x in exporters))


def _cost(j: pl.DataFrame) -> pl.DataFrame:
    typical = j["peer_rate"].median() or None
    peer = pl.coalesce(pl.col("peer_rate"), pl.lit(typical))
    moved = pl.coalesce(pl.col("observed"), pl.col("expected"))
    extra = pl.when(pl.col("kind") == "slow").then(moved / pl.col("rate") - moved / peer).otherwise(moved / peer)
    return j.with_columns((extra * 1e9).fill_null(0.0).fill_nan(0.0).alias("cost_ns"))


FAMILY_ALPHA = 0.01
"""chance that any one of a job's pairs falls outside its sampling band by sampling alone."""


def _z(pairs: int) -> float:
    """The band's half-width in standard errors: two-sided, Bonferroni over the job's pairs (a thousand
    pairs at 3 sigma would flag about three by sampling alone)."""
    return NormalDist().inv_cdf(1 - FAMILY_ALPHA / (2 * max(1, pairs)))


def _expected(j: pl.DataFrame, scale: dict, spread: dict) -> pl.DataFrame:
    exp = pl.col("key").map_elements(lambda ks: float(sum(scale.get(k, 0.0) for k in ks)),
                                     return_dtype=pl.Float64)
    var = pl.col("key").map_elements(lambda ks: float(sum((scale.get(k, 0.0) * spread.get(k, 0.0)) ** 2
                                                          for k in ks)), return_dtype=pl.Float64)
    j = j.with_columns(pl.when(pl.col("key").is_not_null()).then(exp).otherwise(None).alias("expected"),
                       pl.when(pl.col("key").is_not_null()).then(var).otherwise(0.0).alias("_var"))
    model = pl.when(pl.col("expected") > 0).then(pl.col("_var").sqrt() / pl.col("expected")).otherwise(0.0)
    j = j.with_columns(model.alias("model_error")).drop("_var")
    ratio = pl.when(pl.col("expected") > 0).then(pl.col("observed") / pl.col("expected")).otherwise(None)
    j = j.with_columns(ratio.alias("ratio"), pl.col("rel_error").fill_null(0.0))
    # a match within the band of the sampled estimate and of the class's own spread (float rounding when
    # both are nil)
    band = (pl.col("rel_error") ** 2 + pl.col("model_error") ** 2).sqrt()
    within = (pl.col("ratio") - 1).abs() <= _z(j.height) * band + 1e-6
    return j.with_columns(within.fill_null(False).alias("within_error"))


def _classes(j: pl.DataFrame) -> list[TrafficClass]:
    out = []
    ex = j.filter(pl.col("classes").is_not_null()).explode("classes")
    for name in sorted(ex["classes"].unique().to_list()):
        c = ex.filter(pl.col("classes") == name)
        seen = c.filter(pl.col("observed").fill_null(0) > 0)
        ratio = seen["ratio"].drop_nulls()  # a pair with nothing expected has no ratio
        out.append(TrafficClass(name=name, pairs=c.height, seen=seen.height,
                                within_error=int(c["within_error"].sum()),
                                median_ratio=float(ratio.median()) if ratio.len() else None,
                                max_deviation=float((ratio - 1).abs().max()) if ratio.len() else None))
    return out


def _pair(r: dict) -> TrafficPair:
    def num(x):
        return None if x is None or not np.isfinite(x) else float(x)
    return TrafficPair(src=r["src"], dst=r["dst"], classes=list(r["classes"] or []), expected=num(r["expected"]),
                       observed=num(r["observed"]), ratio=num(r["ratio"]), kind=r["kind"],
                       within_error=bool(r["within_error"]), rate=num(r["rate"]), peer_rate=num(r["peer_rate"]),
                       rel_error=float(r["rel_error"] or 0.0), model_error=float(r["model_error"] or 0.0),
                       cost_ns=float(r["cost_ns"]),
                       exporters=list(r["exporters"] or []))


def _dp_member(strategy) -> dict[str, int]:
    """endpoint -> the index of its DP group (none without data parallelism)."""
    if (strategy.dp or 1) <= 1:
        return {}
    return {str(x): i for i, g in enumerate(strategy.dp_groups) for x in g}


def dp_groups_not_ring(strategy, j: pl.DataFrame, member: dict[str, int] | None = None) -> list[int]:
    """The DP groups (indexes in dp_groups) that are not running their ring: a member sends to more members of
    its group than its ring links reach (NCCL's tree all-reduce sends to a parent and children), so the ring's
    pairs are no expectation for the group. A ring that closes around a member gone elsewhere (a misgrouped
    rank) still sends to one member each, and stays judged: its new pair is unexpected, the old ones missing.
    ``member``: :func:`_dp_member` of the strategy, when the caller has it."""
    member = _dp_member(strategy) if member is None else member
    if not member:
        return []
    rows = j.filter(pl.col("classes").is_null() | pl.col("classes").list.contains("dp"))
    floor = UNEXPECTED_SHARE * (j.filter(pl.col("expected") > 0)["expected"].min() or 0.0)  # set-up chatter
    sends: dict[str, set] = {}
    ring: dict[str, set] = {}
    for a, b, classes, observed in rows.select("src", "dst", "classes", "observed").iter_rows():
        if a not in member or member.get(b) != member[a]:
            continue
        if classes:
            ring.setdefault(a, set()).add(b)
        if observed and observed >= floor:
            sends.setdefault(a, set()).add(b)
    return sorted({member[a] for a, to in sends.items() if len(to) > len(ring.get(a, ()))})


def _mark_not_ring(strategy, j: pl.DataFrame) -> pl.DataFrame:
    """``_not_ring``: a pair inside a DP group that is not a ring (:func:`dp_groups_not_ring`), carrying DP or
    nothing expected; ``_dp_group``: that group's index (null for every other pair)."""
    member = _dp_member(strategy)
    groups = set(dp_groups_not_ring(strategy, j, member))
    group = [member.get(a) if member.get(a) in groups and member.get(a) == member.get(b) else None
             for a, b in j.select("src", "dst").iter_rows()]
    dp_or_none = pl.col("classes").is_null() | pl.col("classes").list.contains("dp")
    j = j.with_columns(pl.Series("_dp_group", group, dtype=pl.Int64))
    return j.with_columns((pl.col("_dp_group").is_not_null() & dp_or_none).alias("_not_ring"))


def pair_frame(strategy, job_flows: pl.DataFrame, steps: int, topo: Topology) -> pl.DataFrame:
    """Every pair of a flow job with its kind and cost, as the section orders them (not ok first, then by
    ``cost_ns``), before the section trims them to the listed ones; the pair matrix views read all of it.
    Needs a strategy that implies traffic and the job's records with ``est_bytes`` and ``is_data``."""
    j = _with_units(_joined(strategy, observed_pairs(job_flows, max(steps, 1))), strategy)
    j = _expected(j, *_scales(j))
    j = j.join(_peer_rates(j), on=["src", "dst"], how="left")
    j = _cost(_kinds(_mark_not_ring(strategy, j), leaf_exporters(payload_records(job_flows), topo),
                     topo.leaf_of()))
    return _slow_nic_first(j.with_columns(pl.col("kind").is_in(["ok", "not_judged"]).alias("_ok")).sort(
        ["_ok", "cost_ns", "src", "dst"], descending=[False, True, False, False]))


def traffic_section(strategy, job_flows: pl.DataFrame | None, steps: int,
                    topology: Topology | None = None) -> Traffic | None:
    """The traffic section of a flow job; None without flow records (white-box reports stay as they were)."""
    if job_flows is None or job_flows.is_empty():
        return None
    if not strategy.evaluated or not expected_traffic(strategy):
        return Traffic(evaluated=False, why="the strategy implies no traffic between endpoints (no dp, pp or "
                                            "ep groups)")
    # without steps, bytes are per capture: the ratios stand (each class is sized from the same capture)
    per = "step" if steps > 0 else "capture"
    topo = topology or infer_topology(payload_records(job_flows))
    j = pair_frame(strategy, job_flows, steps, topo)
    flagged = int((~j["_ok"]).sum())
    few = _few_peers(j)
    listed = j.head(flagged + LISTED)
    return Traffic(evaluated=True, topology=topo.source, sizing=SIZING, bytes_per=per, pairs_total=j.height,
                   kinds=dict(sorted(j.group_by("kind").len().iter_rows())), classes=_classes(j),
                   pairs=[_pair(r) for r in listed.iter_rows(named=True)], listed=flagged + LISTED,
                   slow_not_evaluated=few,
                   dp_groups_not_ring=sorted(j.filter(pl.col("_not_ring"))["_dp_group"].unique().to_list()))


def _few_peers(j: pl.DataFrame) -> list[str]:
    """The (class@stage) whose timed links (rings, for the ring classes) are too few to call one slow."""
    k = j.filter(pl.col("key").is_not_null()).with_columns(pl.col("key").list.first().alias("k"))
    n = k.group_by("k").agg(pl.col("rate").drop_nulls().len().alias("n"),
                            pl.col("_unit").filter(pl.col("rate").is_not_null()).n_unique().alias("u"))
    out = []
    for key, links, units in n.sort("k").iter_rows():
        if links < MIN_PEERS:
            out.append(f"{key}: {links} timed link(s), slow needs {MIN_PEERS}")
        elif key.split("@")[0] in ("dp", "expert_dp") and units < MIN_PEERS:
            out.append(f"{key}: {units} ring(s): links compared within their ring only; a slow NIC paces "
                       f"every link of its ring alike, so a whole slow ring needs {MIN_PEERS} rings to be seen")
    return out


def _slow_nic_first(j: pl.DataFrame) -> pl.DataFrame:
    """Slow pairs that touch the endpoint most slow pairs share, when one endpoint is on strictly more
    of them than any other, ahead of the other slow pairs (each group by cost), in the slow pairs' own
    places in the order. A bad NIC slows its pipeline links and its whole ring: the ring's links are
    slow alike, and the NIC is the endpoint they share with its other slow links."""
    slow = j.with_row_index("_i").filter(pl.col("kind") == "slow")
    if slow.height < 2:
        return j
    count: dict[str, int] = {}
    for a, b in slow.select("src", "dst").iter_rows():
        for x in (a, b):
            count[x] = count.get(x, 0) + 1
    top = sorted(count.values(), reverse=True)
    if len(top) > 1 and top[0] == top[1]:
        return j
    nic = max(count, key=lambda x: count[x])
    touch = (pl.col("src") == nic) | (pl.col("dst") == nic)
    order = slow.with_columns((~touch).alias("_away")).sort(["_away", "cost_ns", "src", "dst"],
                                                           descending=[False, True, False, False])["_i"]
    idx = list(range(j.height))
    for place, row in zip(slow["_i"].to_list(), order.to_list()):
        idx[place] = row
    return j[idx]


def _shared_endpoint(pairs: list[TrafficPair]) -> tuple[str | None, int]:
    """The endpoint most of these pairs touch (a bad NIC slows every link it is on), and how many."""
    count: dict[str, int] = {}
    for p in pairs:
        for x in (p.src, p.dst):
            count[x] = count.get(x, 0) + 1
    if not count:
        return None, 0
    best = max(sorted(count), key=lambda x: count[x])
    if sum(1 for c in count.values() if c == count[best]) > 1:
        return None, count[best]  # a tie (a ring slowed alike): no one endpoint to name
    return best, count[best]


def traffic_findings(traffic: Traffic | None) -> list[Finding]:
    """One finding per kind of bad pair (missing, unexpected, slow, rerouted): its costliest pair, with the
    pair's numbers and, for slow pairs, the endpoint most of them share."""
    if traffic is None or not traffic.evaluated:
        return []
    out = []
    for kind in ("slow", "missing", "unexpected", "rerouted"):
        bad = [p for p in traffic.pairs if p.kind == kind]
        if not bad:
            continue
        top = bad[0]
        factor = (top.peer_rate / top.rate) if kind == "slow" and top.rate else (top.ratio or 0.0)
        ev = {"src": top.src, "dst": top.dst, "classes": top.classes, "expected_bytes_per_step": top.expected,
              "observed_bytes_per_step": top.observed, "rate": top.rate, "peer_rate": top.peer_rate,
              "extra_transfer_ns_per_step": top.cost_ns, "exporters": top.exporters, "pairs_of_this_kind": len(bad)}
        if kind == "slow":
            ev["shared_endpoint"], ev["shared_by_pairs"] = _shared_endpoint(bad)
        out.append(Finding(kind=f"traffic_{kind}", culprit=f"{top.src} -> {top.dst}", factor=float(factor), steps=[],
                           evidence=ev, factor_vs="its peers' rate" if kind == "slow" else "expected bytes"))
    return out
