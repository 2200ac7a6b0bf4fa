"""Straggler evidence from switch flow records alone: a slow link or NIC, named by its address.

Flows carry no compute, so no what-if replay is possible and S is not
evaluated. What flows do show is how fast each pair moved its bytes: the
effective rate of a directed pair is its bytes over the time its records were
open. Pairs of one role (ring links of the DP groups, pipeline links) move the
same kind of message, so each pair is compared with the median of its role.

A slow NIC slows every transfer through it; a ring all-reduce then runs at
that NIC's pace on every link of its ring (the ring is as fast as its slowest
link), so many pairs of that ring look slow, but only the NIC's own endpoint
is slow on *all* of its pairs, its pipeline links included. An endpoint's
score is therefore the smallest slowness over its pairs; the culprit is the
endpoint whose smallest slowness still reaches ``slow_link_at``. Two such
endpoints (both ends of one slow cable) are both named and the result is
marked ambiguous.
"""

from __future__ import annotations

import polars as pl

from rankscope.analysis.diagnosis import Stragglers, Strategy
from rankscope.analysis.flow_features import estimated_bytes

MIN_PAIR_SHARE = 0.01
"""Pairs carrying less than this share of the busiest pair's bytes are set-up or control noise."""

MIN_PAIRS = 2
"""An endpoint is judged on at least this many of its pairs."""


def _roles(strategy: Strategy) -> dict[tuple[str, str], tuple[str, int]]:
    """The role of each directed pair, with its place, and the group it belongs to: ring links of
    stage s (``dp s``, group = the DP group), pipeline links from stage s to stage t (``pp s>t``,
    group = the pipeline). Pairs in one place carry the same messages on the same schedule; links
    to different stages do not (the last stage computes longer, for one)."""
    stage = {x: i for p in strategy.pp_groups or [] for i, x in enumerate(p)}
    role: dict[tuple[str, str], tuple[str, int]] = {}
    for gi, g in enumerate(strategy.dp_groups or []):
        for a in g:
            for b in g:
                if a != b:
                    role[(a, b)] = (f"dp {stage.get(a, 0)}", gi)
    for pi, p in enumerate(strategy.pp_groups or []):
        for i, (a, b) in enumerate(zip(p, p[1:])):
            role[(a, b)], role[(b, a)] = (f"pp {i}>{i + 1}", pi), (f"pp {i + 1}>{i}", pi)
    return role


def pair_rates(flow: pl.DataFrame, strategy: Strategy) -> pl.DataFrame:
    """Directed pairs of the job: src, dst, role, bytes, open_ns, rate (bytes/s), slowness vs its role."""
    if flow.is_empty():
        return pl.DataFrame()
    f = flow.with_columns(b=estimated_bytes(), d=(pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64))
    p = f.group_by("src_addr", "dst_addr").agg(bytes=pl.col("b").sum(), open_ns=pl.col("d").sum())
    p = p.filter((pl.col("open_ns") > 0) & (pl.col("bytes") >= MIN_PAIR_SHARE * pl.col("bytes").max()))
    role = _roles(strategy)
    got = [role.get((a, b), ("other", -1)) for a, b in p.select("src_addr", "dst_addr").iter_rows()]
    p = p.with_columns(role=pl.Series([r for r, _ in got], dtype=pl.String),
                       group=pl.Series([g for _, g in got], dtype=pl.Int64),
                       rate=pl.col("bytes") / pl.col("open_ns") * 1e9)
    # a ring runs at its slowest link's pace, so its links only compare with other groups' links:
    # a role held by one group has no independent peers, and its pairs are not judged
    peers = pl.col("group").n_unique().over("role") >= 2
    return p.with_columns(slowness=pl.when(peers).then(pl.col("rate").median().over("role") / pl.col("rate")))


def _unexplained(cands: pl.DataFrame, ends: pl.DataFrame) -> pl.DataFrame:
    """Candidates less the ones whose every judged pair leads to one other, busier candidate: the
    first stage's only links go to the second, so a slow NIC there makes the first stage look slow
    on all its pairs too."""
    if cands.height < 2:
        return cands
    names = set(cands["endpoint"].to_list())
    pairs = dict(zip(cands["endpoint"].to_list(), cands["pairs"].to_list()))
    others = {e: set(g["other"].to_list()) for (e,), g in ends.filter(pl.col("endpoint").is_in(list(names)))
              .group_by("endpoint")}
    explained = {e for e in names if len(others.get(e, set())) == 1
                 and (b := next(iter(others[e]))) in names and pairs[b] > pairs[e]}
    return cands.filter(~pl.col("endpoint").is_in(list(explained)))


def flow_straggler_section(flow: pl.DataFrame, strategy: Strategy, slow_link_at: float = 1.5) -> Stragglers:
    """The straggler section of a flows-only job (flows aligned to one clock)."""
    basis = "flows: effective transfer rate of each pair against its role's median"
    not_s = ("flows carry no compute, so the job cannot be replayed with ideal durations: "
             "S is not evaluated (1.0 is a placeholder)")
    p = pair_rates(flow, strategy)
    if p.is_empty() or p["role"].n_unique() == 0:
        return Stragglers(extra={"evaluated": False, "basis": "flows", "why": "no heavy flow pairs"})
    ends = pl.concat([p.select(endpoint="src_addr", other="dst_addr", slowness="slowness"),
                      p.select(endpoint="dst_addr", other="src_addr", slowness="slowness")]).drop_nulls("slowness")
    per = (ends.group_by("endpoint").agg(score=pl.col("slowness").min(), factor=pl.col("slowness").median(),
                                         pairs=pl.len())
           .filter(pl.col("pairs") >= MIN_PAIRS).sort("score", descending=True))
    slow = _unexplained(per.filter(pl.col("score") >= slow_link_at), ends)
    links = [{"endpoint": r["endpoint"], "factor": float(r["factor"]), "min_over_pairs": float(r["score"]),
              "pairs": int(r["pairs"]), "steps": []} for r in slow.head(4).iter_rows(named=True)]
    top = [{"endpoint": r["endpoint"], "slowdown": float(r["factor"]), "basis": "transfer rate vs its role"}
           for r in slow.head(4).iter_rows(named=True)]
    extra = {"evaluated": True, "basis": "flows", "model": "pair transfer rates", "slowdown_evaluated": False,
             "why_no_slowdown": not_s, "evidence": {"slow_links": links, "method": basis,
                                                     "endpoints_judged": int(per.height),
                                                     "highest_min_slowness": float(per["score"][0])
                                                     if per.height else None}}
    if not links:
        return Stragglers(verdict="none", top_workers=[], extra=extra)
    if len(links) > 1:
        extra["ambiguous"] = {"between": [x["endpoint"] for x in links],
                              "why": "several endpoints are slow on every one of their pairs: one slow link "
                                     "between them, or several slow NICs"}
    share = {"communication": 1.0}
    return Stragglers(verdict="communication", by_cause=share, top_workers=top,
                      extra={**extra, "verdict_shares": share,
                             "culprit": {"endpoint": links[0]["endpoint"], "factor": links[0]["factor"]}})

