"""fabric.rails.merge_components for a capture split into partitions: rendezvous and volumes from the merged
partial, the activity series summed over a second pass of the partitions.

Why a second pass: the series are binned from the capture's first to its last record inside a rail, with
a bin that depends on the capture's clock, both known only after the first pass is merged. Each partition
then bins its own records (bins add up across any split); only the rails that some other rail could be a
copy of (same size, volume within a quarter, the tests merge_components makes before the correlation) are
binned at all, which on a fabric of unrelated jobs is few.

The series of bytes spread over each record is a float sum: added in another order than the embedded
engine's, it differs in the last bits, and so may the correlations; a merge decision could change only for
a correlation within ~1e-12 of ``rail_min_correlation``. The two instant views are counts, exact.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import polars as pl

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.pair_traffic import pair_traffic
from rankscope.analysis.runner.capture_partials import FlowPartial

VOLUME_TOLERANCE = 0.25
"""as fabric.rails.merge_components: copies of one job differ in volume by at most this share."""


@dataclass
class RailPlan:
    """What the second pass bins, and what the merge needs besides the series."""

    lab: np.ndarray
    """the rails component of each node."""
    node_comp: dict
    """address -> rails component."""
    parent: list
    """union-find parents after the rendezvous unions."""
    comps: list
    """components to bin (in some pair of ``pairs``)."""
    pairs: list
    """(a, b), a < b: component pairs of one size and close volumes, whose correlation decides."""
    t0: int = 0
    bin_ns: int = 1
    nbins: int = 1
    max_lag: int = 0


def _find(parent: list, x: int) -> int:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def _union_rendezvous(parent: list, node_comp: dict, rendezvous: pl.DataFrame) -> None:
    # the server may be a rank of the job or a host of its own: join all its clients
    for (server,), g in rendezvous.group_by("dst_addr"):
        labs = sorted({node_comp[x] for x in [server, *g["src_addr"].to_list()] if x in node_comp})
        for other in labs[1:]:
            if _find(parent, other) != _find(parent, labs[0]):
                parent[_find(parent, other)] = _find(parent, labs[0])


def rail_plan(nodes: list[str], lab: np.ndarray, p: FlowPartial, config: FlowConfig, resolution_ns: int) -> RailPlan:
    """The rendezvous unions and the series to bin, from the capture's merged partial (as
    fabric.rails.merge_components and rail_correlations compute them from the records)."""
    ncomp = int(lab.max()) + 1 if len(lab) else 0
    node_comp = dict(zip(nodes, lab.tolist()))
    parent = list(range(ncomp))
    _union_rendezvous(parent, node_comp, p.rendezvous)
    # only the traffic inside each component, every exporter's records (as merge_components reads them)
    inside = (p.pair_exp.with_columns(c=pl.col("src_addr").replace_strict(node_comp, default=-1, return_dtype=pl.Int64),
                                      cd=pl.col("dst_addr").replace_strict(node_comp, default=-2, return_dtype=pl.Int64))
              .filter((pl.col("c") >= 0) & (pl.col("c") == pl.col("cd"))))
    plan = RailPlan(lab, node_comp, parent, [], [])
    if inside.is_empty():
        return plan
    volume = {int(c): float(v) for c, v in inside.group_by("c").agg(v=pl.col("bytes").sum()).iter_rows()}
    size = np.bincount(lab, minlength=ncomp)
    cand = [c for c in range(ncomp) if size[c] >= 2 and c in volume]
    if len(cand) < 2:
        return plan
    plan.pairs = [(a, b) for i, a in enumerate(cand) for b in cand[i + 1:] if size[a] == size[b]
                  and abs(volume[a] - volume[b]) <= VOLUME_TOLERANCE * max(volume[a], volume[b])]
    plan.comps = sorted({c for ab in plan.pairs for c in ab})
    t0, t1 = int(inside["first_ns"].min()), int(inside["last_ns"].max())
    bin_ns = max(int(config.sync_tolerance_ns), 4 * int(resolution_ns), 1)
    while (t1 - t0) // bin_ns > (1 << 18):
        bin_ns *= 2
    plan.t0, plan.bin_ns, plan.nbins = t0, bin_ns, int((t1 - t0) // bin_ns) + 1
    plan.max_lag = int(np.ceil(config.max_exporter_skew_ns / bin_ns))
    return plan


def rail_series(flow: pl.DataFrame, config: FlowConfig, plan: RailPlan) -> pl.DataFrame:
    """One partition's share of the activity series of ``plan.comps``: c, view (0 bytes-spread deltas,
    1 record opens and closes, 2 opens), bin, v; summed over the partitions they are the series
    fabric.rails.rail_correlations bins from the whole capture."""
    out = pl.DataFrame(schema={"c": pl.Int64, "view": pl.Int8, "bin": pl.Int64, "v": pl.Float64})
    if not plan.comps or flow.is_empty():
        return out
    # the records inside the binned rails first (cheap, and most of a fabric's records may be elsewhere),
    # then pair_traffic's own record by record classification of what is training traffic
    binned = [a for a, c in plan.node_comp.items() if c in set(plan.comps)]
    inside = flow.filter(pl.col("src_addr").is_in(binned) & pl.col("dst_addr").is_in(binned))
    if inside.is_empty():
        return out
    keep = pair_traffic(inside, config).training_flows
    f = keep.select("src_addr", "dst_addr", "start_ns", "end_ns", "est_bytes").with_columns(
        c=pl.col("src_addr").replace_strict(plan.node_comp, default=-1, return_dtype=pl.Int64),
        cd=pl.col("dst_addr").replace_strict(plan.node_comp, default=-2, return_dtype=pl.Int64),
    ).filter((pl.col("c") == pl.col("cd")) & pl.col("c").is_in(plan.comps))
    if f.is_empty():
        return out
    c = f["c"].to_numpy()
    st, en = f["start_ns"].to_numpy() - plan.t0, f["end_ns"].to_numpy() - plan.t0
    sb = np.clip(st // plan.bin_ns, 0, plan.nbins - 1)
    eb = np.clip(en // plan.bin_ns, 0, plan.nbins - 1)
    rate = f["est_bytes"].to_numpy().astype(float) / (np.maximum(eb, sb) - sb + 1)
    parts = [(c, 0, sb, rate), (c, 0, np.maximum(eb, sb) + 1, -rate), (c, 1, sb, 1.0), (c, 1, eb, 1.0),
             (c, 2, sb, 1.0)]
    rows = pl.concat([pl.DataFrame({"c": cc, "view": np.full(len(cc), view, np.int8), "bin": b.astype(np.int64),
                                    "v": np.broadcast_to(np.asarray(v, float), len(cc))})
                      for cc, view, b, v in parts])
    return rows.group_by(["c", "view", "bin"]).agg(pl.col("v").sum())


def _dense_series(series: Iterable[pl.DataFrame], nbins: int) -> dict[int, list[np.ndarray]]:
    """Per component its three binned series (bytes-spread deltas over nbins + 1 bins, record opens and
    closes, opens), summed from the partitions' shares as each arrives: no partition's share outlives its sum."""
    dense: dict[int, list[np.ndarray]] = {}
    for rows in series:
        for (c, view), g in rows.group_by(["c", "view"]):
            arrs = dense.setdefault(int(c), [np.zeros(nbins + 1), np.zeros(nbins), np.zeros(nbins)])
            np.add.at(arrs[int(view)], g["bin"].to_numpy(), g["v"].to_numpy())
    return dense


def _views(dense: list[np.ndarray]) -> list:
    """The three normalised series of one component, as fabric.rails.rail_correlations makes them before
    its FFT (None: a flat series)."""
    spread = np.cumsum(dense[0][:-1])
    # an instant near a bin edge lands in either bin: give each a neighbour on both sides
    events = np.convolve(dense[1], np.ones(3), mode="same")
    opens = np.convolve(dense[2], np.ones(3), mode="same")
    views = []
    for x in (spread, events, opens):
        x = x - x.mean()
        norm = float(np.sqrt((x * x).sum()))
        views.append(x / norm if norm > 0 else None)
    return views


DIRECT_LAGS = 16
"""up to this many lags, correlate lag by lag (a dot product each); beyond, by FFT."""


def _lag_correlations(a: np.ndarray, b: np.ndarray, max_lag: int, spectra: dict, key: tuple) -> np.ndarray:
    """sum over i of a[i + m] * b[i] for m = -max_lag..max_lag (zero past the ends), as the FFT of
    rail_correlations gives it: lag by lag when the window is narrow (a few dot products cost less than
    transforms of the whole series), else by FFT over just enough padding for the window (``spectra``
    keeps each series' transform, ``key`` names the pair of series); the sums agree to rounding."""
    n = len(a)
    if 2 * max_lag + 1 <= DIRECT_LAGS:
        return np.array([0.0 if abs(m) >= n else float(np.dot(a[m:], b[:n - m])) if m >= 0
                         else float(np.dot(a[:n + m], b[-m:])) for m in range(-max_lag, max_lag + 1)])
    size = 1 << int(np.ceil(np.log2(n + max_lag + 1)))
    for k, x in zip(key, (a, b)):
        if k not in spectra:
            spectra[k] = np.fft.rfft(x, size)
    fa, fb = spectra[key[0]], spectra[key[1]]
    lags = np.r_[np.arange(size - max_lag, size), np.arange(0, max_lag + 1)]
    return np.fft.irfft(fa * np.conj(fb), size)[lags]


def _peak_correlation(view_pairs: list, max_lag: int, spectra: dict | None = None, comps: tuple = (0, 1)) -> float:
    """rail_correlations' peak: the largest cross-correlation over lags -max_lag..max_lag of the best view,
    a peak at either end of the window not counting (still rising towards a lag past the exporters' skew)."""
    spectra = {} if spectra is None else spectra
    best = -1.0
    for view, (a, b) in enumerate(view_pairs):
        if a is None or b is None:
            continue
        cc = _lag_correlations(a, b, max_lag, spectra, ((comps[0], view), (comps[1], view)))
        k = int(np.argmax(cc))
        if 0 < max_lag and k in (0, len(cc) - 1):
            continue
        best = max(best, float(cc[k]))
    return best


def rail_labels(plan: RailPlan, series: Iterable[pl.DataFrame], config: FlowConfig) -> np.ndarray:
    """The job label per node (fabric.rails.merge_components), from the plan and every partition's series."""
    parent = list(plan.parent)
    if plan.pairs:
        dense = _dense_series(series, plan.nbins)
        spec = {c: _views(dense.pop(c)) for c in sorted(dense)}
        spectra: dict = {}
        for a, b in sorted(plan.pairs):
            if a not in spec or b not in spec or _find(parent, a) == _find(parent, b):
                continue
            r = _peak_correlation(list(zip(spec[a], spec[b])), plan.max_lag, spectra, (a, b))
            if r >= config.rail_min_correlation:
                parent[_find(parent, b)] = _find(parent, a)
    return np.array([_find(parent, c) for c in plan.lab.tolist()], dtype=np.int64)
