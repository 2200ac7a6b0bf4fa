"""Communication ops of a Kineto trace -> comm_op rows.

Three forms are seen in the wild, and each file is read in the richest one it holds:

- NCCL form: ``record_param_comms`` cpu_ops with ``Collective name``, message
  sizes, dtype and process group; NCCL kernels carry the same args.
- gloo form (torch 2.13 on gloo): ``c10d::allreduce_``, ``c10d::send``, ...
  cpu_ops (peer and tag in ``Concrete Inputs``, shapes in ``Input Dims``) and a
  ``gloo:*`` user annotation on a gloo worker thread that runs the transfer and
  knows the dtype; the row's start/end are the worker's, launch_ns the call's.
- older form: ``record_param_comms`` with only ``Input Dims``; the op comes
  from the enclosing ``nccl:*`` annotation.

GPU NCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``) are the execution of a
collective: each becomes one row with the kernel's times, ``stream`` = the CUDA
stream and ``launch_ns`` = the CPU call; the CPU call it was launched from is
then not stored again, so nothing is counted twice.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from rankscope.collectors.importers.kineto.chrome_trace import KinetoTrace, containing, steps_at
from rankscope.collectors.schema import P2P_OPS
from rankscope.collectors.vocab import NCCL_KERNEL, dtype_name, dtype_size, kernel_op, normalise_op


def parse_ranks(v) -> list[int] | None:
    """'[0, 1]' or [0, 1] -> [0, 1]; anything else None."""
    if isinstance(v, list):
        vals = v
    elif isinstance(v, str) and v.strip():
        vals = re.findall(r"-?\d+", v)
    else:
        return None
    try:
        out = [int(x) for x in vals]
    except (TypeError, ValueError):
        return None
    return out or None


def _int(v) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return None
    return None


def _numel(dims) -> int | None:
    """Elements of a shape [a, b] or of a tensor list [[a, b], [c]]; None for anything else."""
    if not isinstance(dims, list):
        return None
    if dims and all(isinstance(d, list) for d in dims):
        parts = [_flat_numel(d) for d in dims]
        return None if any(p is None for p in parts) else sum(parts)
    return _flat_numel(dims)


def _flat_numel(dims: list) -> int | None:
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return None
    return int(np.prod(dims)) if dims else 1


def _shape_text(x, depth: int = 0) -> str:
    """str() of a shape for matching, bounded: a fuzzed file may nest lists thousands deep."""
    if isinstance(x, list):
        if depth >= 4:
            return "[...]"
        return "[" + ", ".join(_shape_text(v, depth + 1) for v in x[:64]) + "]"
    return repr(x) if isinstance(x, (int, float, str, type(None))) else "?"


def _rpc_fields(a: dict) -> dict:
    """Fields of a record_param_comms / NCCL kernel args dict (NCCL form)."""
    ranks = parse_ranks(a.get("Process Group Ranks"))
    size = _int(a.get("Group size"))
    start, stride = _int(a.get("Global rank start")), _int(a.get("Global rank stride"))
    if ranks is None and size and start is not None and stride:
        ranks = [start + stride * i for i in range(size)]
    n_in, n_out = _int(a.get("In msg nelems")), _int(a.get("Out msg nelems"))
    esize = dtype_size(a.get("dtype"))
    return {
        "op": normalise_op(a.get("Collective name")),
        "group_id": str(a["Process Group Name"]) if a.get("Process Group Name") not in (None, "") else None,
        "group_ranks": ranks,
        "num_elements": n_in,
        "size_bytes": n_in * esize if n_in is not None and esize else None,
        "out_size_bytes": n_out * esize if n_out is not None and esize else None,
        "dtype": dtype_name(a.get("dtype")),
        "local_peer": _int(a.get("Dst Rank")) if normalise_op(a.get("Collective name")) == "send"
        else _int(a.get("Src Rank")),
    }


def _c10d_fields(name: str, a: dict) -> dict:
    op = normalise_op(name)
    dims = a.get("Input Dims") or []
    n = _numel(dims[0]) if dims else None
    concrete = a.get("Concrete Inputs") or []
    peer = _int(concrete[2]) if op in P2P_OPS and len(concrete) > 2 else None
    return {"op": op, "group_id": None, "group_ranks": None, "num_elements": n, "size_bytes": None,
            "out_size_bytes": None, "dtype": None, "local_peer": peer, "_shape": _shape_text(dims[0]) if dims else ""}


def _gloo_match(tr: KinetoTrace, cpu: pl.DataFrame, fields: list[dict]) -> tuple[list, list, list]:
    """Pair each c10d call with the gloo:* worker annotation that ran it (same op and shape, in order)."""
    g = tr.frame.filter(pl.col("name").str.starts_with("gloo:")).sort("ts_ns")
    queues: dict[tuple, list] = {}
    for (ts, dur), a, name in zip(g.select("ts_ns", "dur_ns").iter_rows(), tr.args(g["idx"]),
                                       g["name"], strict=True):
        dims = a.get("Input Dims") or []
        shape = _shape_text([dims[0]]) if dims and isinstance(dims[0], list) and dims[0] and \
            not isinstance(dims[0][0], list) else _shape_text(dims[0]) if dims else ""
        types = a.get("Input type") or [None]
        queues.setdefault((normalise_op(name), shape), []).append((ts, ts + dur, types[0]))
    pos: dict[tuple, int] = {}
    start, end, dt = [], [], []
    for f in fields:
        key = (f["op"], f.pop("_shape", ""))
        q = queues.get(key) or queues.get((f["op"], "")) or []
        i = pos.get(key, 0)
        pos[key] = i + 1
        hit = q[i] if i < len(q) else (None, None, None)
        start.append(hit[0])
        end.append(hit[1])
        dt.append(hit[2])
    return start, end, dt


def _pg_config(tr: KinetoTrace) -> dict[str, list[int]]:
    out = {}
    for g in tr.dist_info.get("pg_config") or []:
        if isinstance(g, dict) and g.get("pg_name") is not None:
            ranks = parse_ranks(g.get("ranks"))
            if ranks is not None:
                out[str(g["pg_name"])] = ranks
    return out


def _cpu_calls(tr: KinetoTrace) -> tuple[str, pl.DataFrame, list[dict]]:
    """The CPU-side comm calls of the richest form present: (form, events, fields per event)."""
    f = tr.frame
    rpc = f.filter(pl.col("name") == "record_param_comms")
    rpc_args = tr.args(rpc["idx"])
    if any("Collective name" in a for a in rpc_args):
        fields = [_rpc_fields(a) for a in rpc_args]
        keep = [x["op"] is not None for x in fields]
        return "nccl", rpc.filter(pl.Series(keep, dtype=pl.Boolean)), _kept(fields, keep)
    c10d = f.filter((pl.col("cat") == "cpu_op") & pl.col("name").str.starts_with("c10d::"))
    if c10d.height:
        fields = [_c10d_fields(n, a) for n, a in zip(c10d["name"], tr.args(c10d["idx"]), strict=True)]
        keep = [x["op"] is not None for x in fields]
        return "c10d", c10d.filter(pl.Series(keep, dtype=pl.Boolean)), _kept(fields, keep)
    ann = f.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("nccl:"))
    fields = [{"op": normalise_op(n), "group_id": None, "group_ranks": None, "num_elements": None,
               "size_bytes": None, "out_size_bytes": None, "dtype": None, "local_peer": None}
              for n in ann["name"]]
    keep = [x["op"] is not None for x in fields]
    return "annotation", ann.filter(pl.Series(keep, dtype=pl.Boolean)), _kept(fields, keep)


def _kept(fields: list[dict], keep: list[bool]) -> list[dict]:
    return [x for x, k in zip(fields, keep, strict=True) if k]


def launches(tr: KinetoTrace, correlation: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tid, ts_ns and External id of the runtime call that launched each kernel (-1 where unknown)."""
    by_corr = tr.memo.get("runtime_calls")
    if by_corr is None:
        # every runtime call (the last where a correlation repeats), decoded once per trace: comm and
        # compute both ask
        rt = tr.frame.filter(pl.col("cat").is_in(["cuda_runtime", "cuda_driver"]))
        by_corr = {a.get("correlation"): (tid, ts, a.get("External id"))
                   for a, tid, ts in zip(tr.args(rt["idx"]), rt["tid"].to_list(), rt["ts_ns"].to_list(), strict=True)}
        tr.memo["runtime_calls"] = by_corr
    hits = [by_corr.get(c, (-1, -1, None)) for c in correlation]
    return (np.array([h[0] if h[0] is not None else -1 for h in hits], dtype=np.int64),
            np.array([h[1] for h in hits], dtype=np.int64), np.array([h[2] for h in hits], dtype=object))


def comm_rows(tr: KinetoTrace, steps: pl.DataFrame) -> tuple[pl.DataFrame, dict]:
    """comm_op rows of one trace (columns of the comm_op kind plus ``name``), and notes."""
    form, cpu, fields = _cpu_calls(tr)
    cpu_args = tr.args(cpu["idx"])
    cpu_ts = cpu["ts_ns"].to_numpy()
    cpu_end = cpu_ts + cpu["dur_ns"].to_numpy()
    start = cpu_ts.astype(object)
    end = cpu_end.astype(object)
    if form == "c10d":
        g_start, g_end, g_dtype = _gloo_match(tr, cpu, fields)
        for i, f in enumerate(fields):
            if g_start[i] is not None:
                start[i], end[i] = max(g_start[i], cpu_ts[i]), max(g_end[i], cpu_ts[i])
            f["dtype"] = dtype_name(g_dtype[i])
            es = dtype_size(g_dtype[i])
            if es and f["num_elements"] is not None:
                f["size_bytes"] = f["num_elements"] * es
    k = tr.frame.filter((pl.col("cat") == "kernel") & pl.col("name").str.contains(NCCL_KERNEL))
    k_args = tr.args(k["idx"])
    l_tid, l_ts, l_ext = launches(tr, [a.get("correlation") for a in k_args])
    ext_to_cpu = {a.get("External id"): i for i, a in enumerate(cpu_args) if a.get("External id") is not None}
    link = np.array([ext_to_cpu.get(a.get("External id"), ext_to_cpu.get(e, -1))
                     for a, e in zip(k_args, l_ext, strict=True)], dtype=np.int64)
    unlinked = (link < 0) & (l_ts >= 0)
    if unlinked.any() and cpu.height:
        link[unlinked] = containing(cpu.select("tid", "ts_ns", "dur_ns"), l_tid[unlinked], l_ts[unlinked])
    rows = []
    linked_cpu = set(link[link >= 0].tolist())
    k_ts, k_dur = k["ts_ns"].to_numpy(), k["dur_ns"].to_numpy()
    for j, a in enumerate(k_args):
        f = _rpc_fields(a)
        c = fields[link[j]] if link[j] >= 0 else {}
        row = {key: f.get(key) if f.get(key) is not None else c.get(key) for key in f}
        row["op"] = f["op"] or c.get("op") or kernel_op(k["name"][j])
        row.update(name=k["name"][j], start_ns=int(k_ts[j]), end_ns=int(k_ts[j] + k_dur[j]),
                   stream=str(a["stream"]) if a.get("stream") is not None else None,
                   launch_ns=int(cpu_ts[link[j]]) if link[j] >= 0 else (int(l_ts[j]) if l_ts[j] >= 0 else None),
                   t_step=int(l_ts[j]) if l_ts[j] >= 0 else int(k_ts[j]))
        rows.append(row)
    for i, f in enumerate(fields):
        if i in linked_cpu:
            continue
        row = dict(f)
        row.update(name=cpu["name"][i], start_ns=int(start[i]), end_ns=int(end[i]), stream=None,
                   launch_ns=int(cpu_ts[i]) if start[i] != cpu_ts[i] else None, t_step=int(cpu_ts[i]))
        rows.append(row)
    notes = {"comm_form": form, "nccl_kernels": int(k.height)}
    named = named_groups([*cpu_args, *k_args])
    if named:
        notes["pg_named"] = named
    return _finish(tr, rows, steps, notes), notes


def named_groups(args: list[dict]) -> list[dict]:
    """The process groups NCCL calls name (``Process Group Description`` with ``Process Group Ranks``),
    other than torch's ``undefined``: [{desc, ranks}] each once, for the strategy."""
    seen: dict[tuple, dict] = {}
    for a in args:
        desc = a.get("Process Group Description")
        if not isinstance(desc, str) or desc in ("", "undefined"):
            continue
        ranks = parse_ranks(a.get("Process Group Ranks"))
        if ranks:
            seen.setdefault((desc, tuple(ranks)), {"desc": desc, "ranks": ranks})
    return list(seen.values())


def _finish(tr: KinetoTrace, rows: list[dict], steps: pl.DataFrame, notes: dict) -> pl.DataFrame:
    """Resolve groups and global peers, number calls per group, and build the frame."""
    pg = _pg_config(tr)
    by_ranks = {tuple(v): k for k, v in pg.items()}
    recovered = {}
    unknown_group = 0
    for r in rows:
        gid, ranks = r.get("group_id"), r.get("group_ranks")
        if gid is not None and ranks is None:
            ranks = pg.get(gid)
        if gid is None and ranks is not None:
            gid = by_ranks.get(tuple(ranks), "ranks:" + ",".join(map(str, ranks)))
        if gid is not None and ranks is not None and gid not in pg:
            recovered[gid] = ranks
        if gid is None and ranks is None:
            unknown_group += 1
        r["group_id"], r["group_ranks"] = gid, ranks
        lp = r.pop("local_peer", None)
        if r["op"] in P2P_OPS and lp is not None:
            r["peer"] = ranks[lp] if ranks and 0 <= lp < len(ranks) else lp
        else:
            r["peer"] = None
    notes["groups_recovered_from_ops"] = sorted(recovered)
    notes["ops_without_group"] = unknown_group
    if not rows:
        return pl.DataFrame()
    df = pl.DataFrame(rows, infer_schema_length=None, schema_overrides={
        "group_ranks": pl.List(pl.Int32), "start_ns": pl.Int64, "end_ns": pl.Int64, "launch_ns": pl.Int64,
        "size_bytes": pl.Int64, "out_size_bytes": pl.Int64, "num_elements": pl.Int64, "peer": pl.Int32})
    step = steps_at(steps, df["t_step"].to_numpy())
    df = df.with_columns(pl.Series("step", step).fill_nan(None).cast(pl.Int64)).drop("t_step").sort("start_ns")
    # Sequence numbers: per group for collectives; per group, direction and peer for p2p.
    key = [pl.col("group_id").fill_null("?"),
           pl.when(pl.col("op").is_in(list(P2P_OPS))).then(pl.col("op") + ":" + pl.col("peer").cast(pl.String))
           .otherwise(pl.lit("coll")).fill_null("p2p:?")]
    df = df.with_columns((pl.int_range(pl.len()).over(key) + 1).cast(pl.Int64).alias("seq"))
    return df.with_columns(pl.lit(tr.rank, pl.Int32).alias("rank"), pl.lit("completed").alias("state"),
                           pl.lit(tr.host).alias("host"), pl.lit(tr.pid, pl.Int64).alias("pid"))
