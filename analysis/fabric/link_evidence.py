"""Per-link evidence of what a link carries: pipeline sends or a collective's traffic.

Each function scores every edge of a job's heavy pair graph from its own
records; :mod:`fabric.grid` weighs these scores when it labels the edges and
fits the grid. A score of 0.5 means the link's records say nothing either way.

- *direction lag*: on a pipeline link the activations start long before the
  gradients; a collective's two directions start together;
- *first traffic*: pipeline links carry the first forward pass, DP links wait
  for the first backward pass.

The busy share of each burst period ("duty": pipeline sends through the step, a collective once) was
read here until it was measured: on 200 jobs of two development corpora it took the right side for 56 %
of 28,011 DP and pipeline links (pipeline sends are short bursts apart by each micro-batch's compute, and
ZeRO-3 gathers or bucketed reductions keep DP links busy); read within one job it was no better (the
pipeline links busier than the DP links in 40 of the 64 jobs that have both); and on five real gloo
DP2 x PP2 captures the pipeline links were busy 13-48 % of their period and the DP links 3-42 %, a slow
NIC's ring the busiest.
It decided grids of two-member groups at confidence 0.99 (a DP2 x TP4 job of dev seed 6 was read as
two-stage pipelines); without it those grids are reported as the ties they are.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.link_models import TWO_WAY

MIN_PP_LAG_NS = 1_000_000
"""a gap between the first payload of the two directions of a link smaller than this says nothing about
which came first, while a pipeline's gradients follow its activations by at least one micro-batch's
forward and backward (5 ms and more on the dev corpus):

- TCP's delayed ACKs share the reverse 5-tuple with the gradients and open its record a round trip
  (microseconds, tens under load) after the data;
- a collective's two directions each start with their own first transfer, and each transfer leaves
  when its queues let it (the simulator's rail jitter: exponential, 200 us mean): on dev corpus seeds
  1-2, 99 % of 2,573 two-way RoCE DP links had their directions' first payloads within 0.9 ms. At the
  earlier floor of 0.1 ms, a DP2 x TP4 job's 0.16-0.25 ms lags on two of its four links read it as
  2-stage pipelines at 0.99 once RoCE ACKs had flows of their own (sim.network.transport)."""


def direction_lag(edges: pl.DataFrame) -> np.ndarray:
    """Per edge: how far apart the two directions' first payload records start (0 where one is missing)."""
    fa = edges["first_ab"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
    fb = edges["first_ba"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
    return np.abs(np.nan_to_num(fa - fb, nan=0.0))


def lag_floor_ns(resolution_ns: int, same_clock: bool | None = True,
                 exporter_skew_ns: int = FlowConfig.max_exporter_skew_ns) -> float:
    """The direction lag below which a link's two first payloads tell nothing of which came first: the
    timestamp noise (20 ticks) or a transport's ACKs (:data:`MIN_PP_LAG_NS`), whichever is larger; and
    when the two directions were timed by different exporters (``same_clock`` not True), the offset two
    exporters' clocks may have (``FlowConfig.max_exporter_skew_ns``): alignment (model.clocks) only
    corrects exporters that saw the same 5-tuples. A RoCE link's reverse record opens with the ACKs
    of the activations, so across two exporters its lag is their clocks' offset, not the pipeline's:
    on the dev corpus, 5 ms offsets ordered 2-stage pipelines backwards at "voted clearly"."""
    floor = max(20 * int(resolution_ns), MIN_PP_LAG_NS)
    return floor if same_clock is True else max(floor, exporter_skew_ns)


def pp_likeness(edges: pl.DataFrame, resolution_ns: int = 1, lag: np.ndarray | None = None) -> np.ndarray:
    """0..1 per edge: payload both ways, the two directions starting at clearly different times.

    The first *payload* record of each direction counts (an ACK flow or a TCP connection opens both
    directions together and says nothing). Lags are judged against the large lags of the job's
    two-way links (PP lags are a share of a step, shrinking towards the last stage, hence the low
    bar of 5 %) and never below the timestamp resolution's noise (20 ticks). ``lag``: the
    :func:`direction_lag` of ``edges`` when the caller has it.
    """
    sym = edges["data_symmetry"].fill_null(0.0).fill_nan(0.0).to_numpy() if "data_symmetry" in edges.columns \
        else edges["symmetry"].fill_null(0.0).fill_nan(0.0).to_numpy()
    lag = direction_lag(edges) if lag is None else lag
    two = sym >= TWO_WAY
    ref = np.quantile(lag[two], 0.9) if two.any() else 0.0
    ref = max(ref, 20.0 * resolution_ns / 0.05)
    return np.clip(sym / TWO_WAY, 0, 1) * np.clip(lag / (0.05 * ref), 0, 1)


def link_likeness(edges: pl.DataFrame, resolution_ns: int = 1) -> np.ndarray:
    """0..1 per edge: the evidence that it is a pipeline link rather than a collective's, 0.5 for none.

    The direction lag (:func:`pp_likeness`), but only where the two directions' first payload are further
    apart than a transport's ACKs could make them (see MIN_PP_LAG_NS: with TCP or RoCE ACKs on the reverse
    5-tuple both directions open together whatever the traffic, so a zero lag is no evidence of a
    collective).
    """
    lag = direction_lag(edges)
    seen = lag > lag_floor_ns(resolution_ns)
    return np.where(seen, pp_likeness(edges, resolution_ns, lag), 0.5)


def early_traffic(edges: pl.DataFrame) -> np.ndarray:
    """1 for edges whose traffic starts in the early group, 0 for the late one, 0.5 when unclear.

    Pipeline links carry the first forward pass, DP links wait for the first
    backward pass to end; so when the capture saw the job start, the first
    record of each link splits into an early (PP) and a late (DP) cluster.
    The two clusters are the optimal 1-D 2-means split of the first starts
    (exact over the sorted values: what scikit-learn's KMeans(k=2) searches for,
    without its ~1 s import on every analyze); the split counts only when the
    gap between the clusters is wider than each cluster's spread.
    """
    first = edges.select(pl.min_horizontal("first_ab", "first_ba")).to_series().to_numpy().astype(float)
    out = np.full(len(first), 0.5)
    ok = np.isfinite(first)
    if ok.sum() < 4 or np.ptp(first[ok]) <= 0:
        return out
    x = first[ok] - first[ok].min()
    cut = two_means_cut(x)
    a, b = x[x < cut], x[x >= cut]
    if len(a) and len(b) and b.min() - a.max() > max(np.ptp(a), np.ptp(b)):
        out[ok] = (x < cut).astype(float)
    return out


def two_means_cut(x: np.ndarray) -> float:
    """The threshold of the least-squares split of 1-D values into two clusters (lower: < cut)."""
    raw = np.sort(np.asarray(x, dtype=float))
    n = len(raw)
    if n < 2 or raw[0] == raw[-1]:
        return float("inf")
    # on [0, 1], so the running sums of squares of nanosecond times do not cancel
    v = (raw - raw[0]) / (raw[-1] - raw[0])
    c1, c2 = np.cumsum(v), np.cumsum(v * v)
    k = np.arange(1, n)  # the lower cluster holds v[:k]
    lo_sse = c2[k - 1] - c1[k - 1] ** 2 / k
    hi_sum, hi_sq = c1[-1] - c1[k - 1], c2[-1] - c2[k - 1]
    hi_sse = hi_sq - hi_sum ** 2 / (n - k)
    sse = np.where(v[k] > v[k - 1], lo_sse + hi_sse, np.inf)  # never cut between equal values
    best = int(np.argmin(sse)) + 1
    return float((raw[best - 1] + raw[best]) / 2)
