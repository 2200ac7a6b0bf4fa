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
  late, so its DP sends start late in every step while its ring peers start
  on time (their first chunk is their own). An endpoint whose DP sends start
  consistently later than its group's is named (verdict ``worker``).

S is estimated as step / (step - cost); the verdict is ``none`` below
``none_below`` (the contract's 1.05), the finding is listed either way.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.diagnosis import Steps, Stragglers, Strategy

OUTLIER_MADS = 6.0
"""a rate (or a lateness) is an outlier when it lies this many robust standard deviations from the median."""


def _dp_links(flow: pl.DataFrame, strategy: Strategy) -> pl.DataFrame:
    group = {x: i for i, g in enumerate(strategy.dp_groups or []) if len(g) > 1 for x in g}
    if not group or flow.is_empty():
        return flow.head(0)
    f = flow.filter(pl.col("is_data")) if "is_data" in flow.columns else flow
    gs = pl.col("src_addr").replace_strict(group, default=-1, return_dtype=pl.Int64)
    gd = pl.col("dst_addr").replace_strict(group, default=-2, return_dtype=pl.Int64)
    return f.with_columns(g=gs).filter(pl.col("g") == gd)


def _robust(x: np.ndarray) -> tuple[float, float]:
    med = float(np.median(x))
    return med, float(1.4826 * np.median(np.abs(x - med)))


def slow_links(dp: pl.DataFrame, resolution_ns: int, num_steps: int, sampled: bool = False) -> dict | None:
    """The endpoint (slow NIC) or directed link whose DP payload rate is an outlier, or None.

    A slow member throttles its whole ring (chunks are pipelined round it), so the ring's links all
    slow down; the member itself is the one whose sending *and* receiving links are both at the
    ring's lowest rate (its neighbours have one each). A whole ring at one rate names nobody.
    Needs dp (payload records of DP links) src_addr, dst_addr, g, est_bytes, start_ns, end_ns.
    """
    # records shorter than a few clock ticks have no measurable rate
    f = dp.with_columns(d=(pl.col("end_ns") - pl.col("start_ns"))).filter(pl.col("d") >= 10 * resolution_ns)
    if f.height < 4:
        return None
    links = f.group_by("src_addr", "dst_addr", "g").agg(b=pl.col("est_bytes").sum(), d=pl.col("d").sum(),
                                                       n=pl.len())
    links = links.with_columns(rate=pl.col("b") / pl.col("d"),
                               # each record's open time is rounded to a clock tick at each end (an
                               # error of sd ~0.41 tick); three sd of the sum over n records
                               tol=3.0 * 0.41 * resolution_ns * pl.col("n").sqrt() / pl.col("d"))
    if links.height < 3:
        return None
    lr = np.log(links["rate"].to_numpy())
    med, sd = _robust(lr)
    sd = max(sd, 0.05)  # rates that agree to the digit still jitter by a few per cent
    links = links.with_columns(z=pl.Series((lr - med) / sd))
    links = links.with_columns(at_min=pl.col("rate") <= pl.col("rate").min().over("g") * (1 + pl.col("tol")))
    found = []
    for _, gl in links.group_by("g"):
        if gl["z"].min() >= -OUTLIER_MADS:
            continue
        low = gl.filter(pl.col("at_min"))
        ends = pl.concat([low.select(x="src_addr"), low.select(x="dst_addr")]).group_by("x").len()
        both = ends.filter(pl.col("len") >= 2)["x"].to_list()
        if len(both) == 1:
            culprit, kind = both[0], "slow_nic"
            sel = low.filter((pl.col("src_addr") == culprit) | (pl.col("dst_addr") == culprit))
        elif low.height == 1 and not sampled:
            # one link alone: with packet sampling a record opens and closes at sampled packets, so
            # one link's rate is too noisy to name it on its own
            culprit, kind, sel = low["src_addr"][0], "slow_link", low
        else:
            continue  # the whole group at one rate: a slow path or a slow group, nobody to name
        # time per step the slow links spent beyond what the job's usual rate needs for their bytes
        extra = float((sel["d"] - sel["b"] / np.exp(med)).clip(lower_bound=0).max()) / max(num_steps, 1)
        found.append({"kind": kind, "culprit": culprit, "factor": round(float(np.exp(med) / sel["rate"].min()), 3),
                      "extra_ns": extra, "links": [[r["src_addr"], r["dst_addr"]] for r in sel.iter_rows(named=True)]})
    return max(found, key=lambda x: x["extra_ns"]) if found else None


def late_senders(dp: pl.DataFrame, step_ns: float, resolution_ns: int) -> dict | None:
    """The endpoint whose DP sends start consistently late in its group, or None.

    Needs dp src_addr, g (group), start_ns. Bursts are cut at idle gaps longer than a tenth of a step.
    """
    if dp.is_empty() or not step_ns:
        return None
    f = dp.select("src_addr", "g", "start_ns").sort("src_addr", "start_ns")
    gap = pl.col("start_ns") - pl.col("start_ns").shift(1).over("src_addr")
    bursts = f.with_columns(gap=gap).filter(pl.col("gap").is_null() | (pl.col("gap") > 0.1 * step_ns))
    bursts = bursts.with_columns(step=((pl.col("start_ns") - pl.col("start_ns").min()) / step_ns).round().cast(pl.Int64))
    late = bursts.with_columns(late=pl.col("start_ns") - pl.col("start_ns").median().over(["g", "step"]))
    per = late.group_by("src_addr").agg(late=pl.col("late").median(), n=pl.len())
    if per.height < 3:
        return None
    x = per["late"].to_numpy().astype(float)
    med, sd = _robust(x)
    sd = max(sd, 20.0 * resolution_ns)
    worst = per.sort("late", descending=True).row(0, named=True)
    if (worst["late"] - med) / sd < OUTLIER_MADS or worst["n"] < 2:
        return None
    return {"kind": "slow_worker", "culprit": worst["src_addr"], "extra_ns": float(worst["late"] - med)}


def flow_straggler_section(flow: pl.DataFrame, strategy: Strategy, steps: Steps, resolution_ns: int = 1,
                           none_below: float = 1.05) -> Stragglers:
    """Straggler section of a flows-only report (see module doc).

    Needs flow (aligned) src_addr, dst_addr, est_bytes or size_bytes, start_ns, end_ns and is_data
    if known; the inferred strategy's dp_groups and the step time.
    """
    if "est_bytes" not in flow.columns:
        rate = pl.col("sampling_rate").fill_null(1).clip(lower_bound=1) if "sampling_rate" in flow.columns else 1
        flow = flow.with_columns(est_bytes=(pl.col("size_bytes") * rate).cast(pl.Float64))
    dp = _dp_links(flow, strategy)
    sampled = bool("sampling_rate" in dp.columns and (dp["sampling_rate"].fill_null(1) > 1).any())
    step = float(steps.median_ns or 0.0)
    base = {"basis": "flows", "evaluated": True}
    if dp.is_empty() or not step:
        return Stragglers(extra={"basis": "flows", "evaluated": False,
                                 "why": "no data-parallel links or no step time from flows"})
    # with packet sampling a record opens and closes at sampled packets: link rates are too noisy
    # to name a NIC or link (seen: false alarms on a healthy sampled job), so they are not judged
    rates = None if sampled else slow_links(dp, resolution_ns, steps.count)
    if sampled:
        base["link_rates"] = "not judged: packet sampling blurs record durations"
    found = [x for x in (rates, late_senders(dp, step, resolution_ns)) if x]
    if not found:
        return Stragglers(extra={**base, "findings_flows": []})
    best = max(found, key=lambda x: x["extra_ns"])
    cost = min(best["extra_ns"], 0.9 * step)
    s = step / (step - cost)
    cause = "communication" if best["kind"] in ("slow_nic", "slow_link") else "worker"
    verdict = cause if s >= none_below else "none"
    top = [{"endpoint": x["culprit"], "slowdown": round(step / (step - min(x["extra_ns"], 0.9 * step)), 4),
            "kind": x["kind"]} for x in sorted(found, key=lambda x: -x["extra_ns"])]
    # the evidence in the shape the findings read (culprits are addresses: flows know no ranks)
    ev: dict = {"slow_links": [], "slow_ranks": []}
    culprits: dict = {}
    for x in found:
        f = round(step / (step - min(x["extra_ns"], 0.9 * step)), 4)
        if x["kind"] == "slow_worker":
            ev["slow_ranks"].append({"rank": x["culprit"], "factor": f, "steps": []})
            culprits.setdefault("worker", {"rank": x["culprit"], "factor": f, "factor_vs": "its DP group's senders"})
        else:
            ev["slow_links"].append({"rank": x["culprit"], "factor": x["factor"], "steps": [],
                                     "slow_transfers": len(x["links"]), "transfers": int(dp["src_addr"].n_unique())})
            culprits.setdefault("communication", {"rank": x["culprit"], "transfer_ratio": x["factor"]})
    return Stragglers(slowdown=round(s, 4), verdict=verdict, by_cause={cause: 1.0}, top_workers=top,
                      waste_fraction=round(1 - 1 / s, 4),
                      extra={**base, "findings_flows": found, "evidence": ev, "culprits": culprits, "steps": []})
