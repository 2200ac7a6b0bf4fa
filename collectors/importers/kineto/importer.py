"""The Kineto (PyTorch profiler Chrome-trace JSON) importer: one file per rank.

Produces comm_op (collectives, p2p and NCCL kernels; importers.kineto.comm_rows), compute_op
(spans, GEMMs, kernels; importers.kineto.compute_rows) and step_mark (``ProfilerStep#N``).
Each rank keeps its own clock: epoch ns from ``baseTimeNanoseconds`` where the
trace has it, else times from the trace's first event with the batch marked
relative. Host and pid are recorded on every row.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from rankscope.collectors.importers.contract import ImportBatch, ImportOptions, rank_option
from rankscope.collectors.importers.kineto.chrome_trace import load, step_frame
from rankscope.collectors.importers.kineto.comm_rows import comm_rows, parse_ranks
from rankscope.collectors.importers.kineto.compute_rows import compute_rows


def read_trace(path: Path, opts: ImportOptions) -> ImportBatch:
    """Decode one Kineto trace into record kinds (validation happens in the ingest engine)."""
    tr = load(path, rank_option(path, opts))
    steps = step_frame(tr)
    batch = ImportBatch(relative_time=tr.relative)
    for reason, n in tr.rejects.items():
        batch.reject(reason, tr.samples.get(reason), count=n)
    comm, comm_notes = _guarded(batch, "comm ops", comm_rows, tr, steps)
    compute, compute_notes = _guarded(batch, "compute ops", compute_rows, tr, steps, opts.extra)
    batch.add("comm_op", comm)
    batch.add("compute_op", compute)
    if steps.height:
        batch.add("step_mark", steps.with_columns(pl.lit(tr.rank, pl.Int32).alias("rank")))
    batch.notes.update(
        rank=tr.rank, world_size=tr.world_size, host=tr.host, pid=tr.pid, base_time_ns=tr.base_ns,
        time_origin_us=tr.origin_us if tr.relative else None, **comm_notes, **compute_notes)
    if tr.rank_note:
        batch.notes["rank_assumed"] = tr.rank_note
    # the process groups this rank belongs to (distributedInfo.pg_config): gloo's collectives carry no
    # group, and the analysis matches them to these memberships
    pg_config = tr.dist_info.get("pg_config")
    groups = [r for r in (parse_ranks(g.get("ranks")) for g in (pg_config if isinstance(pg_config, list) else [])
                          if isinstance(g, dict)) if r]
    if groups:
        batch.notes["pg_ranks"] = groups
    # the groups the job named (pg_desc other than torch's "undefined"), for the strategy
    named = [{"name": str(g.get("pg_name")), "desc": g["pg_desc"], "ranks": r}
             for g in (pg_config if isinstance(pg_config, list) else []) if isinstance(g, dict)
             and isinstance(g.get("pg_desc"), str) and g["pg_desc"] not in ("", "undefined")
             and (r := parse_ranks(g.get("ranks")))]
    named += batch.notes.get("pg_named") or []  # the groups the NCCL calls name (comm_rows)
    if named:
        batch.notes["pg_named"] = named
    return batch


def _guarded(batch: ImportBatch, what: str, fn, *args):
    """Run one decoder; args of a shape no decoder expects cost that kind only, never the whole file."""
    try:
        return fn(*args)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, pl.exceptions.PolarsError) as e:
        batch.reject(f"{what} not decodable", f"{type(e).__name__}: {e}")
        return None, {}


class _Kineto:
    name = "kineto"
    source = "kineto"
    parallel_decode = True
    """read is pure and per file: ingest may decode several files at once in worker processes"""

    def sniff(self, path: Path, head: bytes) -> bool:
        if b'"traceEvents"' not in head and b'"schemaVersion"' not in head:
            return False
        # Kineto writes these keys; a bare Chrome trace from elsewhere has none of them.
        return any(k in head for k in (b'"schemaVersion"', b'"distributedInfo"', b'"deviceProperties"',
                                       b'"cpu_op"', b'"user_annotation"', b'"ProfilerStep#'))

    def read(self, path: Path, opts: ImportOptions) -> ImportBatch:
        return read_trace(path, opts)


KINETO = _Kineto()
