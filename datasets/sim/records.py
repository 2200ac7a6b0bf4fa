"""Replayed op times -> the record kinds (comm_op, compute_op, step_mark, batch_meta, endpoint_map).

Times are relative float ns until here; each record gets the job's start time
plus the clock offset of the host that recorded it (the clock-skew fault),
rounded to int64 ns. An op whose collective never completed (a hang) is a
comm_op with ``state`` pending and no ``end_ns`` on every rank that joined;
ops that were never launched are not recorded at all.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from rankscope.collectors.errors import SchemaError
from rankscope.collectors.schema import conform, schema
from rankscope.datasets.sim.job_config import SimConfig
from rankscope.datasets.sim.op_graph import GEMM_SHARE, Graph, Templates
from rankscope.datasets.sim.stage_ops import OP, OPS, STREAMS
from rankscope.datasets.sim.topology import Topology

SOURCE = "simulator"
KERNEL_STREAM = 7
"""CUDA stream id of GEMM/attention kernels; coarse spans (CPU annotations) use stream 0."""


def _ns(base: np.ndarray, t: np.ndarray) -> np.ndarray:
    return base + np.rint(t).astype(np.int64)


def _take(names, idx: np.ndarray) -> pl.Series:
    """Strings by index from a short list (fast: no per-row Python strings)."""
    return pl.Series(list(names), dtype=pl.String).gather(np.asarray(idx, dtype=np.int64))


def _hosts(topo: Topology, rank: np.ndarray) -> pl.Series:
    return _take([topo.host_name(int(h)) for h in topo.host], rank)


def to_kind(table: pa.Table | pl.DataFrame, kind: str) -> pa.Table:
    """Cast the simulator's own columns to a kind's schema, fast (no per-row validation).

    The simulator builds every value itself, so instead of ``schema.validate``
    (the tests run that on small jobs) this checks the invariants that matter:
    required columns have no nulls and no span ends before it starts.
    """
    if isinstance(table, pl.DataFrame):
        table = table.to_arrow()
    sch = schema(kind)
    n = table.num_rows
    have = set(table.column_names)
    cols = [table.column(f.name).cast(f.type) if f.name in have else pa.nulls(n, f.type) for f in sch]
    out = pa.Table.from_arrays(cols, schema=sch)
    for f in sch:
        if not f.nullable and out.column(f.name).null_count:
            raise SchemaError(f"simulator produced null {kind}.{f.name}")
    if "end_ns" in have and n:
        bad = pc.sum(pc.less(out.column("end_ns"), out.column("start_ns"))).as_py()
        if bad:
            raise SchemaError(f"simulator produced {bad} {kind} rows with end_ns < start_ns")
    return out


def _str(names, idx: np.ndarray) -> pa.Array:
    return pa.array(list(names), pa.string()).take(pa.array(np.asarray(idx, dtype=np.int64)))


def _opt(values: np.ndarray, null: np.ndarray, typ) -> pa.Array:
    return pa.array(values, type=typ, mask=np.asarray(null, dtype=bool))


def comm_table(cfg: SimConfig, topo: Topology, g: Graph, T: Templates, ready, end, base) -> pa.Table:
    is_comm = T.kind[g.tmpl] == 1
    idx = np.flatnonzero(is_comm & np.isfinite(ready))
    # rows grouped by stream, so each stream's group_ranks fill one contiguous block
    idx = idx[np.argsort(T.stream[g.tmpl[idx]], kind="stable")]
    tm = g.tmpl[idx]
    strm = T.stream[tm]
    rank = g.rank[idx]
    done = np.isfinite(end[idx])
    ops = T.op_code[tm]
    size = g.size_bytes[idx]
    degree = {"pp": 2, "dp": cfg.dp, "tp": cfg.tp, "ep": cfg.ep, "cp": cfg.cp, "dpx": cfg.dp * cfg.ep}
    n = np.array([degree.get(STREAMS[s], 1) for s in range(len(STREAMS))])[strm]
    out_size = np.select([ops == OP["all_gather"], ops == OP["reduce_scatter"]],
                         [size * n, size // np.maximum(n, 1)], size)
    # group_ranks: the members of the op's process group (p2p: the pipeline group).
    axis_rows = [topo.groups[STREAMS[s]] for s in range(1, len(STREAMS))]
    widths = np.array([0] + [a.shape[1] for a in axis_rows])
    offsets = np.r_[0, np.cumsum(widths[strm])].astype(np.int32)
    row = g.group_row[idx]
    values = np.concatenate([np.zeros(0, dtype=np.int32)] + [
        axis_rows[s - 1][row[strm == s]].ravel().astype(np.int32) for s in range(1, len(STREAMS))])
    k = len(idx)
    mb = T.mb[tm]
    # group ids ("dp3", "pp0", ...) of every group, taken by index rather than built per row
    n_groups = np.array([0] + [a.shape[0] for a in axis_rows])
    id_base = np.r_[0, np.cumsum(n_groups)[:-1]]
    ids = [f"{STREAMS[s]}{r}" for s in range(1, len(STREAMS)) for r in range(n_groups[s])]
    hosts = [topo.host_name(int(h)) for h in topo.host]
    cols = {
        "job": _str([cfg.job], np.zeros(k)),
        "rank": rank.astype(np.int32),
        "op": _str(OPS, ops),
        "group_id": _str(ids, id_base[strm] + row),
        "group_ranks": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32())),
        "peer": _opt(g.peer[idx].astype(np.int32), g.peer[idx] < 0, pa.int32()),
        "size_bytes": size,
        "dtype": _str([cfg.dtype], np.zeros(k)),
        "start_ns": _ns(base[rank], ready[idx]),
        "end_ns": _opt(_ns(base[rank], np.where(done, end[idx], 0)), ~done, pa.int64()),
        "state": _str(("pending", "completed"), done),
        "seq": g.seq[idx],
        "step": g.step[idx],
        "microbatch": _opt(mb, mb < 0, pa.int32()),
        "source": _str([SOURCE], np.zeros(k)),
        "host": _str(hosts, rank),
        "pid": 10_000 + rank,
        "stage": topo.coord["pp"][rank].astype(np.int32),
        "num_elements": size // 2,
        "out_size_bytes": out_size,
        "stream": _str(STREAMS, strm),
        "algorithm": _str((None, "Ring" if cfg.algorithm == "ring" else "Tree"), n > 2),
    }
    return to_kind(pa.table({c: pa.array(v) if isinstance(v, np.ndarray) else v for c, v in cols.items()}),
                   "comm_op")


def compute_table(cfg: SimConfig, topo: Topology, g: Graph, T: Templates, start, end, base) -> pa.Table:
    """Coarse forward/backward/optimizer spans (stream 0), GC pauses, and kernels when asked (stream 7)."""
    is_comp = T.kind[g.tmpl] == 0
    idx = np.flatnonzero(is_comp & np.isfinite(end))
    tm = g.tmpl[idx]
    rank = g.rank[idx]
    vstage = T.chunk[tm] * cfg.pp + topo.coord["pp"][rank]
    names = _take(OPS, T.op_code[tm])
    flops = T.lin[tm] * g.seq_len[idx] + T.quad[tm] * g.seq_len[idx].astype(np.float64) ** 2 + T.fixed[tm]
    frames = [pl.DataFrame({"rank": rank, "name": names, "category": names, "start": start[idx], "end": end[idx],
                            "step": g.step[idx], "mb": T.mb[tm], "stage": vstage, "flops": flops,
                            "stream": np.zeros(len(idx), dtype=np.int64)})]
    gc = idx[g.gc_pause[idx] > 0]
    if gc.size:
        tg = g.tmpl[gc]
        frames.append(pl.DataFrame({
            "rank": g.rank[gc], "name": np.full(gc.size, "gc.collect"), "category": np.full(gc.size, "gc"),
            "start": start[gc] - g.gc_pause[gc], "end": start[gc], "step": g.step[gc], "mb": T.mb[tg],
            "stage": T.chunk[tg] * cfg.pp + topo.coord["pp"][g.rank[gc]], "flops": np.zeros(gc.size),
            "stream": np.zeros(gc.size, dtype=np.int64)}))
    if cfg.want_gemms:
        passes = T.layers[tm] > 0
        back = T.op_code[tm] == OP["backward"]
        for sel, kernels in ((passes & ~back, FWD_KERNELS), (passes & back, BWD_KERNELS)):
            if sel.any():
                frames.append(_kernels(cfg, g, T, idx[sel], start, end, vstage[sel], kernels))
    df = pl.concat(frames, how="diagonal_relaxed")
    r = df["rank"].to_numpy()
    df = df.with_columns(
        job=pl.lit(cfg.job), source=pl.lit(SOURCE),
        start_ns=pl.Series(_ns(base[r], df["start"].to_numpy())),
        end_ns=pl.Series(_ns(base[r], df["end"].to_numpy())),
        microbatch=pl.col("mb").replace(-1, None), host=_hosts(topo, r),
        pid=pl.Series(10_000 + r), device=pl.Series(topo.gpu[r]).cast(pl.Int32),
        dtype=pl.when(pl.col("category").is_in(["gemm", "attention"])).then(pl.lit(cfg.dtype)),
    ).drop("start", "end", "mb")
    return to_kind(df, "compute_op")


FWD_KERNELS = (("qkv", "fwd"), ("attn", "fwd"), ("proj", "fwd"), ("fc1", "fwd"), ("fc2", "fwd"))
BWD_KERNELS = (("fc2", "dgrad"), ("fc2", "wgrad"), ("fc1", "dgrad"), ("fc1", "wgrad"), ("attn", "bwd"),
               ("proj", "dgrad"), ("proj", "wgrad"), ("qkv", "dgrad"), ("qkv", "wgrad"))


def _kernels(cfg, g: Graph, T: Templates, spans, start, end, vstage, kernels) -> pl.DataFrame:
    """GEMM and attention kernels filling each span back to back, each taking time in proportion to its
    flops; a misaligned GEMM carries its misaligned dim, its FLOPs follow it and its time is scaled by the
    fault's ``time_factor``, so the span itself grows by exactly that."""
    tm = g.tmpl[spans]
    s = g.seq_len[spans].astype(np.float64)
    h = cfg.hidden
    m_tok = np.maximum(1, np.rint(cfg.micro_batch_size * s / cfg.cp)).astype(np.int64)
    nk = {"qkv": (3 * h // cfg.tp, h), "proj": (h, h // cfg.tp), "fc1": (4 * h // cfg.tp, h),
          "fc2": (h, 4 * h // cfg.tp)}
    layers = T.layers[tm]
    per_lin = T.lin[tm] / layers
    per_quad = T.quad[tm] / layers
    n_gemm_parts = 2 if kernels is BWD_KERNELS else 1  # dgrad + wgrad share the backward GEMM flops
    fl = np.stack([per_quad * s * s if k == "attn" else per_lin * s * GEMM_SHARE[k] / n_gemm_parts
                   for k, _ in kernels], axis=1)
    w = fl.copy()
    # Per (span, kernel): the tensor-parallel dim a misaligned GEMM has instead of its aligned one.
    split = np.zeros(fl.shape, dtype=np.int64)
    for f in cfg.faults_of("misaligned-gemm"):
        p = cfg.fault_params(f)
        hit = (g.step[spans] >= p["from_step"]) & ((g.rank[spans] == p["rank"]) if p["rank"] >= 0 else True)
        cell = hit[:, None] & np.array([k == p["kernel"] for k, _ in kernels])[None, :]
        split = np.where(cell, p["split"], split)
        fl = np.where(cell, fl * p["split"] / p["aligned_split"], fl)
        w = np.where(cell, w * p["time_factor"], w)
    L, K = int(layers.max()), len(kernels)
    frac = w / (w.sum(axis=1, keepdims=True) * layers[:, None])
    valid = np.broadcast_to((np.arange(L)[None, :] < layers[:, None])[:, :, None], (len(spans), L, K))
    dur = np.where(valid, (end[spans] - start[spans])[:, None, None] * frac[:, None, :], 0.0)
    dur = dur.reshape(len(spans), -1)
    ends = start[spans][:, None] + np.cumsum(dur, axis=1)
    si, ki = np.nonzero(valid.reshape(len(spans), -1))
    kern = ki % K
    base = np.array([k for k, _ in kernels])[kern]
    part = np.array([p for _, p in kernels])[kern]
    is_attn = base == "attn"
    n_f = np.array([nk.get(k, (1, 1))[0] for k, _ in kernels])[kern]
    k_f = np.array([nk.get(k, (1, 1))[1] for k, _ in kernels])[kern]
    mis = split[si, kern]
    col_par = np.isin(base, ("qkv", "fc1"))  # column-parallel: tp splits N; row-parallel (proj, fc2): K
    n_f = np.where((mis > 0) & col_par, mis, n_f)
    k_f = np.where((mis > 0) & ~col_par, mis, k_f)
    mt = m_tok[si]
    m = np.select([part == "dgrad", part == "wgrad"], [mt, k_f], mt)
    n = np.select([part == "dgrad", part == "wgrad"], [k_f, n_f], n_f)
    k = np.select([part == "dgrad", part == "wgrad"], [n_f, mt], k_f)
    null_attn = pl.Series(is_attn)
    labels = [("flash_attn." if k == "attn" else f"gemm.{k}.") + p for k, p in kernels]
    return pl.DataFrame({
        "rank": g.rank[spans][si], "name": _take(labels, kern),
        "category": _take(["attention" if k == "attn" else "gemm" for k, _ in kernels], kern),
        "start": ends[si, ki] - dur[si, ki],
        "end": ends[si, ki], "step": g.step[spans][si], "mb": T.mb[tm][si], "stage": vstage[si],
        "flops": fl[si, kern], "stream": np.full(len(si), KERNEL_STREAM, dtype=np.int64),
        "m": pl.Series(m).set(null_attn, None), "n": pl.Series(n).set(null_attn, None),
        "k": pl.Series(k).set(null_attn, None),
        # PyTorch's operand layouts (A, B transposed?): x @ W.T, dY @ W, and X.T @ dY for the weight
        # gradient, whose reduction over tokens is no operand's contiguous dim.
        "layout": _take(("nt", "nn", "tn"), np.select([part == "dgrad", part == "wgrad"], [1, 2], 0))
        .set(null_attn, None),
    })


def step_table(cfg: SimConfig, g: Graph, ready, end, base) -> tuple[pa.Table, np.ndarray]:
    """step_mark per (rank, step): first launch to last end; end null for a step that never finished.

    Also returns the per-step end (relative ns, max over ranks; inf when unfinished) for truth.json.
    """
    # Ops are laid out step by step, rank by rank: each (step, rank) is one contiguous segment.
    seg = np.flatnonzero(np.r_[True, (g.rank[1:] != g.rank[:-1]) | (g.step[1:] != g.step[:-1])])
    t0 = np.minimum.reduceat(ready, seg)
    t1 = np.maximum.reduceat(end, seg)
    ran = np.isfinite(t0)
    seg, t0, t1 = seg[ran], t0[ran], t1[ran]
    r = g.rank[seg]
    fin = np.isfinite(t1)
    out = pl.DataFrame({
        "job": pl.repeat(cfg.job, len(seg), eager=True), "rank": r.astype(np.int32), "step": g.step[seg],
        "start_ns": _ns(base[r], t0),
        "end_ns": pl.Series(_ns(base[r], np.where(fin, t1, 0))).set(pl.Series(~fin), None),
        "source": pl.repeat(SOURCE, len(seg), eager=True)}).sort("rank", "step")
    step_end = np.full(cfg.steps, np.nan)  # NaN: step not in this chunk of steps
    steps = np.unique(g.step)
    per = np.maximum.reduceat(end, np.searchsorted(g.step, steps))
    step_end[steps] = per
    return to_kind(out, "step_mark"), step_end


def batch_table(cfg: SimConfig, topo: Topology, g: Graph, T: Templates, ready) -> pa.Table:
    """batch_meta: the tokens of every microbatch each rank started (one row per rank, step, microbatch)."""
    fwd = (T.op_code[g.tmpl] == OP["forward"]) & (T.chunk[g.tmpl] == 0) & np.isfinite(ready)
    idx = np.flatnonzero(fwd)
    return to_kind(pl.DataFrame({
        "job": pl.repeat(cfg.job, len(idx), eager=True), "rank": g.rank[idx].astype(np.int32),
        "step": g.step[idx], "microbatch": T.mb[g.tmpl[idx]], "seq_len": g.seq_len[idx],
        "source": pl.repeat(SOURCE, len(idx), eager=True)}), "batch_meta")


def endpoint_table(cfg: SimConfig, topo: Topology) -> pa.Table:
    return conform(pl.DataFrame({
        "job": [cfg.job] * topo.world, "address": topo.addresses,
        "host": [topo.host_name(int(h)) for h in topo.host], "gpu": topo.gpu.astype(np.int32),
        "rank": np.arange(topo.world, dtype=np.int32), "source": [SOURCE] * topo.world}).to_arrow(),
        "endpoint_map")
