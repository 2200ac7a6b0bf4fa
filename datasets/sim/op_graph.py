"""The job's dependency graph: every op of every rank and step, with durations and faults.

The per-stage step templates (:mod:`sim.stage_ops`) are tiled over ranks and
steps with numpy; edges, sync groups (collective members, send/recv pairs),
durations and launch delays come out as flat arrays ready for
:func:`rankscope.analysis.replay.engine.replay`. Faults act here, on physical
quantities only: a slow worker's compute takes ``factor`` times longer, a
slow NIC makes every inter-host transfer it takes part in ``factor`` times
longer, a GC pause delays the launch of a forward pass, a hang is a launch
that never happens (infinite delay), and so on; who waits for whom is then
left to the replay.
"""

from __future__ import annotations

import numpy as np

from rankscope.collectors.record_class import record
from rankscope.datasets.sim.job_config import SimConfig
from rankscope.datasets.sim.stage_ops import OP, OPS, STREAMS, stage_template
from rankscope.datasets.sim.topology import Topology, pod_of

GEMM_SHARE = {"qkv": 6 / 24, "proj": 2 / 24, "fc1": 8 / 24, "fc2": 8 / 24}
"""Share of a layer's GEMM flops per kernel (qkv 6mh^2, proj 2mh^2, fc1/fc2 8mh^2 each)."""
AXIS_CODE = {a: i for i, a in enumerate(STREAMS)}


@record(frozen=False)
class Templates:
    """The concatenated step templates of all stages (one row per template op)."""

    kind: np.ndarray          # 0 compute, 1 communication
    name: list[str]
    op: list[str]
    op_code: np.ndarray       # index into OPS
    stream: np.ndarray        # index into STREAMS
    mb: np.ndarray
    chunk: np.ndarray
    cidx: np.ndarray
    p2p_dir: np.ndarray
    p2p_src_vs: np.ndarray
    role: np.ndarray          # 0 none, 1 send, 2 recv
    lin: np.ndarray
    quad: np.ndarray
    fixed: np.ndarray
    nb_lin: np.ndarray
    nb_fixed: np.ndarray
    layers: np.ndarray
    offset: np.ndarray        # first row of each stage
    length: np.ndarray
    tail: np.ndarray          # local row that ends the step, per stage
    edges: list[tuple[np.ndarray, np.ndarray]]  # per stage (dst local, src local; -1 = previous step tail)


def build_templates(cfg: SimConfig) -> Templates:
    per = [stage_template(cfg, s) for s in range(cfg.pp)]
    rows = [r for rows, _ in per for r in rows]

    def col(key, default=0, dtype=np.float64):
        return np.array([r.get(key, default) for r in rows], dtype=dtype)

    length = np.array([len(r) for r, _ in per])
    edges = []
    for rws, _ in per:
        dst = [i for i, r in enumerate(rws) for _ in r["deps"]]
        src = [d for r in rws for d in r["deps"]]
        edges.append((np.array(dst, dtype=np.int64), np.array(src, dtype=np.int64)))
    return Templates(
        kind=col("kind", 0, np.int8), name=[r["name"] for r in rows], op=[r["op"] for r in rows],
        op_code=np.array([OPS.index(r["op"]) for r in rows], dtype=np.int8),
        stream=np.array([STREAMS.index(r["stream"]) for r in rows], dtype=np.int8),
        mb=col("mb", -1, np.int32), chunk=col("chunk", 0, np.int32), cidx=col("cidx", -1, np.int64),
        p2p_dir=np.array([r.get("p2p", (-1, -1))[0] for r in rows], dtype=np.int64),
        p2p_src_vs=np.array([r.get("p2p", (-1, -1))[1] for r in rows], dtype=np.int64),
        role=np.array([{"send": 1, "recv": 2}.get(r.get("role"), 0) for r in rows], dtype=np.int8),
        lin=np.array([r.get("flops", (0.0, 0.0))[0] for r in rows]),
        quad=np.array([r.get("flops", (0.0, 0.0))[1] for r in rows]),
        fixed=col("fixed_flops", 0.0), nb_lin=np.array([r.get("nbytes", (0.0, 0.0))[0] for r in rows]),
        nb_fixed=np.array([r.get("nbytes", (0.0, 0.0))[1] for r in rows]), layers=col("layers", 0, np.int64),
        offset=np.r_[0, np.cumsum(length)[:-1]], length=length,
        tail=np.array([t for _, t in per], dtype=np.int64), edges=edges)


@record(frozen=False)
class Graph:
    """Flat per-op arrays of a whole job (op id = position)."""

    step: np.ndarray
    rank: np.ndarray
    tmpl: np.ndarray          # row of the templates
    seq_len: np.ndarray       # tokens of the op's microbatch (0 for step-level ops)
    peer: np.ndarray          # p2p peer rank, -1 otherwise
    group_row: np.ndarray     # row of topo.groups[axis] for communication ops, -1 for compute
    size_bytes: np.ndarray
    cross_host: np.ndarray
    duration: np.ndarray
    delay: np.ndarray
    sync: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    seq: np.ndarray           # per-group sequence number (p2p: per sender/receiver pair)
    gc_pause: np.ndarray      # ns of GC pause before the op (forward passes), else 0
    seq_table: np.ndarray     # (steps, replicas, microbatches) tokens
    ops_per_step: int
    entry_dst: np.ndarray     # ops of the first step that wait for the previous step's tail ...
    entry_rank: np.ndarray    # ... of this rank
    tail_op: np.ndarray       # per rank, the op that ends the last step


def sequence_lengths(cfg: SimConfig, rng: np.random.Generator) -> np.ndarray:
    """Tokens per (step, data replica, microbatch); the seq-skew fault draws them lognormally."""
    replicas = cfg.dp * cfg.ep
    shape = (cfg.steps, replicas, cfg.microbatches)
    seq = np.full(shape, float(cfg.seq_len))
    for f in cfg.faults_of("seq-skew"):
        p = cfg.fault_params(f)
        seq = cfg.seq_len * rng.lognormal(-p["sigma"] ** 2 / 2, p["sigma"], shape)
        if p["dp_rank"] >= 0:
            seq[:, p["dp_rank"] * cfg.ep:(p["dp_rank"] + 1) * cfg.ep, :] *= p["factor"]
        seq = np.clip(seq, p["min_len"], None)
    return np.rint(seq).astype(np.int64)


def _transfer_ns(cfg: SimConfig, op: np.ndarray, n: np.ndarray, size: np.ndarray, cross: np.ndarray,
                 cross_pod: np.ndarray | None = None) -> np.ndarray:
    """Transfer time of each op from its payload, group size and link (NCCL's ring/tree cost model); an op
    whose group spans pods (``cross_pod``) runs at the pod uplink's rate and pays its latency on every hop."""
    bw = np.where(cross, cfg.nic_gbps, cfg.nvlink_gbps) / 8.0  # bytes per ns
    lat = cfg.link_latency_ns
    if cross_pod is not None and cross_pod.any():
        bw = np.where(cross_pod, min(cfg.nic_gbps, cfg.pod_uplink_gbps or cfg.nic_gbps) / 8.0, bw)
        lat = lat + np.where(cross_pod, cfg.pod_latency_ns, 0.0)
    nn = np.maximum(n, 1).astype(np.float64)
    steps = nn - 1
    ring_ar = 2 * steps / nn * size / bw + 2 * steps * lat
    if cfg.algorithm == "tree":
        ring_ar = 2 * size / bw + 2 * np.ceil(np.log2(nn)) * lat
    out = np.select(
        [op == OP["all_reduce"], op == OP["reduce_scatter"], op == OP["all_gather"], op == OP["all_to_all"]],
        [ring_ar, steps / nn * size / bw + steps * lat, steps * size / bw + steps * lat,
         steps / nn * size / bw + lat],
        default=size / bw + lat)
    return out


def _cross_pod(cfg: SimConfig, topo: Topology, ci: np.ndarray, strm: np.ndarray, rank: np.ndarray,
               peer: np.ndarray, group_row: np.ndarray) -> np.ndarray | None:
    """Per op, True for a comm op whose group (a p2p op: its two ends) spans pods; None without pods."""
    pod = pod_of(cfg, topo.host)
    if pod is None:
        return None
    out = np.zeros(len(rank), dtype=bool)
    for code, a in enumerate(STREAMS):
        m = ci[strm[ci] == code] if a != "compute" else ci[:0]
        if not m.size:
            continue
        if a == "pp":
            out[m] = pod[rank[m]] != pod[np.maximum(peer[m], 0)]
        else:
            members = pod[topo.groups[a]]
            out[m] = (members != members[:, :1]).any(axis=1)[group_row[m]]
    return out


def ops_per_step(T: Templates, topo: Topology) -> int:
    return int(T.length[topo.coord["pp"]].sum())


def build_graph(cfg: SimConfig, topo: Topology, rng: np.random.Generator, T: Templates, seq_table: np.ndarray,
                step0: int = 0, steps: int | None = None) -> Graph:
    """The ops of steps ``step0 .. step0 + steps - 1`` (default: all), op id = position.

    Ops that wait for the previous step's tail are listed in ``entry_dst``/``entry_rank``
    (the caller anchors them to where the previous chunk of steps ended).
    """
    world = topo.world
    steps = cfg.steps - step0 if steps is None else steps
    stage = topo.coord["pp"]
    Lr = T.length[stage]
    rank_off = np.r_[0, np.cumsum(Lr)[:-1]]
    P = int(Lr.sum())
    r1 = np.repeat(np.arange(world), Lr)
    t1 = T.offset[stage[r1]] + np.arange(P) - rank_off[r1]
    n_ops = P * steps
    step = step0 + np.repeat(np.arange(steps, dtype=np.int64), P)
    rank = np.tile(r1, steps)
    tmpl = np.tile(t1, steps)

    # Edges: template edges for every rank of the stage, tiled over steps, plus step-to-step tails.
    srcs, dsts, entry_dst, entry_rank = [], [], [], []
    for s in range(cfg.pp):
        d_loc, s_loc = T.edges[s]
        base = rank_off[stage == s]
        inner = s_loc >= 0
        entry_dst.append((base[:, None] + d_loc[~inner][None, :]).ravel())
        entry_rank.append(np.repeat(np.flatnonzero(stage == s), (~inner).sum()))
        e_src = (base[:, None] + s_loc[inner][None, :]).ravel()
        e_dst = (base[:, None] + d_loc[inner][None, :]).ravel()
        offs = np.arange(steps, dtype=np.int64)[:, None] * P
        srcs.append((e_src[None, :] + offs).ravel())
        dsts.append((e_dst[None, :] + offs).ravel())
        if steps > 1 and (~inner).any():
            t_src = (base[:, None] + T.tail[s]).ravel()
            t_dst = (base[:, None] + d_loc[~inner][None, :]).ravel()
            t_src = np.repeat(t_src, (~inner).sum())
            offs = np.arange(steps - 1, dtype=np.int64)[:, None] * P
            srcs.append((t_src[None, :] + offs).ravel())
            dsts.append((t_dst[None, :] + offs + P).ravel())
    src, dst = np.concatenate(srcs), np.concatenate(dsts)

    kind, strm, mb = T.kind[tmpl], T.stream[tmpl], T.mb[tmpl]
    is_comm = kind == 1
    replica = topo.coord["dp"] * cfg.ep + topo.coord["ep"]
    seq_len = np.where(mb >= 0, seq_table[step, replica[rank], np.maximum(mb, 0)], 0)

    # Peers and sync groups, computed on the ops they concern only (most ops are compute).
    role = T.role[tmpl]
    ci = np.flatnonzero(is_comm)
    pi = ci[role[ci] > 0]
    vtot = cfg.pp * cfg.chunks
    pp_row = topo.group_of["pp"][rank[pi]]
    src_vs, p2p_dir = T.p2p_src_vs[tmpl[pi]], T.p2p_dir[tmpl[pi]]
    dst_vs = np.where(p2p_dir == 1, src_vs - 1, src_vs + 1)
    sender = topo.groups["pp"][pp_row, np.mod(src_vs, cfg.pp)]
    receiver = topo.groups["pp"][pp_row, np.mod(dst_vs, cfg.pp)]
    peer = np.full(n_ops, -1, dtype=np.int64)
    peer[pi] = np.where(role[pi] == 1, receiver, sender)
    group_row = np.full(n_ops, -1, dtype=np.int64)
    n_members = np.ones(n_ops, dtype=np.int64)
    cross = np.zeros(n_ops, dtype=bool)
    sizes = {"pp": cfg.pp, "dp": cfg.dp, "tp": cfg.tp, "ep": cfg.ep, "cp": cfg.cp, "dpx": cfg.dp * cfg.ep}
    c_strm = strm[ci]
    for code, a in enumerate(STREAMS):
        m = ci[c_strm == code] if a != "compute" else ci[:0]
        if not m.size:
            continue
        group_row[m] = topo.group_of[a][rank[m]]
        n_members[m] = sizes[a] if a != "pp" else 2
        cross[m] = topo.cross_host[a][group_row[m]] if a != "pp" else topo.host[rank[m]] != topo.host[peer[m]]
    cross_pod = _cross_pod(cfg, topo, ci, strm, rank, peer, group_row)
    G = max(len(g) for g in topo.groups.values())
    C = int(T.cidx.max()) + 2
    oi = ci[role[ci] == 0]  # collectives
    sync = np.full(n_ops, -1, dtype=np.int64)
    sync[oi] = (((step[oi] * 8 + strm[oi]) * G + group_row[oi]) * C + T.cidx[tmpl[oi]]) * 2
    mbp = np.maximum(mb[pi], 0)
    sync[pi] = ((((step[pi] * world + sender) * cfg.microbatches + mbp) * vtot + src_vs) * 2 + p2p_dir) * 2 + 1

    # Sequence numbers: per group (collectives) or per ordered sender/receiver pair (p2p).
    per_step = np.zeros(len(T.kind), dtype=np.int64)
    for s in range(cfg.pp):
        sl = slice(T.offset[s], T.offset[s] + T.length[s])
        per_step[sl] = np.bincount(T.stream[sl], minlength=len(STREAMS))[T.stream[sl]]
    seq = np.zeros(n_ops, dtype=np.int64)
    seq[pi] = (step[pi] * cfg.microbatches + mbp) * cfg.chunks + T.chunk[tmpl[pi]]
    seq[oi] = step[oi] * per_step[tmpl[oi]] + T.cidx[tmpl[oi]]

    # Sizes and durations.
    size = np.zeros(n_ops, dtype=np.int64)
    size[ci] = np.rint(T.nb_lin[tmpl[ci]] * seq_len[ci] + T.nb_fixed[tmpl[ci]]).astype(np.int64)
    if cfg.ep_in_dp:
        # routing: each member's all_to_all payload changes with every call (its own stream of draws)
        a2a = ci[T.op_code[tmpl[ci]] == OP["all_to_all"]]
        size[a2a] = np.rint(size[a2a] * np.random.default_rng([cfg.seed, 36, int(step.min(initial=0))])
                            .uniform(0.7, 1.3, a2a.size)).astype(np.int64)
    op_code = T.op_code[tmpl]
    total = np.where(op_code[ci] == OP["all_gather"], size[ci] * n_members[ci], size[ci]).astype(np.float64)
    comm_dur = np.zeros(n_ops)
    comm_dur[ci] = _transfer_ns(cfg, op_code[ci], n_members[ci], total, cross[ci],
                                None if cross_pod is None else cross_pod[ci])
    flops = T.lin[tmpl] * seq_len + T.quad[tmpl] * seq_len.astype(np.float64) ** 2 + T.fixed[tmpl]
    compute_dur = flops / cfg.gpu_tflops * 1e-3  # flops / (TFLOP/s * 1e12) in ns
    if cfg.jitter > 0:
        compute_dur *= rng.lognormal(0.0, cfg.jitter, n_ops)
    is_pass = (~is_comm) & (T.layers[tmpl] > 0)
    for f in cfg.faults_of("stage-imbalance"):
        p = cfg.fault_params(f)
        compute_dur[is_pass & (stage[rank] == p["stage"])] *= p["factor"]
    for f in cfg.faults_of("misaligned-gemm"):
        p = cfg.fault_params(f)
        hit = is_pass & (step >= p["from_step"]) & ((rank == p["rank"]) if p["rank"] >= 0 else True)
        # The kernel's own FLOPs and speed change with its misaligned dim (SimConfig._misaligned).
        extra = (p["time_factor"] - 1) * GEMM_SHARE[p["kernel"]] * T.lin[tmpl] * seq_len / cfg.gpu_tflops * 1e-3
        compute_dur = np.where(hit, compute_dur + extra, compute_dur)
    for f in cfg.faults_of("slow-worker"):
        p = cfg.fault_params(f)
        compute_dur[(~is_comm) & (rank == p["rank"])] *= p["factor"]
    for f in cfg.faults_of("slow-link") + cfg.faults_of("bad-nic"):
        p = cfg.fault_params(f)
        # bad-nic is slow-link keyed by the NIC: every rank behind its address (sim.network.faults)
        on_nic = (np.flatnonzero(topo.addr_int == topo.addr_int[p["rank"]]) if f.kind == "bad-nic"
                  else [p["rank"]])
        in_group = np.zeros(n_ops, dtype=bool)
        for r in on_nic:
            for code, a in enumerate(STREAMS[1:], start=1):
                m = oi[strm[oi] == code]
                in_group[m] |= group_row[m] == topo.group_of[a][r]
            in_group |= (role > 0) & ((rank == r) | (peer == r))
        comm_dur[in_group & cross] *= p["factor"]
    duration = np.where(is_comm, comm_dur, compute_dur)

    delay = cfg.launch_ns * rng.uniform(0.5, 1.5, n_ops)
    gc_pause = np.zeros(n_ops)
    for f in cfg.faults_of("gc"):
        p = cfg.fault_params(f)
        forward = op_code == OP["forward"]
        hit = (forward & (rank == p["rank"]) & (step % p["every"] == 0) & (mb == p["microbatch"])
               & (T.chunk[tmpl] == 0))
        gc_pause[hit] += p["pause_ms"] * 1e6
    delay += gc_pause
    for f in cfg.faults_of("hang"):
        p = cfg.fault_params(f)
        s0 = T.offset[stage[p["rank"]]]
        grad = [i for i in range(s0, s0 + T.length[stage[p["rank"]]]) if T.name[i].startswith("grad_")]
        row = grad[p["index"]]
        delay[(rank == p["rank"]) & (step == p["step"]) & (tmpl == row)] = np.inf
    g = Graph(step=step, rank=rank, tmpl=tmpl, seq_len=seq_len, peer=peer, group_row=group_row,
              size_bytes=np.where(is_comm, size, 0), cross_host=cross, duration=duration, delay=delay,
              sync=sync, src=src, dst=dst, seq=seq, gc_pause=gc_pause, seq_table=seq_table, ops_per_step=P,
              entry_dst=np.concatenate(entry_dst), entry_rank=np.concatenate(entry_rank),
              tail_op=(steps - 1) * P + rank_off + T.tail[stage])
    return g
