"""What-if dependency model from generic records: hooks, Kineto imports, the simulator.

Ops are the coarse compute spans (forward, backward, optimizer, loss, gc, ...;
per-kernel spans only when a rank has nothing coarser) and every comm_op.
Rules (the OSDI'25 model, stated on rankscope's record kinds):

- streams: per rank one compute stream and one stream per comm stream name
  (``stream`` column: dp, pp, tp, ...; p2p sends and recvs apart); ops of a
  stream run in start order;
- a recv from the upstream stage precedes the forward of its microbatch, one
  from downstream the backward; a send follows the compute of its microbatch;
  a recv is posted after the compute the rank ran before it;
- a data-parallel collective that starts before the step's first forward
  (parameter all-gather) precedes that forward; the others follow the compute
  that ran before them (the last backward for the gradient sync); the
  optimizer follows the rank's last collective of the step; other collectives
  (tp, ep) follow the compute before them and block the compute after them;
- sync groups: a collective's members share (group_id, seq, step); a p2p pair
  is (sender, receiver, seq, step).

Every step is replayed from 0; its time is its latest end.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.replay.engine import chain_edges
from rankscope.analysis.whatif.graph import BWD, FWD, WhatIfGraph, WhatIfInputError
from rankscope.collectors.job_frames import JobFrames

COARSE = ("forward", "backward", "optimizer", "loss", "gc", "dataloader")
"""compute_op categories that are whole spans (kernels inside them are not replayed twice)."""
_COMPUTE_TYPE = {"forward": FWD, "backward": BWD}
_SLACK_NS = 1_000.0
"""clock slack when checking a rule against the recorded order (1 us)."""


def _compute(frames: JobFrames) -> pl.DataFrame:
    # only the columns read: a filter gathers every column it carries
    c = frames.compute_op.select("rank", "step", "microbatch", "stage", "category", "start_ns", "end_ns").filter(
        pl.col("step").is_not_null())
    coarse_ranks = c.filter(pl.col("category").is_in(list(COARSE)))["rank"].unique()
    c = c.filter(pl.col("category").is_in(list(COARSE)) | ~pl.col("rank").is_in(coarse_ranks.to_list()))
    return c.select(
        "rank", "step", "microbatch", "stage",
        pl.col("category").replace(_COMPUTE_TYPE).alias("optype"),
        pl.lit("compute").alias("stream"), "start_ns", "end_ns",
        pl.lit(None, dtype=pl.String).alias("group_id"), pl.lit(None, dtype=pl.Int64).alias("seq"),
        pl.lit(None, dtype=pl.Int32).alias("peer"), pl.lit(None, dtype=pl.String).alias("op"),
        pl.lit(None, dtype=pl.Int64).alias("size_bytes"))


def _placement(layout: pl.DataFrame | None) -> tuple[dict, dict]:
    """rank -> stage and rank -> dp rank from the job model's layout (the one layout derivation)."""
    if layout is None or not layout.height:
        return {}, {}
    stage = {int(r): int(s) for r, s in layout.select("rank", "stage").iter_rows() if s is not None}
    dp = {int(r): int(d) for r, d in layout.select("rank", "dp_rank").iter_rows() if d is not None}
    return stage, dp


def generic_graph(frames: JobFrames, layout: pl.DataFrame | None = None) -> WhatIfGraph:
    """Dependency model of hook/Kineto/simulator records (see module docstring); ``layout``: the job model's
    (rank, stage, dp_rank, ...); ranks it does not place are stage 0, dp rank 0."""
    stage_of, dp_of = _placement(layout)
    comp = _compute(frames)
    cm = frames.comm_op.select(
        "rank", "step", "microbatch", "peer", "op", "stream", "start_ns", "end_ns", "group_id", "seq",
        "size_bytes").filter(pl.col("step").is_not_null() & pl.col("end_ns").is_not_null())
    stream = pl.col("stream").fill_null(pl.col("op"))
    cm = cm.with_columns(pl.col("rank").replace_strict(stage_of, default=0, return_dtype=pl.Int32).alias("own"),
                         pl.col("peer").replace_strict(stage_of, default=0, return_dtype=pl.Int32).alias("ps"))
    direction = pl.when(pl.col("ps") > pl.col("own")).then(pl.lit("forward")).otherwise(pl.lit("backward"))
    recv_dir = pl.when(pl.col("ps") < pl.col("own")).then(pl.lit("forward")).otherwise(pl.lit("backward"))
    optype = (pl.when(pl.col("op") == "send").then(direction + "-send")
              .when(pl.col("op") == "recv").then(recv_dir + "-recv")
              .otherwise(pl.col("op") + ":" + stream))
    comm = cm.select(
        "rank", "step", "microbatch", pl.col("own").alias("stage"), optype.alias("optype"),
        pl.when(pl.col("op").is_in(["send", "recv"])).then(pl.col("op")).otherwise(stream).alias("stream"),
        "start_ns", "end_ns", "group_id", "seq", "peer", "op", "size_bytes")
    comp, nested = _without_nested_comm(comp.cast(comm.schema), comm)
    ops = pl.concat([comp, comm.with_columns(pl.lit(None, dtype=pl.Float64).alias("work_ns"))]).with_columns(
        pl.col("start_ns").cast(pl.Float64), pl.col("end_ns").cast(pl.Float64),
        pl.col("rank").replace_strict(stage_of, default=0, return_dtype=pl.Int32).alias("stage"),
        pl.col("rank").replace_strict(dp_of, default=0, return_dtype=pl.Int32).alias("dp_rank"),
    ).sort("step", "rank", "start_ns").with_row_index("row")
    del cm, comm, comp  # the inputs of ops (~0.8 GB at 4,096 GPUs) are not needed beside it
    if ops.height == 0:
        raise WhatIfInputError("no compute_op or comm_op record with a step: nothing to replay")
    # int32 op ids where they fit: the graph keeps its edges through every replay (16 M at 4,096 GPUs),
    # and their int64 copies while the graph was built were the analysis' memory peak
    idx = np.int32 if ops.height < 2**31 - 1 else np.int64
    edges = [_stream_edges(ops), _compute_comm_edges(ops)]
    src = np.concatenate([e[0].astype(idx, copy=False) for e in edges])
    dst = np.concatenate([e[1].astype(idx, copy=False) for e in edges])
    del edges
    start = ops["start_ns"].to_numpy()
    end = ops["end_ns"].to_numpy()
    # a rule the trace itself contradicts (the successor started before the predecessor ended, e.g.
    # overlapping ops of one stream) is not a dependency of this job: drop it, count it (in chunks: no
    # edge-sized float temporaries)
    contradicted = np.empty(src.size, dtype=bool)
    for i in range(0, src.size, 1 << 22):
        j = slice(i, i + (1 << 22))
        np.greater(end[src[j]], start[dst[j]] + _SLACK_NS, out=contradicted[j])
    keep = (src != dst) & ~contradicted
    src, dst = src[keep], dst[keep]
    group = _groups(ops)
    synced = group >= 0
    latest = np.full(int(group.max()) + 1 if synced.any() else 0, -np.inf)
    np.maximum.at(latest, group[synced], start[synced])
    actual = np.where(synced, _transfer_end(ops, group, end) - latest[np.where(synced, group, 0)], end - start)
    work = ops["work_ns"].to_numpy()
    actual = np.where(np.isnan(work), actual, work)
    actual = np.maximum(actual, 0.0)
    steps = np.sort(ops["step"].unique().to_numpy())
    step_index = np.searchsorted(steps, ops["step"].to_numpy())
    out = ops.with_columns(
        pl.Series("synced", synced), pl.col("op").is_not_null().alias("comm"), pl.Series("actual", actual),
        pl.col("seq"))
    return WhatIfGraph(ops=out.drop("row", "group_id", "peer", "op", "work_ns"), src=src, dst=dst, group=group,
                       step_index=step_index, steps=steps, model="generic",
                       notes={"dp": len(set(dp_of.values())) or 1, "pp": len(set(stage_of.values())) or 1,
                              "edges_contradicted": int(contradicted.sum()), "compute_spans_enclosing_comm": nested})


def _without_nested_comm(comp: pl.DataFrame, comm: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Compute spans that enclose blocking comm ops of their rank (a TP all-reduce inside a forward or
    backward span): their work without those ops, replayed after them.

    A span's time inside an enclosed collective is that collective's wait and transfer, not the
    span's work: counted as compute it makes a rank that waited for its TP peer look slow (and its
    ideal, an op-type mean, longer). Such a span keeps one op (per-span work stays comparable across
    ranks and stages, whatever number of collectives each encloses) whose duration (``work_ns``) is
    its time outside the enclosed ops, and whose start moves to the last enclosed op's end: in the
    replay the enclosed collectives run first (after the compute before them) and block the span.
    Returns (compute ops with ``work_ns`` where changed, how many spans enclose comm)."""
    comp = comp.with_columns(pl.lit(None, dtype=pl.Float64).alias("work_ns"))
    if comp.is_empty() or comm.is_empty():
        return comp, 0
    c = comp.with_row_index("cid").sort("start_ns")
    # only ops that block the rank's compute: p2p is posted and waited apart, and a data-parallel
    # collective overlapping a backward runs beside it (its own stream on a GPU), not inside it
    comm = comm.filter(~pl.col("stream").is_in(["send", "recv", "dp"]))
    enclosed = comm.select("rank", "step", pl.col("start_ns").alias("cs"), pl.col("end_ns").alias("ce")).sort(
        "cs").join_asof(c.select("rank", "step", "cid", "start_ns", "end_ns"), left_on="cs", right_on="start_ns",
                        by=["rank", "step"], strategy="backward", check_sortedness=False).filter(
        pl.col("cid").is_not_null() & (pl.col("ce") <= pl.col("end_ns")) & (pl.col("cs") >= pl.col("start_ns")))
    if enclosed.is_empty():
        return comp, 0
    # the span's time outside its enclosed ops: the pieces between them (overlapping enclosed ops are one)
    cuts = enclosed.sort("cid", "cs").with_columns(pl.col("ce").cum_max().over("cid").alias("ce"))
    pieces = cuts.select("cid", pl.col("ce").shift(1).over("cid").fill_null(pl.col("start_ns")).alias("s"),
                         pl.col("cs").alias("e"))
    tail = cuts.group_by("cid").agg(pl.col("ce").max().alias("s"), pl.col("end_ns").first().alias("e"))
    work = pl.concat([pieces, tail.select("cid", "s", "e")]).group_by("cid").agg(
        (pl.col("e") - pl.col("s")).cast(pl.Float64).clip(lower_bound=0).sum().alias("w"))
    last = tail.select("cid", pl.col("s").alias("after"))
    out = c.join(work, on="cid", how="left").join(last, on="cid", how="left").with_columns(
        pl.coalesce("w", "work_ns").alias("work_ns"),
        pl.coalesce(pl.col("after").cast(c.schema["start_ns"]), "start_ns").alias("start_ns")).sort("cid")
    return out.select(comp.columns), int(work.height)


def _transfer_end(ops: pl.DataFrame, group: np.ndarray, end: np.ndarray) -> np.ndarray:
    """End of each op's transfer: a send paired with its recv ends no later than the recv.

    An async send (isend) is only waited on later, often at the step's end: its span then ends at
    that wait, not when the receiver had the data. Left as is, the pair's sync group would last that
    long and hold the receiver in the replay (and the ideal, a median of such spans, would hold
    every receiver)."""
    stream = ops["stream"].to_numpy()
    send, recv = (stream == "send") & (group >= 0), (stream == "recv") & (group >= 0)
    if not (send.any() and recv.any()):
        return end
    recv_end = np.full(int(group.max()) + 1, np.inf)
    np.minimum.at(recv_end, group[recv], end[recv])
    return np.where(send, np.minimum(end, recv_end[np.where(send, group, 0)]), end)


def _stream_edges(ops: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each op after the previous op of its stream: ``ops`` sorted by step, rank and start."""
    if ops.select(pl.any_horizontal(pl.col("step", "rank", "start_ns", "stream").is_null().any())).item():
        key = ops.select(pl.struct("step", "rank", "stream").rank("dense"))[:, 0].to_numpy()
        return chain_edges(key, ops["start_ns"].to_numpy())
    # ops arrive in (step, rank, start) order, so a stable sort by (step, rank) run and stream keeps
    # each stream in start order: an integer key instead of a struct rank, and no two-key lexsort
    step, rank = ops["step"].to_numpy(), ops["rank"].to_numpy()
    new_run = np.empty(ops.height, dtype=bool)
    new_run[0] = True
    new_run[1:] = (step[1:] != step[:-1]) | (rank[1:] != rank[:-1])
    stream = ops["stream"].cast(pl.Categorical).to_physical().to_numpy()
    n_streams = int(stream.max()) + 1
    # the narrowest key that holds (run, stream): this sort is the graph build's memory peak
    kt = np.int32 if int(new_run.sum()) * n_streams < 2**31 - 1 else np.int64
    key = np.cumsum(new_run, dtype=kt)
    del new_run
    key -= 1
    key *= n_streams
    key += stream.astype(kt, copy=False)
    del stream
    return chain_edges(key)


def _compute_comm_edges(ops: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    # lazy throughout: each query reads only the columns and rows it needs from ops (materialised
    # compute and comm tables, sorted whole, were the analysis' memory peak at 4,096 GPUs)
    comp = ops.lazy().filter(pl.col("op").is_null())
    comm = ops.lazy().filter(pl.col("op").is_not_null())
    src, dst = [], []

    def add(lf: pl.LazyFrame, a: str, b: str):
        df = lf.select(a, b).drop_nulls().collect()
        src.append(df[a].to_numpy())
        dst.append(df[b].to_numpy())

    key = ["step", "rank", "microbatch"]
    # recv -> the compute of its microbatch; compute -> the send of its microbatch
    for direction in ("forward", "backward"):
        c = comp.filter(pl.col("optype") == f"{direction}-compute").select(*key, pl.col("row").alias("c")).collect()
        r = comm.filter(pl.col("optype") == f"{direction}-recv").select("row", *key).join(c.lazy(), on=key)
        add(r, "row", "c")
        sends = comm.filter(pl.col("optype") == f"{direction}-send").select("row", *key).join(c.lazy(), on=key)
        add(sends, "c", "row")
    # every comm op follows the compute the rank finished last before it started (program order)
    # (the as-of joins go by one integer per (step, rank): a two-column "by" cost 3x as much)
    n_rank = int(ops["rank"].max()) + 1
    sr = (pl.col("step").cast(pl.Int64) * n_rank + pl.col("rank").cast(pl.Int64)).alias("sr")
    ce = comp.select(sr, pl.col("end_ns").alias("start_ns"), pl.col("row").alias("c")).sort("start_ns").collect()
    before = comm.select("row", sr, "start_ns").sort("start_ns").collect().join_asof(
        ce, on="start_ns", by="sr", strategy="backward", check_sortedness=False)
    del ce
    add(before.lazy(), "c", "row")
    # parameter all-gathers before the first forward; the optimizer after the last collective
    first_fwd = comp.filter(pl.col("optype") == FWD).select("step", "rank", "row", "start_ns").sort(
        "start_ns").group_by("step", "rank").first().select(
        "step", "rank", pl.col("row").alias("f"), pl.col("start_ns").alias("fs"))
    coll = comm.filter(~pl.col("stream").is_in(["send", "recv"])).select("row", "step", "rank", "start_ns").join(
        first_fwd, on=["step", "rank"], how="left")
    add(coll.filter(pl.col("start_ns") < pl.col("fs")), "row", "f")
    opt = comp.filter(pl.col("optype") == "optimizer").select("step", "rank", "row", "start_ns").group_by(
        "step", "rank").first().select("step", "rank", pl.col("row").alias("o"), pl.col("start_ns").alias("os"))
    last = comm.filter(pl.col("stream") == "dp").select("row", "step", "rank", "end_ns").join(
        opt, on=["step", "rank"]).filter(
        pl.col("end_ns") <= pl.col("os")).sort("end_ns").group_by("step", "rank").last()
    add(last, "row", "o")
    # blocking collectives (tp, ep, ...) hold the compute that follows them
    blocking = comm.filter(~pl.col("stream").is_in(["send", "recv", "dp"])).select(
        "row", sr, "end_ns").sort("end_ns").collect()
    cs = comp.select(sr, pl.col("start_ns").alias("end_ns"), pl.col("row").alias("n")).sort("end_ns").collect()
    after = blocking.join_asof(cs, on="end_ns", by="sr", strategy="forward", check_sortedness=False)
    add(after.lazy(), "row", "n")
    return np.concatenate(src), np.concatenate(dst)


def _groups(ops: pl.DataFrame) -> np.ndarray:
    """Sync group per op: collectives by (group_id, seq, step), p2p pairs by (sender, receiver, seq, step).

    Ops with a null key part are in no group (-1). Groups are numbered from 0 in the order of their
    keys; the replay does not depend on the numbering, only on which ops share one.
    """
    is_p2p = pl.col("stream").is_in(["send", "recv"])
    sender = pl.when(pl.col("stream") == "send").then(pl.col("rank")).otherwise(pl.col("peer"))
    receiver = pl.when(pl.col("stream") == "send").then(pl.col("peer")).otherwise(pl.col("rank"))
    # the group (or the op name, for a collective without one) as a small integer: one code per
    # distinct name, not a string key per op (5 M ops at 4,096 GPUs)
    coll = pl.col("group_id").fill_null(pl.col("op")).cast(pl.Categorical).to_physical()
    k = ops.select(
        kind=pl.when(is_p2p).then(pl.lit(1, pl.Int64)).when(pl.col("op").is_not_null()).then(pl.lit(2, pl.Int64)),
        a=pl.when(is_p2p).then(sender.cast(pl.Int64)).otherwise(coll.cast(pl.Int64)),
        b=pl.when(is_p2p).then(receiver.cast(pl.Int64)).otherwise(pl.lit(0, pl.Int64)),
        seq=pl.col("seq").cast(pl.Int64), step=pl.col("step").cast(pl.Int64))
    keyed = k.select(pl.all_horizontal(pl.all().is_not_null()))[:, 0].to_numpy()
    codes = np.full(ops.height, -1, dtype=np.int64)
    if not keyed.any():
        return codes
    parts = [k[c].to_numpy()[keyed] for c in ("kind", "a", "b", "seq", "step")]
    # one int64 per key when the parts' ranges fit, else a row-wise unique over the parts
    lo = [int(x.min()) for x in parts]
    span = [int(x.max()) - m + 1 for x, m in zip(parts, lo, strict=True)]
    if np.prod([float(v) for v in span]) < 2**62:
        key = np.zeros(int(keyed.sum()), dtype=np.int64)
        for x, m, v in zip(parts, lo, span, strict=True):
            key = key * v + (x - m)
        _, inv = np.unique(key, return_inverse=True)
    else:
        _, inv = np.unique(np.stack(parts, axis=1), axis=0, return_inverse=True)
    codes[keyed] = inv.reshape(-1)
    return codes
