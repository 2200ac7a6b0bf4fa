"""Job recognition on a flow capture too big for one process: partitions read and reduced apart, then merged.

Why: ``recognise_jobs`` reads the whole capture into one process, which a 16k-GPU fabric's capture
(hundreds of millions of records in many files) does not fit. Here the capture is cut into partitions
(its part files, large ones into row ranges), and

1. each partition is reduced to its partial features (capture_partials.flow_partial), which merge into
   exactly the pair table, clock and rendezvous clients recognition reads of the whole; its payload
   bursts are split by pair into buckets that stay with the mapper (Ray's object store), not the driver;
2. recognition runs on the merged result by the embedded engine's own code (fabric.recognise.recognise_pairs);
   when it weighs candidate jobs, a reduce task per bucket counts its pairs' bursts across all partitions
   (capture_partials.bucket_burst_counts), so the driver holds a count per pair, never the bursts;
3. where rails may be copies of one job, a second pass bins their activity per partition (capture_rails);
4. each recognised job is then analysed from its own records only (:func:`load_capture_job`).

``mapper(fn, args)`` runs ``fn`` on each argument tuple and yields the results in order: the builtin
loop here, Ray tasks in runner.on_ray (the rails' series are summed as they arrive). A mapper with a
``split(fn, args, num_returns)`` method (runner.on_ray.RayMapper) yields, for ``fn`` returning a tuple,
(its first item, handles of the others), and takes those handles as arguments of a later call in their
items' stead: the buckets then never reach the driver; without it, they are the frames themselves. Every function it is given is a top-level function of this module,
so that a Ray worker can import it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import polars as pl
import pyarrow.parquet as pq

from rankscope.analysis.diagnose import analyze_job
from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.job_evidence import burst_gap_ns
from rankscope.analysis.fabric.recognise import FabricJobs, recognise_pairs
from rankscope.analysis.report.diagnosis import Diagnosis
from rankscope.analysis.runner.capture_partials import (
    FlowPartial,
    bucket_burst_counts,
    capture_resolution,
    empty_partial,
    flow_partial,
    merge_partials,
    pair_buckets,
    pair_quality,
    pair_table,
)
from rankscope.analysis.runner.capture_rails import RailPlan, rail_labels, rail_plan, rail_series
from rankscope.analysis.runner.plan import PlannedJob, plan_jobs, recognised_jobs, with_capture
from rankscope.collectors.errors import ConfigError
from rankscope.collectors.job_frames import JobFrames
from rankscope.collectors.record_class import record
from rankscope.collectors.schema import polars_schema
from rankscope.collectors.store import Store

PARTITION_ROWS = 1_000_000
"""a part file with more records than this is read as equal row ranges of at most this many (the default of
``analyze --partition-rows``): a partition's task then stays near 0.6 GiB whatever the size of the files
the capture was ingested from (measured in a fresh process on the 100 M-record benchmark capture: first
pass 0.49 / 0.59 / 0.85 GiB and rail series 0.53 / 0.61 / 0.82 GiB at 0.78 / 1 / 1.56 M records)."""

BURST_BUCKET_RECORDS = 4 * PARTITION_ROWS
"""one reduce task counts the bursts of the pairs of about this many records: ~27 % of a simulated
fabric's records are burst hulls, so a reduce task holds about as many rows as a partition's task."""

MERGE_EVERY = 16
"""the driver folds the partitions' partials into one every this many: a partial holds up to 20,000 start
and end times per exporter for the clock (16 MiB for a 1 M-record partition of a 288-exporter fabric), so
128 partials kept for one merge at the end took 2 GiB; merged, the clock keeps the first 20,000 only."""

FLOW_COLUMNS = ("exporter", "src_addr", "dst_addr", "src_port", "dst_port", "protocol", "size_bytes", "num_packets",
                "start_ns", "end_ns", "sampling_rate", "est_size_bytes")
"""the flow columns job recognition reads (fabric.pair_traffic); a partition reads no other."""

Mapper = Callable[[Callable, list[tuple]], Iterable]


def local_map(fn: Callable, args: list[tuple]) -> Iterator:
    """The mapper of one process: ``fn(*a)`` for each ``a``, in order, each when it is asked for."""
    return (fn(*a) for a in args)


@record
class Partition:
    """Rows ``offset .. offset + num_rows`` of one part file of a capture."""

    path: str
    offset: int
    num_rows: int


def capture_partitions(store: Store, capture: str, max_rows: int = PARTITION_ROWS) -> list[Partition]:
    """A capture's partitions, in the order ``Store.read`` concatenates its records: each part file of n
    rows cut into ceil(n / max_rows) ranges of equal size (within a row), so that a file just over the
    limit gives two halves, not a full partition and a sliver (the tasks' peaks follow the largest)."""
    if max_rows < 1:
        raise ConfigError(f"partition rows must be >= 1, got {max_rows}")
    out = []
    for p in store.parts("flow", capture):
        n = pq.read_metadata(p).num_rows
        k = max(1, -(-n // max_rows))
        bounds = [i * n // k for i in range(k + 1)]
        out.extend(Partition(str(p), lo, hi - lo) for lo, hi in zip(bounds, bounds[1:]) if hi > lo)
    return out


def read_partition(part: Partition) -> pl.DataFrame:
    """One partition's records (the FLOW_COLUMNS), typed as ``Store.read`` types them."""
    lf = pl.scan_parquet(part.path, schema=polars_schema("flow"), missing_columns="insert",
                         extra_columns="ignore", hive_partitioning=False)
    return lf.slice(part.offset, part.num_rows).select(FLOW_COLUMNS).collect()


def partition_partial(part: Partition, config: FlowConfig) -> FlowPartial:
    """First pass, one partition: its partial features."""
    return flow_partial(read_partition(part), config)


def partition_partial_buckets(part: Partition, config: FlowConfig, num_buckets: int) -> tuple:
    """First pass, one partition, for the split runner: (its partial without bursts, then its bursts split
    into ``num_buckets`` buckets by pair, capture_partials.pair_buckets)."""
    p = partition_partial(part, config)
    buckets = pair_buckets(p.bursts, num_buckets)
    p.bursts = empty_partial().bursts
    return (p, *buckets)


def _first_pass(parts: list[Partition], config: FlowConfig, mapper: Mapper, num_buckets: int
                ) -> tuple[FlowPartial, list[list]]:
    """The partitions' merged partial (no bursts) and, per partition, its burst buckets (handles the
    mapper gave, or the frames)."""
    args = [(p, config, num_buckets) for p in parts]
    split = getattr(mapper, "split", None)
    outs = split(partition_partial_buckets, args, 1 + num_buckets) if split is not None else \
        ((r[0], list(r[1:])) for r in mapper(partition_partial_buckets, args))
    heads, buckets = [], []
    for head, b in outs:
        heads.append(head)
        buckets.append(b)
        if len(heads) > MERGE_EVERY:  # partials merge in any grouping, in store order (as they arrive)
            heads = [merge_partials(heads)]
    return merge_partials(heads), buckets


def burst_buckets(parts: list[Partition]) -> int:
    """How many reduce tasks count the bursts of the capture whose partitions are ``parts``."""
    return max(1, -(-sum(p.num_rows for p in parts) // BURST_BUCKET_RECORDS))


def partition_series(part: Partition, config: FlowConfig, plan: RailPlan) -> pl.DataFrame:
    """Second pass, one partition: its share of the rails' activity series."""
    return rail_series(read_partition(part), config, plan)


def recognise_split(parts: list[Partition], capture: str, config: FlowConfig, mapper: Mapper = local_map,
                    merged: FlowPartial | None = None, num_buckets: int | None = None) -> FabricJobs:
    """``recognise_jobs`` of the capture whose partitions are ``parts``, each partition reduced by ``mapper``.

    ``merged``: the partitions' merged partial (with its bursts) when the caller has it already;
    ``num_buckets``: reduce tasks that count the bursts (default :func:`burst_buckets`)."""
    pair_bursts = None
    if merged is None and parts:
        r = num_buckets or burst_buckets(parts)
        merged, buckets = _first_pass(parts, config, mapper, r)

        def pair_bursts(resolution: int) -> pl.DataFrame:
            gap = burst_gap_ns(resolution)
            counts = list(mapper(bucket_burst_counts, [(gap, *[b[k] for b in buckets]) for k in range(r)]))
            buckets.clear()  # asked for once: let the object store free the bursts now
            return pl.concat(counts, how="vertical")
    elif merged is None:
        merged = merge_partials([])

    def merge(nodes, rails, resolution):
        plan = rail_plan(nodes, rails, merged, config, resolution)
        series = mapper(partition_series, [(p, config, plan) for p in parts]) if plan.pairs else []
        return rail_labels(plan, series, config)

    return recognise_pairs(pair_table(merged), pair_quality(merged), capture, config, merged.bursts,
                           lambda: capture_resolution(merged), merge, pair_bursts)


def recognised_jobs_split(store: Store, capture: str, flow: FlowConfig, mapper: Mapper = local_map,
                          max_rows: int = PARTITION_ROWS) -> FabricJobs:
    """runner.plan.recognised_jobs, split: the same result cache entry (so a later embedded plan of the
    same store is answered from it, and the other way round)."""
    return recognised_jobs(store, capture, flow, _split(store, flow, mapper, max_rows))


def plan_jobs_split(store: Store, job: str | None, flow_job: str | None, flow: FlowConfig,
                    mapper: Mapper = local_map, partition_rows: int = PARTITION_ROWS) -> list[PlannedJob]:
    """runner.plan.plan_jobs with each capture's jobs recognised split (:func:`recognise_split`), its part
    files cut into partitions of at most ``partition_rows`` records (:func:`capture_partitions`)."""
    return plan_jobs(store, job, flow_job, flow, _split(store, flow, mapper, partition_rows))


def _split(store: Store, flow: FlowConfig, mapper: Mapper, max_rows: int):
    return lambda capture: recognise_split(capture_partitions(store, capture, max_rows), capture, flow, mapper)


def load_capture_job(store: Store, planned: PlannedJob) -> JobFrames:
    """runner.plan.load_planned for a job recognised in a capture, reading only the job's records: the
    filter goes down to the Parquet scan, so the capture is never whole in memory."""
    cap, eps = planned.source, list(planned.endpoints)
    maps = {"endpoint_map": store.read("endpoint_map", cap)} if store.count("endpoint_map", cap) else {}
    # one chunk per column: the scan's columns come in chunks of different lengths, so the analysis' first
    # with_columns would copy the whole frame and the job model hold it twice (1.10 -> 1.01-1.03 GiB at 1.6 M records)
    flow = (store.scan("flow", cap).filter(pl.col("src_addr").is_in(eps) & pl.col("dst_addr").is_in(eps))
            .collect().rechunk())
    frames = JobFrames.from_frames(planned.name, flow=flow, **maps)
    frames.job_endpoints = tuple(planned.endpoints)
    return frames


def analyse_capture_job(store: Store, planned: PlannedJob, config) -> tuple[Diagnosis, dict]:
    """runner.plan.analyse_planned for a job recognised in a capture, from its own records only."""
    d, tables = analyze_job(load_capture_job(store, planned), config)
    return with_capture(d, planned), tables
