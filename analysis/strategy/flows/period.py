"""The whole training step from a period found in flow records.

A period read off one link's bursts may be a whole fraction of the step:
bucketed all-reduces, ZeRO's reduce-scatter and all-gather, and pipeline
stages each burst several times a step. The job's total traffic, though,
repeats only once a step (forward, backward, gradient sync, optimizer
barrier): its activity correlates best with itself one whole step later. So
each whole multiple ``k * period`` that the capture holds at least twice is
scored by the autocorrelation of the job's binned activity at that lag (best
within a few per cent, for step-to-step jitter), and the multiple that
correlates clearly best is the step. When no multiple stands out the period
is kept; when the best is weak the step is flagged as uncertain.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.fabric.rails import activity_series

MARGIN = 0.1
"""a longer multiple replaces the period only when it correlates better by this much."""
JITTER = 0.03
"""steps vary by this share around the lag (lognormal jitter of compute and transfers)."""
MIN_REPEATS = 3
"""a longer multiple replaces the period only where the capture holds it this many times. Its
autocorrelation is measured over the capture less one lag: held fewer than 3 times, that is one or two
repeats, and when the period is the step every multiple repeats about equally well, so noise alone lifts
one past the margin (a real gloo job in network namespaces, 6 steps of 3.8 s in a 27 s capture: 3 steps
of 11.6 s once in 13 runs)."""


def whole_step(flows: pl.DataFrame, period_ns: float, resolution_ns: int, max_multiple: int = 8) -> dict:
    """{multiple, step_ns, corr: {k: r}, weak[, short][, unconfirmed_multiple]} for the job's payload records
    (start_ns, end_ns, est_bytes).

    ``short``: the capture holds the period fewer than twice, so nothing confirms it.
    ``unconfirmed_multiple``: the multiple that correlated better but that the capture holds fewer than
    :data:`MIN_REPEATS` times (the period is kept, and ``weak``)."""
    out = {"multiple": 1, "step_ns": float(period_ns), "corr": {}, "weak": False}
    if flows.is_empty() or not period_ns:
        return out
    t0, t1 = int(flows["start_ns"].min()), int(flows["end_ns"].max())
    span = t1 - t0
    bin_ns = max(int(period_ns / 100), 4 * int(resolution_ns), 1)
    nbins = int(span // bin_ns) + 1
    x = activity_series(flows["start_ns"].to_numpy(), flows["end_ns"].to_numpy(),
                  flows["est_bytes"].to_numpy().astype(float), t0, bin_ns, nbins)
    x = x - x.mean()
    if not (x * x).sum():
        return out
    corr, at = {}, {}
    for k in range(1, max_multiple + 1):
        lag = k * period_ns / bin_ns
        if 2 * lag > nbins:
            break
        lags = np.arange(max(1, int(lag * (1 - JITTER))), int(np.ceil(lag * (1 + JITTER))) + 1)
        r = np.array([_corr(x, int(lg)) for lg in lags])
        i = int(np.argmax(r))
        corr[k] = round(float(r[i]), 4)
        at[k] = _peak(lags, r, i) * bin_ns
    if not corr:
        # a period seen fewer than twice cannot be told from a multiple of the step
        out.update(weak=True, short=True)
        return out
    top = max(corr.values())
    # every multiple of the step repeats too (2 steps later, 3 ...), the later ones over fewer steps and
    # so a little noisier: the step is the first multiple that repeats about as well as the best one
    better = [k for k in corr if corr[k] >= corr[1] + MARGIN and corr[k] >= top - 2 * MARGIN]
    held = [k for k in better if span >= MIN_REPEATS * k * period_ns]
    k = min(held) if held else 1
    if better and not held:
        # a longer repeat correlates better, but over too few repeats to be told from noise: the period
        # stays, said to be uncertain, never silently read as a multiple or kept as sure
        out["unconfirmed_multiple"] = min(better)
    # a multiple is measured where the job's traffic repeats best (k periods carry k times the period's
    # error); the period itself is kept when it is the step
    step = float(at[k]) if k > 1 else float(period_ns)
    out.update(multiple=k, step_ns=step, corr=corr, weak=corr.get(k, 0.0) < 0.5 or "unconfirmed_multiple" in out)
    # the period may itself be a multiple of the step (records cut by the exporter's timer beat with
    # the step): traffic that repeats as well at a whole fraction of it leaves the step undecided
    frac = {}
    for m in range(2, 5):
        lag = step / m / bin_ns
        if lag < 4:
            break
        lags = np.arange(max(1, int(lag * (1 - JITTER))), int(np.ceil(lag * (1 + JITTER))) + 1)
        frac[m] = round(max(_corr(x, int(lg)) for lg in lags), 4)
    out["fraction_corr"] = frac
    out["fraction"] = next((m for m in sorted(frac, reverse=True) if frac[m] >= corr[k] - MARGIN), None)
    return out


def _corr(x: np.ndarray, lag: int) -> float:
    a, b = x[:-lag], x[lag:]
    den = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else -1.0


def _peak(lags: np.ndarray, r: np.ndarray, i: int) -> float:
    """The lag of the autocorrelation peak, between bins by a parabola through its neighbours."""
    if 0 < i < len(r) - 1:
        den = r[i - 1] - 2 * r[i] + r[i + 1]
        if den < 0:
            return float(lags[i] + 0.5 * (r[i - 1] - r[i + 1]) / den)
    return float(lags[i])


def step_period(keys: np.ndarray, times_ns: np.ndarray, max_candidates: int = 40,
                max_divisor: int = 24) -> float | None:
    """The step period from the start times of periodic traffic, or None.

    ``keys``: which pair each time belongs to; ``times_ns``: record starts
    (aligned). Exporters start a record at the first packet after the last
    record closed, so record starts sit on traffic bursts but may skip some
    (when the active timeout is longer than a step) or add some inside a long
    burst. Consecutive starts of one pair are then close to whole multiples of
    the step, ``k * P``: the period is the longest candidate on which the
    differences are phase-coherent (mean cos(2 pi d / P) near its maximum;
    P/2, P/3 are coherent too, 2P is not), refined as the median of d / k.
    """
    if len(times_ns) < 3:
        return None
    order = np.lexsort((times_ns, keys))
    k, t = keys[order], times_ns[order].astype(np.int64)
    # a link whose records split each step's traffic in b bursts (an idle timeout shorter than a pure
    # pipeline's pause between its forward and backward sends: V3, PP16) repeats only every b starts
    for lag in range(1, MAX_BURSTS_PER_STEP + 1):
        same = k[lag:] == k[:-lag]
        p = _period_of(t[lag:][same] - t[:-lag][same], max_candidates, max_divisor)
        if p is not None:
            return p
    return None


MAX_BURSTS_PER_STEP = 4
"""a link's records are read as up to this many bursts a step (lag 1 first: one burst a step)."""


def _period_of(diffs: np.ndarray, max_candidates: int, max_divisor: int) -> float | None:
    """The longest period on which distances between record starts of one pair are phase-coherent (step_period)."""
    d = diffs.astype(np.float64)
    d = d[d > 0]
    if len(d) < 2:
        return None
    if len(d) > 5000:
        d = np.random.default_rng(0).choice(d, 5000, replace=False)
    # candidates: the most frequent distinct diffs (to 0.5 %) and their whole fractions, since a
    # pair whose records outlast several steps only ever shows multiples of the period
    q = np.round(np.log(d) / 0.005)
    vals, inv, cnt = np.unique(q, return_inverse=True, return_counts=True)
    top = np.argsort(-cnt)[:max_candidates]
    base = np.array([np.median(d[inv == j]) for j in top])
    cand = (base[:, None] / np.arange(1, max_divisor + 1)[None, :]).ravel()
    coh = np.cos(2 * np.pi * d[None, :] / cand[:, None]).mean(axis=1)
    best = coh.max()
    if best < 0.5:
        return None
    p0 = cand[coh >= best - 0.05 * (1 + best)].max()
    kk = np.round(d / p0)
    ok = (kk >= 1) & (np.abs(d / np.maximum(kk, 1) - p0) < 0.05 * p0)
    return float(np.median(d[ok] / kk[ok])) if ok.any() else float(p0)


def period_steps(t_first_ns: int, t_last_ns: int, period_ns: float) -> list[int]:
    """Step starts every ``period_ns`` from the first periodic record to the last one."""
    n = int(np.floor((t_last_ns - t_first_ns) / period_ns + 0.5)) + 1
    return [int(round(t_first_ns + i * period_ns)) for i in range(max(n, 0))]
