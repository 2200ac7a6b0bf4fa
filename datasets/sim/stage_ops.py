"""One training step of one pipeline rank, as a small table of ops (the template).

Every rank of a pipeline stage runs the same ops in the same order each step,
so the simulator builds the step once per stage here (a few dozen rows, plain
Python) and :mod:`sim.op_graph` tiles it over ranks and steps with numpy.

Streams: ``compute`` is one in-order chain per rank (forward/backward spans,
with the tensor-, context- and expert-parallel collectives inline, because
those block the math that follows); ``pp`` sends and receives are posted
asynchronously (a receive is posted when the previous compute op ends, and
the consumer waits for it); ``dp`` gradient buckets run in order after the
last backward, and the optimizer waits for the last bucket.

Row fields: ``deps`` are local row indices (-1 = the previous step's tail),
``axis``/``cidx`` identify a collective (the ``cidx``-th collective of that
axis in the step), ``p2p`` is ``(direction, sender virtual stage)``,
``flops`` is (per token, per token^2) for compute and ``nbytes`` (per token,
fixed) for communication.
"""

from __future__ import annotations

import numpy as np

from rankscope.datasets.sim.job_config import SimConfig
from rankscope.datasets.sim.schedule import stage_order

STREAMS = ("compute", "pp", "dp", "tp", "ep", "cp", "dpx")
"""``dpx``: the whole data-parallel group of an EP-in-DP job (SimConfig.ep_in_dp), whose ``dp`` is the
expert-data-parallel group."""
OPS = ("forward", "backward", "optimizer", "send", "recv", "all_reduce", "reduce_scatter", "all_gather", "all_to_all")
"""Op names of template rows; arrays carry their index (``OP[name]``) so hot paths compare ints."""
OP = {name: i for i, name in enumerate(OPS)}
BYTES_PER_ELEM = 2  # bf16 activations and gradients


def bucket_bytes(cfg: SimConfig, stage: int) -> list[int]:
    """Gradient bucket sizes of one pipeline rank: they vary, but all DP peers agree."""
    params = (cfg.layers // cfg.pp) * 12 * cfg.hidden**2 // cfg.tp
    total = params * BYTES_PER_ELEM
    w = np.random.default_rng([cfg.seed, 7, stage]).uniform(0.6, 1.4, cfg.buckets)
    w[0] *= 1.5  # the first bucket holds the (large) output layer's gradients
    unit = 2 * cfg.dp
    return [max(unit, int(x * total / w.sum()) // unit * unit) for x in w]


def optimizer_flops(cfg: SimConfig) -> float:
    """Adam is memory-bound: ~16 bytes per parameter at ~2 TB/s, expressed as equivalent flops."""
    params = (cfg.layers // cfg.pp) * 12 * cfg.hidden**2 / cfg.tp
    if cfg.dp_sync != "allreduce":
        params /= cfg.dp
    seconds = params * 16 / 2.0e12
    return seconds * cfg.gpu_tflops * 1e12


def stage_template(cfg: SimConfig, stage: int) -> tuple[list[dict], int]:
    """The ops of one step on pipeline rank ``stage`` in launch order, and the row ending the step."""
    rows: list[dict] = []
    pp, chunks = cfg.pp, cfg.chunks
    last_vs = pp * chunks - 1
    layers_chunk = cfg.layers // (pp * chunks)
    b, h = cfg.micro_batch_size, cfg.hidden
    par = cfg.tp * cfg.cp
    lin = 24.0 * b * h * h / par * layers_chunk
    quad = 4.0 * b * h / par * layers_chunk
    act = b * h * BYTES_PER_ELEM / par  # per token, scatter-gather p2p (1/tp of the activation each)
    cidx = {a: 0 for a in STREAMS}
    state = {"tail": -1}

    def add(**r) -> int:
        r.setdefault("deps", [])
        r.setdefault("mb", -1)
        r.setdefault("chunk", 0)
        rows.append(r)
        return len(rows) - 1

    def coll(axis, op, nbytes, deps, mb=-1, chunk=0, stream=None, name=None):
        i = add(kind=1, name=name or op, op=op, stream=stream or axis, axis=axis, cidx=cidx[axis],
                nbytes=nbytes, deps=deps, mb=mb, chunk=chunk)
        cidx[axis] += 1
        return i

    def chain(i):
        state["tail"] = i

    buckets = bucket_bytes(cfg, stage)
    if cfg.dp > 1 and cfg.dp_sync in ("zero3", "fsdp"):
        prev = state["tail"]
        for nb in buckets:
            prev = coll("dp", "all_gather", (0.0, nb / cfg.dp), [prev], name="param_all_gather")
        chain(prev)
    for backward, mb, chunk in stage_order(cfg.schedule, stage, pp, cfg.microbatches, chunks):
        vs = chunk * pp + stage
        d = 1 if backward else 0
        src_vs = vs + 1 if backward else vs - 1
        deps = [state["tail"]]
        if 0 <= src_vs <= last_vs:
            rid = add(kind=1, name="recv", op="recv", stream="pp", axis="pp", p2p=(d, src_vs), role="recv",
                      nbytes=(act, 0.0), deps=[state["tail"]], mb=mb, chunk=chunk)
            deps.append(rid)
        mult = 2.0 if backward else 1.0
        i = add(kind=0, name="backward" if backward else "forward", op="backward" if backward else "forward",
                stream="compute", flops=(lin * mult, quad * mult), deps=deps, mb=mb, chunk=chunk,
                layers=layers_chunk)
        chain(i)
        if cfg.cp > 1:
            kv = 2 * b * h * BYTES_PER_ELEM / par * layers_chunk
            op = "reduce_scatter" if backward else "all_gather"
            chain(coll("cp", op, (kv * (cfg.cp if backward else 1), 0.0), [state["tail"]], mb, chunk))
        if cfg.ep > 1 and cfg.ep_in_dp:
            # a dispatch and a combine per MoE layer (sizes drawn per call in sim.op_graph)
            a2a = b * h * BYTES_PER_ELEM / cfg.cp * cfg.moe_experts_bytes_factor
            for _ in range(2 * layers_chunk):
                chain(coll("ep", "all_to_all", (a2a, 0.0), [state["tail"]], mb, chunk))
        elif cfg.ep > 1:
            a2a = 2 * b * h * BYTES_PER_ELEM / cfg.cp * layers_chunk * cfg.moe_experts_bytes_factor
            chain(coll("ep", "all_to_all", (a2a, 0.0), [state["tail"]], mb, chunk))
        if cfg.tp > 1:
            ar = 2 * b * h * BYTES_PER_ELEM / cfg.cp * layers_chunk
            chain(coll("tp", "all_reduce", (ar, 0.0), [state["tail"]], mb, chunk))
        dst_vs = vs - 1 if backward else vs + 1
        if 0 <= dst_vs <= last_vs:
            add(kind=1, name="send", op="send", stream="pp", axis="pp", p2p=(d, vs), role="send",
                nbytes=(act, 0.0), deps=[state["tail"]], mb=mb, chunk=chunk)
    prev = eprev = state["tail"]
    if cfg.ep_in_dp:
        # dense buckets over the whole data-parallel group; the experts' (as large as the dense
        # layers' here) over the expert-data-parallel group, on its own stream, concurrently
        for nb in buckets:
            prev = coll("dpx", "all_reduce", (0.0, float(nb)), [prev], name="grad_all_reduce")
        if cfg.dp > 1:
            for nb in buckets:
                eprev = coll("dp", "all_reduce", (0.0, float(nb)), [eprev], name="expert_grad_all_reduce")
    elif cfg.dp > 1:
        op = "all_reduce" if cfg.dp_sync == "allreduce" else "reduce_scatter"
        for nb in buckets:
            prev = coll("dp", op, (0.0, float(nb)), [prev], name=f"grad_{op}")
    opt = add(kind=0, name="optimizer", op="optimizer", stream="compute", flops=(0.0, 0.0),
              fixed_flops=optimizer_flops(cfg), deps=[state["tail"], prev, eprev])
    chain(opt)
    if cfg.dp > 1 and cfg.dp_sync in ("zero1", "zero2"):
        prev = opt
        for nb in buckets:
            prev = coll("dp", "all_gather", (0.0, nb / cfg.dp), [prev], name="param_all_gather")
        chain(prev)
    for r in rows:
        r["deps"] = sorted(set(r["deps"]))
    return rows, state["tail"]
