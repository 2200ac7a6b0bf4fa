"""Rails of one job: pair-graph components that burst together, joined into one job."""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.fabric.config import FlowConfig


def activity_series(start: np.ndarray, end: np.ndarray, bytes_: np.ndarray, t0: int, bin_ns: int,
              nbins: int) -> np.ndarray:
    """Bytes per time bin, each record's bytes spread evenly over the bins it spans."""
    sb = np.clip((start - t0) // bin_ns, 0, nbins - 1)
    eb = np.clip((end - t0) // bin_ns, 0, nbins - 1)
    eb = np.maximum(eb, sb)
    rate = bytes_ / (eb - sb + 1)
    d = np.zeros(nbins + 1)
    np.add.at(d, sb, rate)
    np.add.at(d, eb + 1, -rate)
    return np.cumsum(d[:-1])


def rail_correlations(flows: pl.DataFrame, comps: list[int], config: FlowConfig,
                      resolution_ns: int) -> tuple[dict[tuple[int, int], tuple[float, int]], int]:
    """Peak normalised cross-correlation (and its lag in bins) of the binned activity of each pair of
    components, over lags up to ``max_exporter_skew_ns``; returns it with the bin width. Activity is
    seen three ways, bytes spread over each record, the instants records open and close, and the
    instants they open; the best-correlated view counts.

    Needs flows c (component), start_ns, end_ns, est_bytes. The bin is the coarser of
    ``sync_tolerance_ns`` and four timestamp ticks, so millisecond exporters still line up; the lag
    search absorbs each exporter's clock offset.
    """
    out: dict[tuple[int, int], tuple[float, int]] = {}
    if len(comps) < 2 or flows.is_empty():
        return out, 0
    t0, t1 = int(flows["start_ns"].min()), int(flows["end_ns"].max())
    bin_ns = max(int(config.sync_tolerance_ns), 4 * int(resolution_ns), 1)
    while (t1 - t0) // bin_ns > (1 << 18):
        bin_ns *= 2
    nbins = int((t1 - t0) // bin_ns) + 1
    max_lag = int(np.ceil(config.max_exporter_skew_ns / bin_ns))
    size = 1 << int(np.ceil(np.log2(2 * nbins + 1)))
    spec: dict[int, list[np.ndarray]] = {}
    for (c,), g in flows.filter(pl.col("c").is_in(comps)).group_by("c"):
        st, en = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
        # two views of the same timing: bytes spread over each record (bursts), and the instants
        # records open and close (all that is left when records last as long as the capture)
        spread = activity_series(st, en, g["est_bytes"].to_numpy().astype(float), t0, bin_ns, nbins)
        events = np.bincount(np.clip(np.r_[st - t0, en - t0] // bin_ns, 0, nbins - 1), minlength=nbins)
        # the opens alone: a record opens at its first packet, when the rails' lockstep collectives start
        # together, while its close may wait for the exporter's timers or the last rank to finish (rails
        # of one job whose records last the whole job opened in the same tick and closed 16 ms apart)
        opens = np.bincount(np.clip((st - t0) // bin_ns, 0, nbins - 1), minlength=nbins)
        # an instant near a bin edge lands in either bin: give each a neighbour on both sides
        events = np.convolve(events, np.ones(3), mode="same")
        opens = np.convolve(opens, np.ones(3), mode="same")
        views = []
        for x in (spread, events.astype(float), opens.astype(float)):
            x = x - x.mean()
            norm = float(np.sqrt((x * x).sum()))
            views.append(np.fft.rfft(x / norm, size) if norm > 0 else None)
        spec[int(c)] = views
    keys = sorted(spec)
    # lags -max_lag..max_lag in order: a peak at either end is still rising towards a lag past the
    # exporters' largest skew, so it is no alignment (two jobs whose slowly varying activity correlates
    # at every lag); a real clock offset within the bound peaks inside the window
    lags = np.r_[np.arange(size - max_lag, size), np.arange(0, max_lag + 1)]
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            best = (-1.0, 0)
            for va, vb in zip(spec[a], spec[b]):
                if va is None or vb is None:
                    continue
                cc = np.fft.irfft(va * np.conj(vb), size)[lags]
                k = int(np.argmax(cc))
                if 0 < max_lag and k in (0, len(lags) - 1):
                    continue
                if cc[k] > best[0]:
                    best = (float(cc[k]), k - max_lag)
            out[(a, b)] = best
    return out, bin_ns


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

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    if not control.is_empty():
        rdv = control.filter(pl.col("dst_port").is_in(list(config.rendezvous_ports)))
        # the server may be a rank of the job or a host of its own: join all its clients
        for (server,), g in rdv.group_by("dst_addr"):
            labs = {node_lab[x] for x in [server, *g["src_addr"].to_list()] if x in node_lab}
            labs = sorted(labs)
            for other in labs[1:]:
                if find(other) != find(labs[0]):
                    parent[find(other)] = find(labs[0])
    # only the traffic inside each copy: a rail's NIC may also talk to storage or control hosts
    f = flows.select("src_addr", "dst_addr", "start_ns", "end_ns", "est_bytes").with_columns(
        c=pl.col("src_addr").replace_strict(node_lab, default=-1, return_dtype=pl.Int64),
        cd=pl.col("dst_addr").replace_strict(node_lab, default=-2, return_dtype=pl.Int64),
    ).filter((pl.col("c") >= 0) & (pl.col("c") == pl.col("cd")))
    volume = {int(c): float(v) for c, v in f.group_by("c").agg(v=pl.col("est_bytes").sum()).iter_rows()}
    size = np.bincount(lab, minlength=ncomp)
    cand = [c for c in range(ncomp) if size[c] >= 2 and c in volume]
    corr, _ = rail_correlations(f, cand, config, resolution_ns)
    for (a, b), (r, _lag) in sorted(corr.items()):
        if size[a] != size[b] or find(a) == find(b):
            continue
        if abs(volume[a] - volume[b]) > 0.25 * max(volume[a], volume[b]):
            continue
        if r >= config.rail_min_correlation:
            parent[find(b)] = find(a)
    return np.array([find(c) for c in lab.tolist()], dtype=np.int64)
