"""Rails of one job: pair-graph components that burst together, joined into one job.

The correlation works on binned activity series, not on records, so that a capture split into partitions
(runner.capture_rails) bins each partition apart, sums the bins and joins its rails by the same functions
as the records read whole here: :func:`activity_events` (what a record adds to which bin),
:func:`activity_views` (the normalised series of one component) and :func:`join_correlated`.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.fabric.config import FlowConfig

VOLUME_TOLERANCE = 0.25
"""copies of one job differ in volume by at most this share of the larger."""

DIRECT_LAGS = 16
"""up to this many lags, correlate lag by lag (a dot product each); beyond, by FFT."""

NUM_VIEWS = 3
"""views of a component's activity: bytes spread over each record, record opens and closes, opens."""


def activity_series(start: np.ndarray, end: np.ndarray, bytes_: np.ndarray, t0: int, bin_ns: int,
              nbins: int) -> np.ndarray:
    """Bytes per time bin, each record's bytes spread evenly over the bins it spans."""
    bins, values = _spread_events(start, end, bytes_, t0, bin_ns, nbins)[:2]
    return np.cumsum(np.bincount(bins, weights=values, minlength=nbins + 1)[:-1])


def _spread_events(start, end, bytes_, t0: int, bin_ns: int, nbins: int) -> tuple:
    """(bins, values) of the bytes-spread deltas, then the start and end bins."""
    sb = np.clip((start - t0) // bin_ns, 0, nbins - 1)
    eb = np.clip((end - t0) // bin_ns, 0, nbins - 1)
    span_end = np.maximum(eb, sb)
    rate = bytes_ / (span_end - sb + 1)
    return np.r_[sb, span_end + 1], np.r_[rate, -rate], sb, eb


def activity_events(start: np.ndarray, end: np.ndarray, bytes_: np.ndarray, t0: int, bin_ns: int,
                    nbins: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """What each record adds to each view's bins, as (bins, values) per view: 0, the deltas of the bytes
    spread over its bins (+rate where it starts, -rate past its end; nbins + 1 bins, cumulated later);
    1, one at the bin of its start and one at its end's; 2, one at its start's. Sums per bin add up across
    any split of the records, so partitions of a capture bin apart and sum (runner.capture_rails)."""
    bins, values, sb, eb = _spread_events(start, end, bytes_, t0, bin_ns, nbins)
    ones = np.ones(len(sb))
    return [(bins, values), (np.r_[sb, eb], np.r_[ones, ones]), (sb, ones)]


def binned_activity(start: np.ndarray, end: np.ndarray, bytes_: np.ndarray, t0: int, bin_ns: int,
                    nbins: int) -> list[np.ndarray]:
    """The three binned series of :func:`activity_events` (spread deltas over nbins + 1 bins, the opens
    and closes, the opens), each bin summed in record order."""
    return [np.bincount(b, weights=v, minlength=n)
            for (b, v), n in zip(activity_events(start, end, bytes_, t0, bin_ns, nbins), (nbins + 1, nbins, nbins))]


def activity_views(series: list[np.ndarray]) -> list[np.ndarray | None]:
    """The normalised views of one component from its :func:`binned_activity` (or the sums of its
    partitions'), each mean-removed and of unit norm; None for a flat one."""
    # two views of the same timing: bytes spread over each record (bursts), and the instants records open
    # and close (all that is left when records last as long as the capture). The opens alone: a record
    # opens at its first packet, when the rails' lockstep collectives start together, while its close may
    # wait for the exporter's timers or the last rank to finish (rails of one job whose records last the
    # whole job opened in the same tick and closed 16 ms apart)
    spread = np.cumsum(series[0][:-1])
    # an instant near a bin edge lands in either bin: give each a neighbour on both sides
    events = np.convolve(series[1], np.ones(3), mode="same")
    opens = np.convolve(series[2], np.ones(3), mode="same")
    views = []
    for x in (spread, events, opens):
        x = x - x.mean()
        norm = float(np.sqrt((x * x).sum()))
        views.append(x / norm if norm > 0 else None)
    return views


def rail_bins(t0: int, t1: int, config: FlowConfig, resolution_ns: int) -> tuple[int, int, int]:
    """(bin_ns, nbins, max_lag) of the series of activity from ``t0`` to ``t1``: the bin is the coarser of
    ``sync_tolerance_ns`` and four timestamp ticks, so millisecond exporters still line up, doubled until
    at most 2**18 bins; the lag search reaches ``max_exporter_skew_ns``, each exporter's clock offset."""
    bin_ns = max(int(config.sync_tolerance_ns), 4 * int(resolution_ns), 1)
    while (t1 - t0) // bin_ns > (1 << 18):
        bin_ns *= 2
    return bin_ns, int((t1 - t0) // bin_ns) + 1, int(np.ceil(config.max_exporter_skew_ns / bin_ns))


def _lag_correlations(a: np.ndarray, b: np.ndarray, max_lag: int, spectra: dict, key: tuple) -> np.ndarray:
    """sum over i of a[i + m] * b[i] for m = -max_lag..max_lag (zero past the ends): lag by lag when the
    window is narrow (a few dot products cost less than transforms of the whole series), else by FFT over
    just enough padding for the window (``spectra`` keeps each series' transform, ``key`` names the pair
    of series); the two agree to rounding."""
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


def peak_correlation(views_a: list, views_b: list, max_lag: int, spectra: dict | None = None,
                     comps: tuple = (0, 1)) -> tuple[float, int]:
    """(peak normalised cross-correlation, its lag in bins) of two components' :func:`activity_views` over
    lags -max_lag..max_lag; the best-correlated view counts, (-1.0, 0) when none does. A peak at either
    end of the window is still rising towards a lag past the exporters' largest skew, so it is no
    alignment (two jobs whose slowly varying activity correlates at every lag); a real clock offset within
    the bound peaks inside. ``spectra``: transforms kept across calls, named by (``comps``' item, view)."""
    spectra = {} if spectra is None else spectra
    best = (-1.0, 0)
    for view, (a, b) in enumerate(zip(views_a, views_b)):
        if a is None or b is None:
            continue
        cc = _lag_correlations(a, b, max_lag, spectra, ((comps[0], view), (comps[1], view)))
        k = int(np.argmax(cc))
        if 0 < max_lag and k in (0, len(cc) - 1):
            continue
        if cc[k] > best[0]:
            best = (float(cc[k]), k - max_lag)
    return best


def find(parent: list, x: int) -> int:
    """The root of ``x`` in the union-find ``parent``, halving the path on the way."""
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def union_rendezvous(parent: list, node_lab: dict, rendezvous: pl.DataFrame) -> None:
    """Join the components of every rendezvous server and its clients (``rendezvous``: src_addr, dst_addr
    on rendezvous ports)."""
    # the server may be a rank of the job or a host of its own: join all its clients
    for (server,), g in rendezvous.group_by("dst_addr"):
        labs = sorted({node_lab[x] for x in [server, *g["src_addr"].to_list()] if x in node_lab})
        for other in labs[1:]:
            if find(parent, other) != find(parent, labs[0]):
                parent[find(parent, other)] = find(parent, labs[0])


def candidate_pairs(lab: np.ndarray, volume: dict) -> list[tuple[int, int]]:
    """(a, b), a < b: components that may be copies of one job, of one size (at least 2) and volumes
    (``volume``: component -> bytes inside it) within VOLUME_TOLERANCE; their correlation decides."""
    size = np.bincount(lab, minlength=int(lab.max()) + 1 if len(lab) else 0)
    cand = [c for c in range(len(size)) if size[c] >= 2 and c in volume]
    return [(a, b) for i, a in enumerate(cand) for b in cand[i + 1:] if size[a] == size[b]
            and abs(volume[a] - volume[b]) <= VOLUME_TOLERANCE * max(volume[a], volume[b])]


def join_correlated(parent: list, pairs: list[tuple[int, int]], views: dict, max_lag: int,
                    config: FlowConfig) -> None:
    """Join each pair of ``pairs`` (in order) not joined already whose views (``views``: component ->
    :func:`activity_views`) correlate at least ``rail_min_correlation``."""
    spectra: dict = {}
    for a, b in sorted(pairs):
        if a not in views or b not in views or find(parent, a) == find(parent, b):
            continue
        if peak_correlation(views[a], views[b], max_lag, spectra, (a, b))[0] >= config.rail_min_correlation:
            parent[find(parent, b)] = find(parent, a)


def _component_views(flows: pl.DataFrame, comps: list[int], t0: int, bin_ns: int, nbins: int) -> dict:
    views = {}
    for (c,), g in flows.filter(pl.col("c").is_in(comps)).group_by("c"):
        views[int(c)] = activity_views(binned_activity(g["start_ns"].to_numpy(), g["end_ns"].to_numpy(),
                                                       g["est_bytes"].to_numpy().astype(float), t0, bin_ns, nbins))
    return views


def rail_correlations(flows: pl.DataFrame, comps: list[int], config: FlowConfig,
                      resolution_ns: int) -> tuple[dict[tuple[int, int], tuple[float, int]], int]:
    """:func:`peak_correlation` (and its lag in bins) of the binned activity of each pair of ``comps``,
    with the bin width (:func:`rail_bins`). Needs flows c (component), start_ns, end_ns, est_bytes."""
    if len(comps) < 2 or flows.is_empty():
        return {}, 0
    t0 = int(flows["start_ns"].min())
    bin_ns, nbins, max_lag = rail_bins(t0, int(flows["end_ns"].max()), config, resolution_ns)
    views = _component_views(flows, comps, t0, bin_ns, nbins)
    keys, spectra = sorted(views), {}
    return {(a, b): peak_correlation(views[a], views[b], max_lag, spectra, (a, b))
            for i, a in enumerate(keys) for b in keys[i + 1:]}, bin_ns


def merge_components(nodes: list[str], lab: np.ndarray, flows: pl.DataFrame, control: pl.DataFrame,
                     config: FlowConfig, resolution_ns: int) -> np.ndarray:
    """Merge pair-graph components that are one job; returns a job label per node.

    Rail-optimised fabrics keep each tensor-parallel rank's traffic on its own
    rail, so one job shows up as several disconnected copies of its DP x PP
    graph. Two pieces of evidence join them: (1) every rank of a job connects
    to the job's rendezvous store (``rendezvous_ports``), so components whose
    endpoints talk to one rendezvous server are one job; (2) without that,
    copies of one size whose traffic carries the same bytes and whose record
    starts and ends coincide within ``sync_tolerance_ns`` after one clock offset (lockstep).
    Needs flows src_addr, dst_addr, start_ns, est_bytes; control flows src_addr, dst_addr, dst_port.
    ``resolution_ns``: how finely ``flows``' times order anything (fabric.clock.flow_resolution_ns).
    """
    ncomp = int(lab.max()) + 1 if len(lab) else 0
    node_lab = dict(zip(nodes, lab.tolist()))
    parent = list(range(ncomp))
    if not control.is_empty():
        union_rendezvous(parent, node_lab, control.filter(pl.col("dst_port").is_in(list(config.rendezvous_ports))))
    # only the traffic inside each copy: a rail's NIC may also talk to storage or control hosts
    f = flows.select("src_addr", "dst_addr", "start_ns", "end_ns", "est_bytes").with_columns(
        c=pl.col("src_addr").replace_strict(node_lab, default=-1, return_dtype=pl.Int64),
        cd=pl.col("dst_addr").replace_strict(node_lab, default=-2, return_dtype=pl.Int64),
    ).filter((pl.col("c") >= 0) & (pl.col("c") == pl.col("cd")))
    volume = {int(c): float(v) for c, v in f.group_by("c").agg(v=pl.col("est_bytes").sum()).iter_rows()}
    pairs = candidate_pairs(lab, volume)
    if pairs:
        t0 = int(f["start_ns"].min())
        bin_ns, nbins, max_lag = rail_bins(t0, int(f["end_ns"].max()), config, resolution_ns)
        views = _component_views(f, sorted({c for ab in pairs for c in ab}), t0, bin_ns, nbins)
        join_correlated(parent, pairs, views, max_lag, config)
    return np.array([find(parent, c) for c in lab.tolist()], dtype=np.int64)
