"""Step time and boundaries of one job from the period of its flow records' bursts.

A link's records bunch into bursts, one or a few a step (its data-parallel reduction); the period at
which their starts repeat is the step, unless the exporter's timeouts set where records start, or the
records are timed more coarsely than the period, or records long enough to hold a step hide bursts:
then the steps are not read, or read with the doubt said (strategy.flows.notes holds the sentences).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.fabric.clock import flow_resolution_ns
from rankscope.analysis.fabric.pair_traffic import on_pairs
from rankscope.analysis.report.steps import FlowPeriod, FlowPeriodMiss, Steps
from rankscope.analysis.strategy.flows import notes
from rankscope.analysis.strategy.flows.period import period_steps, step_period, whole_step

LINK_COLUMNS = ("src_addr", "dst_addr", "src_port", "dst_port", "start_ns", "end_ns")
"""the record columns that a link's bursts are read from."""


def flow_steps(flows: pl.DataFrame, dp_pairs: set[tuple[str, str]]) -> Steps:
    """Step time and boundaries from the period of DP traffic (all heavy traffic when there is no DP).

    Needs flows (aligned) src_addr, dst_addr, src_port, dst_port, start_ns, end_ns, exporter (and
    is_data, est_bytes where present, for the whole-traffic check). Boundaries are spaced
    one period apart from the first record of the periodic traffic.
    """
    # only the columns read below: the records are filtered, sorted and joined on the way, each a copy
    f = flows.select(LINK_COLUMNS)
    f = on_pairs(f, dp_pairs) if dp_pairs else f
    if f.height < 3:
        return Steps(evaluated=False, why=notes.too_few_step_records(), source="flows")
    f, bursts = _link_bursts(f)
    t = bursts["start_ns"].to_numpy()
    period = step_period(bursts["key"].to_numpy(), t)
    res = flow_resolution_ns(flows)
    if period is None:
        return _no_period(f, bursts, res)
    if period < 2 * res:
        # sFlow samples timed by their datagrams: a real agent's 240 samples of a 4-stage pipeline (steps of
        # 40 ms) "repeated" every 14.5 ms, the cadence of its datagrams, not of the job
        return _period_below_resolution(period, res)
    period, period_seen, whole = _settle_period(flows, bursts, period, res)
    bounds = period_steps(int(t.min()), int(t.max()), period)
    # records that last most of the gap to the next one were closed by the active timeout and may
    # span several steps: then only a multiple of the step is observable
    dur = (f["end_ns"] - f["start_ns"]).to_numpy().astype(float)
    cover = float(np.median(dur) / period) if period > 0 else 0.0
    # The longest records show the exporter's active timeout; once it reaches half the period, a
    # record can hold two steps and the period seen may be a multiple of the real one.
    long_frac = float(np.quantile(dur, 0.95) / period) if period > 0 and len(dur) else 0.0
    hidden = _hidden_bursts(f, bursts, dur, res)
    why = _period_doubt(whole, hidden, cover, long_frac)
    found = _flow_period(cover, long_frac, hidden, period_seen, whole)
    return Steps(count=len(bounds), median_ns=period, boundaries_ns=bounds,
                 source="flows: period of data-parallel traffic",
                 durations_ns=[int(round(period))] * len(bounds),
                 ambiguous=True if why else None, why=why, period=found)


def _link_bursts(f: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(records keyed by flow and sorted, with ``gap`` to the flow's previous record and the flow's
    ``big``gest gap; the records that start a burst)."""
    flow = pl.concat_str(["src_addr", "dst_addr", "src_port", "dst_port"], separator="|", ignore_nulls=True)
    # a flow's key is the row of its first record: keys in the order the flows first appear, whatever else the
    # process saw (a Categorical's codes come from process-wide categories that threads fill in any order,
    # and step_period samples the sorted keys' differences, so the period could change from run to run)
    f = (f.with_row_index("_row").select(pl.col("_row").min().over(flow).alias("key"), "start_ns", "end_ns")
         .sort(["key", "start_ns"]))
    # a burst starts after an idle gap; records that follow their predecessor closely are the same
    # burst cut by the active timeout, and their starts carry no step phase
    gap = pl.col("start_ns") - pl.col("end_ns").shift(1).over("key")
    f = f.with_columns(gap=gap).with_columns(big=pl.col("gap").max().over("key"))
    return f, f.filter(pl.col("gap").is_null() | (pl.col("gap") > 0.2 * pl.col("big")))


def _no_period(f: pl.DataFrame, bursts: pl.DataFrame, resolution_ns: int) -> Steps:
    """Steps not evaluated because no period was found, with what the records show of why (``f`` and
    ``bursts`` from :func:`_link_bursts`)."""
    # records that follow their predecessor within a few clock ticks are one flow cut by the active
    # timeout: the flow never idled long enough for the exporter to close it between steps
    cont = f.filter(pl.col("gap").is_not_null())
    share = float((cont["gap"] <= 10 * resolution_ns).mean()) if cont.height else 0.0
    med = float((f["end_ns"] - f["start_ns"]).median() or 0)
    per_flow = bursts.height / max(f["key"].n_unique(), 1)
    why = notes.no_periodic_traffic()
    if share >= 0.5 or per_flow <= 2:
        why = notes.timeouts_set_record_starts(med, per_flow, share)
    return Steps(evaluated=False, why=why, source="flows", period_miss=FlowPeriodMiss(
        continued_records=round(share, 3), median_record_ns=med, burst_starts_per_flow=round(per_flow, 2)))


def _period_below_resolution(period: float, resolution_ns: int) -> Steps:
    """Steps not evaluated because the period seen is under two ticks of the records' clock."""
    return Steps(evaluated=False, source="flows", period_miss=FlowPeriodMiss(
        period_seen_ns=int(round(period)), timestamp_resolution_ns=int(resolution_ns)),
        why=notes.period_below_resolution(period, resolution_ns))


def _settle_period(flows: pl.DataFrame, bursts: pl.DataFrame, period: float,
                   resolution_ns: int) -> tuple[float, float | None, dict | None]:
    """(the step period, the phase-coherence period where the bursts' spacing replaced it or None, the
    whole-traffic check of strategy.flows.period.whole_step or None) from the period ``period`` that the
    bursts' phase coherence chose."""
    spacing = burst_spacing(bursts, period)
    if spacing and abs(spacing - period) > 0.01 * period:
        # most links' consecutive bursts lie a whole number of steps apart: the period the phase
        # coherence chose may sit on a minority of links (a tree's late senders, a timer's beat)
        period_seen, period = period, spacing
    else:
        period_seen = None
    # a link's bursts may repeat several times a step: the job's whole traffic repeats once a step
    whole = whole_step(_payload(flows), period, resolution_ns) if "est_bytes" in flows.columns else None
    if whole and whole["multiple"] > 1:
        period = whole["step_ns"]
    return period, period_seen, whole


def _payload(flows: pl.DataFrame) -> pl.DataFrame:
    """The payload records (all when ``is_data`` is unknown) with only the columns whole_step reads:
    start_ns, end_ns, est_bytes (the filter copies what it is given, and the records have many more)."""
    f = flows.select([c for c in ("start_ns", "end_ns", "est_bytes", "is_data") if c in flows.columns])
    return f.filter(pl.col("is_data")).drop("is_data") if "is_data" in f.columns else f


def _flow_period(cover: float, long_frac: float, hidden: dict, period_seen: float | None,
                 whole: dict | None) -> FlowPeriod:
    """The report's account of how the period was found: record cover, the spacing that replaced the
    phase-coherence period, and the whole-traffic autocorrelation (``whole``)."""
    return FlowPeriod(
        record_cover=round(cover, 3), note=notes.one_period_for_all_steps(),
        longest_record_cover=round(long_frac, 3), record_coverage_between_bursts=round(hidden["coverage"], 3),
        period_from_phase_coherence_ns=int(round(period_seen)) if period_seen else None,
        period_note=notes.period_from_burst_spacing() if period_seen else None,
        period_multiple=whole["multiple"] if whole else None,
        autocorrelation_by_multiple={str(k): v for k, v in whole["corr"].items()} if whole else None,
        period_weak=True if whole and whole["weak"] else None,
        autocorrelation_by_fraction=({str(m): v for m, v in whole["fraction_corr"].items()}
                                     if whole and whole.get("fraction") else None))


def _period_doubt(whole: dict | None, hidden: dict, cover: float, long_frac: float) -> str | None:
    """Why the period found may not be the step (the last reason that holds wins), or None."""
    why = None
    if whole and whole["weak"]:
        why = notes.period_weak()
        if whole.get("unconfirmed_multiple"):
            why = notes.period_multiple_unconfirmed(whole["unconfirmed_multiple"])
        if whole.get("short"):
            why = notes.period_seen_once()
    if whole and whole.get("fraction"):
        why = notes.period_fraction(whole["fraction"])
    if hidden["timer_cut"] and hidden["coverage"] >= 0.5:
        why = notes.timer_records_hide_bursts(hidden["timer_share"], hidden["timer_ns"], hidden["coverage"])
    if cover > 0.5 or long_frac >= 0.5:
        why = notes.records_span_the_period(max(cover, long_frac))
    return why


def burst_spacing(bursts: pl.DataFrame, period: float) -> float | None:
    """The median of d / round(d / period) over the gaps d between consecutive burst starts of a link
    (a burst every step, or every few steps where the exporter hid some), iterated once."""
    gaps = bursts.with_columns(d=pl.col("start_ns").diff().over("key"))["d"].drop_nulls()
    d = gaps.to_numpy().astype(float)
    for _ in range(2):
        k = np.round(d / period)
        ok = k >= 1
        if ok.sum() < 3:
            return None
        period = float(np.median(d[ok] / k[ok]))
    return period


def _hidden_bursts(f: pl.DataFrame, bursts: pl.DataFrame, dur: np.ndarray, resolution_ns: int) -> dict:
    """Whether records could hide burst starts: records the exporter's active timeout closed all last
    about as long as the longest (the timeout), run through any idle time inside them, and so hide a
    burst that starts within them. Coverage: the median share of time, between a link's first and
    last burst seen, that its records are open (an idle step shows as time no record covers)."""
    out = {"timer_cut": False, "timer_share": 0.0, "timer_ns": 0.0, "coverage": 0.0}
    if not len(dur) or bursts.height < 2:
        return out
    dmax = float(dur.max())
    share = float((dur >= dmax - max(0.02 * dmax, 2 * resolution_ns)).mean())
    first = bursts.group_by("key").agg(a=pl.col("start_ns").min(), b=pl.col("start_ns").max())
    inside = (pl.col("start_ns") >= pl.col("a")) & (pl.col("start_ns") < pl.col("b"))
    cov = (f.select("key", "start_ns", "end_ns").join(first, on="key").filter(inside)
           .group_by("key").agg(open=(pl.col("end_ns") - pl.col("start_ns")).sum(),
                                span=(pl.col("b") - pl.col("a")).first())
           .filter(pl.col("span") > 0))
    coverage = float((cov["open"] / cov["span"]).clip(upper_bound=1.0).median()) if cov.height else 0.0
    out.update(timer_cut=dmax >= 10 * resolution_ns and share >= 0.2, timer_share=share, timer_ns=dmax,
               coverage=coverage)
    return out
