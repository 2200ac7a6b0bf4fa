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

from rankscope.analysis.flow_jobs import activity_series

MARGIN = 0.1
"""a longer multiple replaces the period only when it correlates better by this much."""
JITTER = 0.03
"""steps vary by this share around the lag (lognormal jitter of compute and transfers)."""


def whole_step(flows: pl.DataFrame, period_ns: float, resolution_ns: int, max_multiple: int = 8) -> dict:
    """{multiple, step_ns, corr: {k: r}, weak} for the job's payload records (start_ns, end_ns, est_bytes)."""
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
    corr = {}
    for k in range(1, max_multiple + 1):
        lag = k * period_ns / bin_ns
        if 2 * lag > nbins:
            break
        best = -1.0
        for lg in range(max(1, int(lag * (1 - JITTER))), int(np.ceil(lag * (1 + JITTER))) + 1):
            a, b = x[:-lg], x[lg:]
            den = float(np.sqrt((a * a).sum() * (b * b).sum()))
            if den > 0:
                best = max(best, float((a * b).sum() / den))
        corr[k] = round(best, 4)
    if not corr:
        return out
    top = max(corr.values())
    # every multiple of the step repeats too (2 steps later, 3 ...), the later ones over fewer steps and
    # so a little noisier: the step is the first multiple that repeats about as well as the best one
    better = [k for k in corr if corr[k] >= corr[1] + MARGIN and corr[k] >= top - 2 * MARGIN]
    k = min(better) if better else 1
    out.update(multiple=k, step_ns=float(period_ns * k), corr=corr, weak=corr.get(k, 0.0) < 0.5)
    return out
