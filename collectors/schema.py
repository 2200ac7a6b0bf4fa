"""The record kinds: the one place in rankscope where columns are declared.

Every source (hooks, importers, flow decoders, the simulator) ends in these
kinds and every analysis reads only these. Each field carries a unit and a
description in its Arrow metadata (``b"unit"``, ``b"description"``), so a
Parquet file in the store documents itself.

Conventions (shared/design.md): times are int64 nanoseconds since the Unix
epoch on the recording host's clock (``*_ns``) unless the manifest marks the
source relative; sizes are bytes (``*_bytes``); counts start with ``num_``.
New columns may be appended to a kind; the binding ones never change meaning.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import field

import numpy as np
import polars as pl
import pyarrow as pa

from rankscope.collectors.errors import SchemaError
from rankscope.collectors.record_class import record


@record
class Col:
    """One column of a record kind."""

    name: str
    type: pa.DataType
    unit: str
    description: str
    required: bool = False
    """A row with a null here is rejected (``null <name>``)."""


def _s(name, unit, desc, req=False):
    return Col(name, pa.string(), unit, desc, req)


def _i64(name, unit, desc, req=False):
    return Col(name, pa.int64(), unit, desc, req)


def _i32(name, unit, desc, req=False):
    return Col(name, pa.int32(), unit, desc, req)


def _f64(name, unit, desc, req=False):
    return Col(name, pa.float64(), unit, desc, req)


_JOB = _s("job", "", "training job name, or the capture name for flow records", True)
_SOURCE = _s("source", "", "where the record came from: hook, kineto, flight_recorder, nccl_profiler, "
             "nccl_inspector, nsys, whatif_parquet, simulator, ipfix, netflow9, netflow5, sflow, nfdump, csv")

COMM_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
            "send", "recv", "barrier", "gather", "scatter")
"""Op names of comm_op (binding)."""
P2P_OPS = ("send", "recv")
"""The comm_op ops between two ranks (``peer`` set); every other op is a collective of a group."""

COMM_STATES = ("completed", "pending", "failed")

COMPUTE_CATEGORIES = ("gemm", "attention", "elementwise", "reduction", "memory", "optimizer",
                      "forward", "backward", "loss", "gc", "dataloader", "other")

KINDS: dict[str, tuple[Col, ...]] = {
    "comm_op": (
        _JOB,
        _i32("rank", "", "global rank that issued the call", True),
        _s("op", "", "collective or p2p op: " + ", ".join(COMM_OPS), True),
        _s("group_id", "", "process group id as the source names it"),
        Col("group_ranks", pa.list_(pa.int32()), "", "global ranks of the group's members"),
        _i32("peer", "", "global rank of the other side of a send/recv"),
        _i64("size_bytes", "bytes", "payload bytes this rank contributes (input tensor size)"),
        _s("dtype", "", "element type, torch spelling without the prefix (float32, bfloat16, ...)"),
        _i64("start_ns", "ns", "call start on the recording host's clock", True),
        _i64("end_ns", "ns", "completion; null when the op never finished (state pending)"),
        _s("state", "", "completed, pending (never finished: hang dumps) or failed"),
        _i64("seq", "", "per-group sequence number of the call (p2p: per peer pair)"),
        _i64("step", "", "training step (iteration) the call belongs to"),
        _i32("microbatch", "", "microbatch index within the step, where known"),
        _s("source", _SOURCE.unit, _SOURCE.description),
        _s("host", "", "host name of the recording process"),
        _i64("pid", "", "process id of the recording process"),
        _i32("stage", "", "pipeline stage of the rank, where the source knows it"),
        _i64("num_elements", "", "element count of the input tensor"),
        _i64("out_size_bytes", "bytes", "output tensor bytes (all_gather: the gathered size)"),
        _s("stream", "", "which stream of the rank issued it: dp, pp, tp, ep, ... or a CUDA stream id"),
        _s("algorithm", "", "NCCL algorithm (Ring, Tree, ...) where known"),
        _i64("launch_ns", "ns", "when the CPU enqueued the op, if it differs from start_ns"),
        _i32("dp_rank", "", "data-parallel rank of the issuing rank, where the source knows it"),
        _s("optype", "", "the source's own op type (e.g. OSDI'25 forward-send, grads-reduce-scatter)"),
        _s("name", "", "the op or kernel as the source names it (c10d::allreduce_, ncclDevKernel_AllReduce_...)"),
    ),
    "compute_op": (
        _JOB,
        _i32("rank", "", "global rank", True),
        _s("name", "", "kernel or span name", True),
        _s("category", "", "one of: " + ", ".join(COMPUTE_CATEGORIES), True),
        _i64("start_ns", "ns", "span start on the recording host's clock", True),
        _i64("end_ns", "ns", "span end", True),
        _i64("step", "", "training step"),
        _i32("microbatch", "", "microbatch index within the step"),
        _i32("stage", "", "pipeline stage (virtual stage for interleaved schedules)"),
        _i64("m", "elements", "GEMM M (rows of the output)"),
        _i64("n", "elements", "GEMM N (columns of the output)"),
        _i64("k", "elements", "GEMM K (reduction dimension)"),
        _s("dtype", "", "operand element type"),
        _f64("flops", "FLOP", "floating point operations of the span"),
        _s("source", _SOURCE.unit, _SOURCE.description),
        _s("host", "", "host name of the recording process"),
        _i64("pid", "", "process id"),
        _i64("stream", "", "CUDA stream id (kernels) or thread id (CPU spans)"),
        _i32("device", "", "GPU index on the host"),
        _s("grid", "", "CUDA grid as 'x,y,z'"),
        _s("block", "", "CUDA block as 'x,y,z'"),
        _s("layout", "", "GEMM operand layout/transpose, e.g. 'nn', 'nt', 'tn'"),
        _i64("batch", "", "batch count of a batched GEMM (bmm)"),
        _i32("dp_rank", "", "data-parallel rank of the rank, where the source knows it"),
        _s("optype", "", "the source's own op type (e.g. OSDI'25 forward-compute, gc)"),
        _i64("seq", "", "per-rank sequence number of the op within its step and type, where known"),
    ),
    "flow": (
        _JOB,
        _s("exporter", "", "exporter address (switch) and observation domain as 'addr/domain'", True),
        _s("src_addr", "", "source IP address", True),
        _s("dst_addr", "", "destination IP address", True),
        _i32("src_port", "", "source L4 port"),
        _i32("dst_port", "", "destination L4 port (RoCEv2: 4791)"),
        _i32("protocol", "", "IP protocol number (6 TCP, 17 UDP)"),
        _i64("size_bytes", "bytes", "octets as exported (not scaled for sampling)", True),
        _i64("num_packets", "", "packets as exported (not scaled for sampling)"),
        _i64("start_ns", "ns", "flow start, exporter clock", True),
        _i64("end_ns", "ns", "flow end, exporter clock", True),
        _i64("sampling_rate", "", "1-in-N packet sampling in force (1 = unsampled)"),
        _s("source", _SOURCE.unit, _SOURCE.description),
        _i64("est_size_bytes", "bytes", "size_bytes scaled by the sampling rate"),
        _i64("est_num_packets", "", "num_packets scaled by the sampling rate"),
        _i64("dst_qp", "", "RoCEv2 destination queue pair (sFlow raw headers)"),
        _i32("ib_opcode", "", "InfiniBand BTH opcode (sFlow raw headers)"),
        _i64("vlan", "", "VLAN id (int64: sFlow's 32-bit field may be 0xFFFFFFFF, 'unknown')"),
        _i64("input_if", "", "ingress interface index"),
        _i64("output_if", "", "egress interface index"),
        _i32("tcp_flags", "", "TCP flags OR-ed over the record's packets (tcpControlBits: FIN 1, SYN 2, RST 4, "
             "PSH 8, ACK 16); null when the exporter does not send them"),
    ),
    "step_mark": (
        _JOB,
        _i32("rank", "", "global rank", True),
        _i64("step", "", "training step", True),
        _i64("start_ns", "ns", "step start", True),
        _i64("end_ns", "ns", "step end"),
        _s("source", _SOURCE.unit, _SOURCE.description),
    ),
    "batch_meta": (
        _JOB,
        _i32("rank", "", "global rank", True),
        _i64("step", "", "training step", True),
        _i32("microbatch", "", "microbatch index within the step", True),
        _i64("seq_len", "tokens", "sequence length (tokens) of the microbatch", True),
        _s("source", _SOURCE.unit, _SOURCE.description),
    ),
    "endpoint_map": (
        _JOB,
        _s("address", "", "NIC address of the endpoint", True),
        _s("host", "", "host name"),
        _i32("gpu", "", "GPU index on the host"),
        _i32("rank", "", "global rank using that NIC"),
        _s("source", _SOURCE.unit, _SOURCE.description),
    ),
    "interface_counter": (
        _JOB,
        _s("exporter", "", "exporter address (agent) as 'addr/sub_agent'", True),
        _i64("if_index", "", "interface index", True),
        _i64("time_ns", "ns", "when the exporter sampled the counters", True),
        _i64("speed_bps", "bit/s", "interface speed"),
        _i64("in_octets", "bytes", "ifInOctets (cumulative)"),
        _i64("out_octets", "bytes", "ifOutOctets (cumulative)"),
        _i64("in_packets", "", "ifInUcastPkts (cumulative)"),
        _i64("out_packets", "", "ifOutUcastPkts (cumulative)"),
        _i64("in_errors", "", "ifInErrors (cumulative)"),
        _i64("out_errors", "", "ifOutErrors (cumulative)"),
        _i64("in_discards", "", "ifInDiscards (cumulative)"),
        _i64("out_discards", "", "ifOutDiscards (cumulative)"),
        _s("source", _SOURCE.unit, _SOURCE.description),
    ),
}
"""Every record kind and its columns, in storage order."""


def _build(cols: tuple[Col, ...]) -> pa.Schema:
    return pa.schema(
        [pa.field(c.name, c.type, nullable=not c.required,
                  metadata={b"unit": c.unit.encode(), b"description": c.description.encode()})
         for c in cols])


SCHEMAS: dict[str, pa.Schema] = {k: _build(v) for k, v in KINDS.items()}


def schema(kind: str) -> pa.Schema:
    """The Arrow schema of a record kind; raises SchemaError for an unknown kind."""
    try:
        return SCHEMAS[kind]
    except KeyError:
        raise SchemaError(f"unknown record kind {kind!r}; expected one of {sorted(SCHEMAS)}") from None


def columns(kind: str) -> list[str]:
    """Column names of a kind, in storage order."""
    return [c.name for c in KINDS[kind]] if kind in KINDS else schema(kind).names


def empty(kind: str) -> pa.Table:
    """An empty table of the kind (views exist even when the store holds none)."""
    # not Schema.empty_table(): that (like pa.array) imports pandas, ~0.2 s of a small analysis
    return pa.Table.from_batches([], schema=schema(kind))


def polars_schema(kind: str) -> dict[str, pl.DataType]:
    """The kind's schema as polars dtypes, for building frames that will be validated."""
    return dict(pl.from_arrow(empty(kind)).schema)


@record(frozen=False)
class Validated:
    """What :func:`validate` returns: the good rows and why the others were rejected."""

    table: pa.Table
    rejects: Counter = field(default_factory=Counter)
    """Rejected row count per reason, e.g. ``{"end_ns < start_ns": 3}``."""
    samples: dict[str, int] = field(default_factory=dict)
    """For each reason, the index (in the input) of the first rejected row."""

    @property
    def num_rejected(self) -> int:
        return sum(self.rejects.values())


def _wrong_type_masks(df: pl.DataFrame, kind: str) -> tuple[pl.DataFrame, dict[str, np.ndarray]]:
    """Cast every column to the kind's type; rows whose non-null value fails the cast are marked."""
    target = polars_schema(kind)
    out: list[pl.Expr | pl.Series] = []
    bad = {}
    n = df.height
    for name, dtype in target.items():
        if name not in df.columns:
            # a null literal, broadcast to the frame's height by the one with_columns below: not a Python list
            # of n Nones (~2 ms per column per 70k rows; an importer leaves half the kind's columns out), nor a
            # Series per column (~0.3 ms each: 4 of the 4.6 ms of this function on OSDI'25 SE's compute_op)
            out.append(pl.lit(None, dtype=dtype).alias(name))
            continue
        s = df[name]
        if s.dtype == dtype:
            continue
        try:
            cast = _cast_column(s, name, dtype)
        except Exception:  # noqa: BLE001 - polars raises several types for impossible casts
            cast = pl.Series(name, [None] * n, dtype=dtype)
        lost = (df[name].is_not_null() & cast.is_null()).to_numpy()
        if lost.any():
            bad[name] = lost
        out.append(cast.alias(name))
    return df.with_columns(out).select(list(target)), bad


def _cast_column(s: pl.Series, name: str, dtype: pl.DataType) -> pl.Series:
    """One input column in the kind's type; a value that does not fit becomes null."""
    if isinstance(dtype, pl.List) and s.dtype == pl.String:
        s = _parse_int_list(s)
    elif dtype.is_integer() and s.dtype == pl.String:
        stripped = s.str.strip_chars()
        direct = stripped.cast(pl.Int64, strict=False)
        # CSV writers give '12.0' for integers that passed through floats; only small
        # ones are exact in float64, so nanosecond timestamps must parse directly.
        f = stripped.cast(pl.Float64, strict=False)
        exact = (f.is_not_null() & (f == f.floor()) & (f.abs() < 2.0**53)).fill_null(False)
        via_float = pl.Series(name, np.where(exact.to_numpy(), f.fill_null(0).to_numpy(), np.nan)
                              ).fill_nan(None).cast(pl.Int64)
        s = direct.fill_null(via_float)
    elif dtype.is_integer() and s.dtype.is_float():
        exact = s.is_not_null() & (s == s.floor())
        s = s.set(~exact.fill_null(False), None) if (~exact.fill_null(False)).any() else s
    return s.cast(dtype, strict=False)


def _parse_int_list(s: pl.Series) -> pl.Series:
    """'[0, 1, 2]' or '0 1 2' or '0;1;2' -> list[int]."""
    cleaned = s.str.replace_all(r"[\[\]\(\)]", "").str.strip_chars()
    parts = cleaned.str.replace_all(r"[;\s]+", ",").str.split(",")
    return parts.list.eval(pl.element().filter(pl.element() != "").cast(pl.Int32, strict=False))


def _rule_masks(df: pl.DataFrame, kind: str) -> dict[str, np.ndarray]:
    """Per-kind semantic rules; each returns a boolean 'bad' mask."""
    rules: dict[str, pl.Expr] = {}
    for c in KINDS[kind]:
        if c.required:
            rules[f"null {c.name}"] = pl.col(c.name).is_null()
    has = set(df.columns)
    if {"start_ns", "end_ns"} <= has:
        rules["end_ns < start_ns"] = pl.col("end_ns") < pl.col("start_ns")
    if "start_ns" in has:
        rules["negative start_ns"] = pl.col("start_ns") < 0
    for c in ("size_bytes", "num_packets", "seq_len", "flops", "m", "n", "k", "num_elements"):
        if c in has:
            rules[f"negative {c}"] = pl.col(c) < 0
    if "rank" in has:
        rules["negative rank"] = pl.col("rank") < 0
    if kind == "comm_op":
        rules["unknown op"] = ~pl.col("op").is_in(list(COMM_OPS))
        rules["unknown state"] = pl.col("state").is_not_null() & ~pl.col("state").is_in(list(COMM_STATES))
        rules["completed op without end_ns"] = (pl.col("state") == "completed") & pl.col("end_ns").is_null()
    if kind == "compute_op":
        rules["unknown category"] = ~pl.col("category").is_in(list(COMPUTE_CATEGORIES))
    if kind == "flow":
        rules["sampling_rate < 1"] = pl.col("sampling_rate") < 1
    if kind == "batch_meta":
        rules["seq_len == 0"] = pl.col("seq_len") == 0
    if not rules:
        return {}
    try:
        res = df.select([e.fill_null(False).alias(k) for k, e in rules.items()])
        return {k: res[k].to_numpy() for k in res.columns}
    except Exception:  # noqa: BLE001 - one rule polars cannot evaluate must not hide the others
        return {k: _one_rule(df, e) for k, e in rules.items()}


def _one_rule(df: pl.DataFrame, rule: pl.Expr) -> np.ndarray:
    """A rule's 'bad' mask; a rule that cannot be evaluated on these values rejects every row."""
    try:
        return df.select(rule.fill_null(False)).to_series().to_numpy()
    except Exception:  # noqa: BLE001 - values outside what the rule's types allow are bad rows
        return np.ones(df.height, dtype=bool)


def _normalise(df: pl.DataFrame, kind: str) -> pl.DataFrame:
    """Defaults that make a row complete: comm_op state from end_ns, flow sampling 1."""
    if kind == "comm_op":
        df = df.with_columns(
            pl.when(pl.col("state").is_null())
            .then(pl.when(pl.col("end_ns").is_null()).then(pl.lit("pending")).otherwise(pl.lit("completed")))
            .otherwise(pl.col("state")).alias("state"))
    if kind == "flow":
        df = df.with_columns(pl.col("sampling_rate").fill_null(1))
        df = df.with_columns(
            pl.col("est_size_bytes").fill_null(pl.col("size_bytes") * pl.col("sampling_rate")),
            pl.col("est_num_packets").fill_null(pl.col("num_packets") * pl.col("sampling_rate")))
    return df


def cast_to(table: pa.Table, sch: pa.Schema) -> pa.Table:
    """``table.cast(sch)`` (same names, same order) through the cast kernel alone.

    ``Table.cast`` imports ``pyarrow.compute``, which generates its Python wrappers and docstrings on
    import (docscrape, pydoc: ~0.04 s CPU and ~9 MB per process, a tenth of the imports of
    ``analyze --ingest`` on a small trace); ingest needs only the one kernel, from the compiled module.
    """
    from pyarrow._compute import CastOptions, call_function

    cols = []
    for col, f in zip(table.columns, sch, strict=True):
        if not f.nullable and col.null_count:
            raise ValueError(f"column {f.name}: {col.null_count} null(s) in a field declared not null")
        cols.append(col if col.type == f.type else call_function("cast", [col], CastOptions.safe(f.type)))
    return pa.Table.from_arrays(cols, schema=sch)


def unique_values(col: pa.ChunkedArray) -> list:
    """``col.unique().to_pylist()`` (first-seen order) without importing ``pyarrow.compute`` (see cast_to)."""
    from pyarrow._compute import call_function

    return call_function("unique", [col]).to_pylist()


def validate(table: pa.Table | pl.DataFrame, kind: str) -> Validated:
    """Split a table into rows that fit ``kind`` and counts of rejected rows by reason.

    Needs: any columns; those of the kind are cast to the declared types,
    others are dropped, missing optional ones become null. A row is rejected,
    counted under the first reason that applies, when a value does not convert
    to its column's type (``wrong type <col>``), a required column is null,
    ``end_ns < start_ns``, a size or count is negative, or the op/category is
    not one of the declared names. Returns the good rows in the kind's schema.
    """
    sch = schema(kind)
    df = pl.from_arrow(table) if isinstance(table, pa.Table) else table
    if isinstance(df, pl.Series):
        df = df.to_frame()
    n = df.height
    if n == 0:
        return Validated(empty(kind))
    cast, type_bad = _wrong_type_masks(df, kind)
    cast = _normalise(cast, kind)
    rule_bad = _rule_masks(cast, kind)
    rejected = np.zeros(n, dtype=bool)
    result = Validated(empty(kind))
    for reason, mask in [(f"wrong type {c}", m) for c, m in type_bad.items()] + list(rule_bad.items()):
        new = mask & ~rejected
        count = int(new.sum())
        if count:
            result.rejects[reason] += count
            result.samples[reason] = int(np.argmax(new))
            rejected |= new
    good = cast.filter(pl.Series(~rejected)) if rejected.any() else cast
    result.table = _arrow_of(good, sch) if good.height else empty(kind)
    return result


def _arrow_of(df: pl.DataFrame, sch: pa.Schema) -> pa.Table:
    """``df`` (the kind's columns, in order) as an Arrow table of schema ``sch``; its columns that are null in
    every row share one zeroed buffer for their validity, values and offsets.

    A format fills only some of a kind's columns: the rest are null in every row. polars exports a null
    column of a number type over one shared buffer already, but its strings and lists come out as string
    views and large lists, and the cast to the kind's types gave each its own offsets and validity (4-5 bytes
    a row). On the OSDI'25 AR trace tiled 16x: the Arrow memory ingest holds for the validated rows, comm_op
    51 -> 25 MiB, compute_op 28 -> 14 MiB, through the parts' writes. The shared buffer comes from calloc:
    its pages are the kernel's zero page until written, and nothing writes them."""
    n = df.height
    nulls = {c for c, k in zip(df.columns, df.null_count().row(0), strict=True) if k == n}
    if not nulls:
        return cast_to(df.to_arrow(), sch)
    filled = df.drop(nulls).to_arrow() if len(nulls) < df.width else None
    zeros = pa.py_buffer(np.zeros(8 * n + 8, dtype=np.uint8))
    cols = [_null_array(f.type, n, zeros) if f.name in nulls else filled.column(f.name) for f in sch]
    return cast_to(pa.Table.from_arrays(cols, names=sch.names), sch)


def _null_array(t: pa.DataType, n: int, zeros: pa.Buffer) -> pa.Array:
    """``n`` nulls of type ``t`` over ``zeros`` (at least 8 n + 8 zero bytes): validity, values and offsets
    are all zeros. Types not laid out here get Arrow's own null array."""
    validity = zeros.slice(0, (n + 7) // 8)
    if pa.types.is_boolean(t):
        return pa.Array.from_buffers(t, n, [validity, zeros.slice(0, (n + 7) // 8)], null_count=n)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t):
        return pa.Array.from_buffers(t, n, [validity, zeros.slice(0, n * t.bit_width // 8)], null_count=n)
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return pa.Array.from_buffers(t, n, [validity, zeros.slice(0, 4 * (n + 1)), zeros.slice(0, 0)], null_count=n)
    if pa.types.is_list(t):
        # the child by pa.nulls: pa.array([]) would import pandas (0.24 s), to check for its types
        return pa.Array.from_buffers(t, n, [validity, zeros.slice(0, 4 * (n + 1))], null_count=n,
                                     children=[pa.nulls(0, type=t.value_type)])
    return pa.nulls(n, type=t)


def conform(table: pa.Table | pl.DataFrame, kind: str) -> pa.Table:
    """Cast an already-trusted table (written by rankscope itself) to the kind's schema.

    Raises SchemaError if any row would be rejected by :func:`validate`; use
    validate for anything that came from outside.
    """
    v = validate(table, kind)
    if v.rejects:
        raise SchemaError(f"{kind}: {v.num_rejected} rows do not fit the schema: {dict(v.rejects)}")
    return v.table
