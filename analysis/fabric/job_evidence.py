"""Positive evidence that a set of endpoints is a training job, not storage, checkpoint or control traffic.

Job recognition does not trust ports: a connected set of heavy pairs is a
training job only when its traffic has the shape of one:

- *a valid grid*: its links split into DP groups that each fit a collective
  (ring, tree, all-to-all) and pipelines that carry payload both ways
  (:func:`rankscope.analysis.fabric.grid.fit_grid`). Storage reads, checkpoint
  writes and replication move payload one way from or to a server: a star or a
  path of one-way links, which fits no collective and no pipeline;
- *repeated bursts*: training repeats the same exchange every step, so its
  links go idle and busy again many times; a checkpoint or a bulk copy is one
  or two bursts;
- *rail copies*: a rail-optimised job shows the same graph once per rail, the
  copies bursting together (see :func:`rankscope.analysis.fabric.rails.merge_components`).

A job needs a valid grid and one more sign: repeated bursts, rail copies, or
a grid that no two hosts alone can form (a collective of three or more
members, a pipeline of three or more stages, or DP pairs crossed with
two-stage pipelines), which a short capture of one rail still shows.

Storage and checkpoint servers are recognised by shape too (:func:`storage_hubs`):
far more heavy links than their clients have, where every member of a
collective has about as many links as its peers.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.grid import fit_grid
from rankscope.analysis.fabric.pair_traffic import burst_index

MIN_BURSTS = 3
"""a link that went busy fewer times than this did not repeat a per-step exchange."""


def burst_counts(flows: pl.DataFrame, gap_ns: int) -> pl.DataFrame:
    """Bursts per directed address pair: runs of records separated by idle gaps longer than ``gap_ns``.

    Needs flows src_addr, dst_addr, start_ns, end_ns (payload records). Returns src_addr, dst_addr, bursts.
    """
    if flows.is_empty():
        return pl.DataFrame(schema={"src_addr": pl.Utf8, "dst_addr": pl.Utf8, "bursts": pl.UInt32})
    f = flows.select("src_addr", "dst_addr", "start_ns", "end_ns").sort(["src_addr", "dst_addr", "start_ns"])
    f = f.with_columns(b=burst_index(gap_ns))
    return f.group_by(["src_addr", "dst_addr"]).agg(bursts=pl.col("b").max().cast(pl.UInt32))


def burst_gap_ns(resolution_ns: int) -> int:
    """The idle gap that separates bursts in job evidence, for a capture whose clock ticks every
    ``resolution_ns`` (fabric.clock.flow_resolution_ns)."""
    # idle gaps shorter than the exporter's clock tick (and its cache scan) are no gaps
    return max(20 * resolution_ns, 1_000_000)


def job_evidence(endpoints: list[str], heavy: pl.DataFrame, flows: pl.DataFrame | None, num_rails: int,
                 resolution_ns: int, config: FlowConfig, bursts: pl.DataFrame | None = None) -> dict:
    """What speaks for these endpoints being one training job (see module doc).

    Needs heavy edges among the endpoints (a, b, bytes, first_ab, first_ba, data_symmetry) and their
    payload flow records (src_addr, dst_addr, start_ns, end_ns), or instead ``bursts``: those records'
    :func:`burst_counts` at :func:`burst_gap_ns` (src_addr, dst_addr, bursts; one row per directed pair
    with payload, as a capture split into partitions counts them, runner.capture_partials). Returns
    grid_valid, median_bursts, rail_copies and is_job.
    """
    fit = fit_grid(endpoints, heavy, config, resolution_ns)
    bc = bursts if bursts is not None else burst_counts(flows, burst_gap_ns(resolution_ns))
    med = float(np.median(bc["bursts"].to_numpy())) if bc.height else 0.0
    repeated = med >= MIN_BURSTS
    dp = max((len(g) for g in fit.dp_groups), default=1)
    pp = max((len(p) for p in fit.pipelines), default=1)
    # a full two-dimensional grid (every endpoint in a DP group and a pipeline) is a training shape too
    structured = dp >= 3 or pp >= 3 or (dp >= 2 and pp >= 2)
    return {"grid_valid": bool(fit.valid), "median_bursts": med, "rail_copies": int(num_rails),
            "structured_grid": bool(structured),
            "is_job": bool(fit.valid and (repeated or num_rails >= 2 or structured))}


