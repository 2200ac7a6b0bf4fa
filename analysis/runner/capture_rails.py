"""fabric.rails.merge_components for a capture split into partitions: rendezvous and volumes from the merged
partial, the activity series summed over a second pass of the partitions.

Why a second pass: the series are binned from the capture's first to its last record inside a rail, with
a bin that depends on the capture's clock, both known only after the first pass is merged. Each partition
then bins its own records (fabric.rails.activity_events: bins add up across any split); only the rails that
some other rail could be a copy of (fabric.rails.candidate_pairs, the tests merge_components makes before
the correlation) are binned at all, which on a fabric of unrelated jobs is few. The summed series are
correlated and joined by merge_components' own functions (fabric.rails.activity_views, join_correlated).

The series of bytes spread over each record is a float sum: added in another order than the embedded
engine's, it differs in the last bits, and so may the correlations; a merge decision could change only for
a correlation within ~1e-12 of ``rail_min_correlation``. The two instant views are counts, exact.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import polars as pl

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.pair_traffic import pair_traffic
from rankscope.analysis.fabric.rails import (
    NUM_VIEWS,
    activity_events,
    activity_views,
    candidate_pairs,
    find,
    join_correlated,
    rail_bins,
    union_rendezvous,
)
from rankscope.analysis.runner.capture_partials import FlowPartial
from rankscope.collectors.record_class import record


@record(frozen=False)
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


def rail_plan(nodes: list[str], lab: np.ndarray, p: FlowPartial, config: FlowConfig, resolution_ns: int) -> RailPlan:
    """The rendezvous unions and the series to bin, from the capture's merged partial (as
    fabric.rails.merge_components computes them from the records)."""
    ncomp = int(lab.max()) + 1 if len(lab) else 0
    node_comp = dict(zip(nodes, lab.tolist()))
    parent = list(range(ncomp))
    union_rendezvous(parent, node_comp, p.rendezvous)
    # only the traffic inside each component, every exporter's records (as merge_components reads them)
    inside = (p.pair_exp.with_columns(c=pl.col("src_addr").replace_strict(node_comp, default=-1, return_dtype=pl.Int64),
                                      cd=pl.col("dst_addr").replace_strict(node_comp, default=-2, return_dtype=pl.Int64))
              .filter((pl.col("c") >= 0) & (pl.col("c") == pl.col("cd"))))
    plan = RailPlan(lab, node_comp, parent, [], [])
    if inside.is_empty():
        return plan
    volume = {int(c): float(v) for c, v in inside.group_by("c").agg(v=pl.col("bytes").sum()).iter_rows()}
    plan.pairs = candidate_pairs(lab, volume)
    if not plan.pairs:
        return plan
    plan.comps = sorted({c for ab in plan.pairs for c in ab})
    plan.t0 = int(inside["first_ns"].min())
    plan.bin_ns, plan.nbins, plan.max_lag = rail_bins(plan.t0, int(inside["last_ns"].max()), config, resolution_ns)
    return plan


def _series_frame(c=(), view=(), bin_=(), v=()) -> pl.DataFrame:
    return pl.DataFrame({"c": c, "view": view, "bin": bin_, "v": v},
                        schema={"c": pl.Int64, "view": pl.Int8, "bin": pl.Int64, "v": pl.Float64})


def rail_series(flow: pl.DataFrame, config: FlowConfig, plan: RailPlan) -> pl.DataFrame:
    """One partition's share of the activity series of ``plan.comps``: c, view (fabric.rails.activity_events'),
    bin, v, one row per non-empty bin, sorted; summed over the partitions they are the series
    fabric.rails.binned_activity bins from the whole capture's records of each component."""
    if not plan.comps or flow.is_empty():
        return _series_frame()
    # the records inside the binned rails first (cheap, and most of a fabric's records may be elsewhere),
    # then pair_traffic's own record by record classification of what is training traffic
    binned = [a for a, c in plan.node_comp.items() if c in set(plan.comps)]
    inside = flow.filter(pl.col("src_addr").is_in(binned) & pl.col("dst_addr").is_in(binned))
    if inside.is_empty():
        return _series_frame()
    keep = pair_traffic(inside, config).training_flows
    del inside
    f = keep.select("src_addr", "dst_addr", "start_ns", "end_ns", "est_bytes").with_columns(
        c=pl.col("src_addr").replace_strict(plan.node_comp, default=-1, return_dtype=pl.Int64),
        cd=pl.col("dst_addr").replace_strict(plan.node_comp, default=-2, return_dtype=pl.Int64),
    ).filter((pl.col("c") == pl.col("cd")) & pl.col("c").is_in(plan.comps)).select("c", "start_ns", "end_ns", "est_bytes")
    del keep
    if f.is_empty():
        return _series_frame()
    c = f["c"].to_numpy()
    events = activity_events(f["start_ns"].to_numpy(), f["end_ns"].to_numpy(), f["est_bytes"].to_numpy().astype(float),
                             plan.t0, plan.bin_ns, plan.nbins)
    del f
    # one int64 key per (component, view, bin) and one sort, not a group-by on three columns: polars'
    # took ~0.5 GiB over the ~5 events per record of a 1 M-record partition
    width = plan.nbins + 1
    keys = np.concatenate([(np.resize(c, len(b)) * NUM_VIEWS + view) * width + b for view, (b, _) in enumerate(events)])
    values = np.concatenate([v for _, v in events])
    del events
    uniq, inverse = np.unique(keys, return_inverse=True)
    del keys
    sums = np.bincount(inverse, weights=values, minlength=len(uniq))
    comp_view, bins = np.divmod(uniq, width)
    return _series_frame(comp_view // NUM_VIEWS, (comp_view % NUM_VIEWS).astype(np.int8), bins, sums)


def _dense_series(series: Iterable[pl.DataFrame], nbins: int) -> dict[int, list[np.ndarray]]:
    """Per component its views' binned series (fabric.rails.binned_activity's), summed from the partitions'
    shares as each arrives: no partition's share outlives its sum."""
    dense: dict[int, list[np.ndarray]] = {}
    for rows in series:
        for (c, view), g in rows.group_by(["c", "view"]):
            arrs = dense.setdefault(int(c), [np.zeros(nbins + 1), np.zeros(nbins), np.zeros(nbins)])
            arrs[int(view)][g["bin"].to_numpy()] += g["v"].to_numpy()  # a partition's bins are distinct
    return dense


def rail_labels(plan: RailPlan, series: Iterable[pl.DataFrame], config: FlowConfig) -> np.ndarray:
    """The job label per node (fabric.rails.merge_components), from the plan and every partition's series."""
    parent = list(plan.parent)
    if plan.pairs:
        dense = _dense_series(series, plan.nbins)
        views = {c: activity_views(dense.pop(c)) for c in sorted(dense)}
        join_correlated(parent, plan.pairs, views, plan.max_lag, config)
    return np.array([find(parent, c) for c in plan.lab.tolist()], dtype=np.int64)
