"""A small but real DP x PP training job on gloo (CPU), launched by torchrun.

Used by the integration tests and benchmarks: the live hook, the Kineto
importer, the flow interop test in network namespaces, hangs and layout
regressions all run this same job. It is deterministic (same seeds, same
schedule), so its final loss is bit-identical across runs with the same flags.

Layout: world = dp * pp ranks. ``--order dp-first`` is Megatron's order
(dp varies fastest: stage = rank // dp, dp_rank = rank % dp); ``pp-first``
gives stage = rank % pp, dp_rank = rank // pp. Each stage is an MLP; the last
computes an MSE loss. The pipeline runs 1F1B over ``--microbatches``; point-to-
point uses isend/irecv (gloo's blocking send would deadlock two stages that
both send), then gradients are all-reduced over the stage's DP group in
buckets of different sizes, and SGD steps.

``--out DIR`` writes DIR/rank<r>.json with the final loss (float.hex), the
per-step losses and ``issued``: every communication call the job itself made,
in order, so a test can check what a hook recorded against it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

DTYPE_NAME = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
              torch.float16: "float16", torch.int64: "int64"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--microbatch-size", type=int, default=8)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--ffn", type=int, default=0, help="inner width of each block (default 2*hidden)")
    p.add_argument("--layers", type=int, default=2, help="blocks per stage")
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--order", choices=["dp-first", "pp-first"], default="dp-first")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel degree: tp consecutive ranks replicate one stage and all-reduce "
                        "its activations and input gradients (traffic only; the maths is unchanged)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--profile", type=Path, default=None, help="write torch.profiler traces here")
    p.add_argument("--skip-collective", default=None, metavar="RANK:STEP",
                   help="that rank skips its DP all_reduce in that step (its peers hang)")
    p.add_argument("--pg-timeout-s", type=float, default=120.0)
    p.add_argument("--sleep-ms-rank", default=None, metavar="RANK:MS",
                   help="extra compute delay per microbatch forward on one rank")
    p.add_argument("--step-sleep-ms", type=float, default=0.0, help="pause between steps (flow tests)")
    p.add_argument("--fr-dump", type=Path, default=None,
                   help="write the flight recorder dump here at exit (rank<r>.pkl and rank<r>.fr.json)")
    return p.parse_args(argv)


def _pair(text, what):
    if text is None:
        return None
    try:
        a, b = text.split(":")
        return int(a), float(b)
    except ValueError:
        sys.exit(f"{what} {text!r}: expected RANK:NUMBER")


class Comm:
    """Thin wrapper that makes the job's calls and keeps its own record of them."""

    def __init__(self):
        self.issued = []
        self.step = 0

    def _log(self, op, t, group_ranks, peer=None):
        self.issued.append({"op": op, "group_ranks": group_ranks, "peer": peer,
                            "size_bytes": t.numel() * t.element_size() if t is not None else 0,
                            "dtype": DTYPE_NAME.get(t.dtype, str(t.dtype)) if t is not None else None,
                            "step": self.step})

    def isend(self, t, dst, world):
        self._log("send", t, list(range(world)), dst)
        return dist.isend(t, dst)

    def recv(self, t, src, world):
        self._log("recv", t, list(range(world)), src)
        dist.irecv(t, src).wait()

    def all_reduce(self, t, group, ranks):
        self._log("all_reduce", t, ranks)
        dist.all_reduce(t, group=group)

    def barrier(self, world):
        self._log("barrier", None, list(range(world)))
        dist.barrier()


def build_stage(stage, pp, hidden, ffn, layers):
    torch.manual_seed(1000 + stage)
    mods = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, ffn), nn.ReLU(), nn.Linear(ffn, hidden)]
    if stage == pp - 1:
        mods += [nn.Linear(hidden, hidden)]
    return nn.Sequential(*mods)


def microbatch(step, dp_rank, mb, size, hidden):
    g = torch.Generator().manual_seed(step * 10_000 + dp_rank * 100 + mb)
    return torch.randn(size, hidden, generator=g), torch.randn(size, hidden, generator=g)


def one_f_one_b(stage, pp, m):
    """The 1F1B order of (kind, microbatch) for one stage."""
    warmup = min(pp - stage - 1, m)
    order = [("F", i) for i in range(warmup)]
    f, b = warmup, 0
    while b < m:
        if f < m:
            order.append(("F", f))
            f += 1
        order.append(("B", b))
        b += 1
    return order


def run(args):
    rank, world = dist.get_rank(), dist.get_world_size()
    pp, tp = args.pp, args.tp
    if tp < 1 or world % (pp * tp):
        sys.exit(f"world size {world} is not a multiple of --pp {pp} x --tp {tp}")
    dp = world // (pp * tp)
    # tp varies fastest (Megatron): consecutive ranks, hence one host, form a TP group
    tp_rank, base = rank % tp, rank // tp

    def rank_of(stage, dp_rank, t=tp_rank):
        return (stage * dp + dp_rank if args.order == "dp-first" else dp_rank * pp + stage) * tp + t

    stage = base // dp if args.order == "dp-first" else base % pp
    dp_rank = base % dp if args.order == "dp-first" else base // pp
    dp_groups = [[rank_of(s, d, t) for d in range(dp)] for s in range(pp) for t in range(tp)]
    pp_groups = [[rank_of(s, d, t) for s in range(pp)] for d in range(dp) for t in range(tp)]
    tp_groups = [[rank_of(s, d, t) for t in range(tp)] for s in range(pp) for d in range(dp)]
    my_dp, my_dp_ranks, my_tp, my_tp_ranks = None, None, None, None
    for g in dp_groups:  # every rank creates every group, in the same order
        pg = dist.new_group(g, timeout=timedelta(seconds=args.pg_timeout_s))
        if rank in g:
            my_dp, my_dp_ranks = pg, g
    for g in tp_groups if tp > 1 else []:
        pg = dist.new_group(g, timeout=timedelta(seconds=args.pg_timeout_s))
        if rank in g:
            my_tp, my_tp_ranks = pg, g
    prev_rank = rank_of(stage - 1, dp_rank) if stage > 0 else None
    next_rank = rank_of(stage + 1, dp_rank) if stage < pp - 1 else None

    def tp_exchange(t):
        # every TP rank holds the whole stage, so the sum is discarded: the call is there for its traffic
        if my_tp is not None:
            comm.all_reduce(t.detach().clone(), my_tp, my_tp_ranks)

    ffn = args.ffn or 2 * args.hidden
    model = build_stage(stage, pp, args.hidden, ffn, args.layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    params = [p for p in model.parameters()]
    # Two buckets of different sizes, as DDP's bucketing gives.
    split = max(1, len(params) // 3)
    buckets = [params[:split], params[split:]]
    skip = _pair(args.skip_collective, "--skip-collective")
    slow = _pair(args.sleep_ms_rank, "--sleep-ms-rank")
    comm = Comm()
    losses, step_times = [], []
    m, mbs, h = args.microbatches, args.microbatch_size, args.hidden

    prof = None
    if args.profile is not None:
        from torch.profiler import ProfilerActivity, profile, schedule

        args.profile.mkdir(parents=True, exist_ok=True)
        trace_path = str(args.profile / f"rank{rank}.json")
        # Only a scheduled profiler marks steps (ProfilerStep#N); it writes the trace when its window closes.
        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                       schedule=schedule(wait=0, warmup=0, active=max(1, args.steps), repeat=1),
                       on_trace_ready=lambda p: p.export_chrome_trace(trace_path))
        prof.__enter__()

    skipped = False
    for step in range(args.steps):
        comm.step = step
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        inputs, outputs, pending = {}, {}, []
        step_loss = torch.zeros(())
        for kind, i in one_f_one_b(stage, pp, m):
            if kind == "F":
                with torch.profiler.record_function("forward"):
                    x, target = microbatch(step, dp_rank, i, mbs, h)
                    if prev_rank is not None:
                        x = torch.empty(mbs, h)
                        comm.recv(x, prev_rank, world)
                        x.requires_grad_(True)
                    if slow and slow[0] == rank:
                        time.sleep(slow[1] / 1000)
                    y = model(x)
                    tp_exchange(y)
                    if next_rank is None:
                        y = nn.functional.mse_loss(y, target) / m
                        step_loss += y.detach()
                    else:
                        pending.append((comm.isend(y.detach().contiguous(), next_rank, world), y))
                    inputs[i], outputs[i] = x, y
            else:
                with torch.profiler.record_function("backward"):
                    y = outputs.pop(i)
                    x = inputs.pop(i)
                    if next_rank is None:
                        y.backward()
                    else:
                        grad = torch.empty(mbs, h)
                        comm.recv(grad, next_rank, world)
                        y.backward(grad)
                    if prev_rank is not None:
                        tp_exchange(x.grad)
                        g = x.grad.contiguous()
                        pending.append((comm.isend(g, prev_rank, world), g))
        for work, _keep in pending:
            work.wait()
        if skip and skip[0] == rank and int(skip[1]) == step:
            skipped = True
            break
        if dp > 1:
            for bucket in buckets:
                flat = torch.cat([p.grad.reshape(-1) for p in bucket])
                comm.all_reduce(flat, my_dp, my_dp_ranks)
                flat /= dp
                off = 0
                for p in bucket:
                    n = p.numel()
                    p.grad.copy_(flat[off:off + n].view_as(p.grad))
                    off += n
        with torch.profiler.record_function("optimizer"):
            opt.step()
        losses.append(float(step_loss))
        step_times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.step()
        if args.step_sleep_ms:
            time.sleep(args.step_sleep_ms / 1000)

    if prof is not None:
        prof.__exit__(None, None, None)
    if not skipped:
        comm.barrier(world)
    result = {"rank": rank, "stage": stage, "dp_rank": dp_rank, "world": world, "dp": dp, "pp": pp,
              "order": args.order, "dp_groups": dp_groups, "pp_groups": pp_groups,
              "tp": tp, "tp_rank": tp_rank, "tp_groups": tp_groups,
              "final_loss": losses[-1].hex() if losses and next_rank is None else None,
              "losses": [v.hex() for v in losses], "step_times_s": step_times,
              "issued": comm.issued, "skipped": skipped}
    return result


def write_outputs(args, rank, result):
    """The flight recorder dump and the result file, each renamed into place once complete."""
    if args.fr_dump is not None:
        from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

        args.fr_dump.mkdir(parents=True, exist_ok=True)
        for name, data in ((f"rank{rank}.pkl", _dump_fr_trace()), (f"rank{rank}.fr.json", _dump_fr_trace_json())):
            tmp = args.fr_dump / f".{name}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, args.fr_dump / name)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        tmp = args.out / f".rank{rank}.json.tmp"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, args.out / f"rank{rank}.json")


def wait_for_peers(args, world):
    """After a hang, leave only once every rank has written its outputs.

    The skipper must stay alive so that its peers see a hang (a timeout, not a closed connection), and
    the first rank to exit non-zero makes torchrun's fail-fast shutdown kill the rest: so every rank of
    a hung job waits here until all result files exist (each is renamed into place after its flight
    recorder dump), bounded by the process-group timeout plus a margin.
    """
    if args.out is None:
        time.sleep(args.pg_timeout_s + 1)
        return
    deadline = time.monotonic() + args.pg_timeout_s + 60
    while time.monotonic() < deadline:
        if all((args.out / f"rank{r}.json").exists() for r in range(world)):
            return
        time.sleep(0.1)


def main(argv=None):
    args = parse_args(argv)
    if args.fr_dump is not None:
        # The recorder sizes its ring buffer when the process group is created.
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout_s))
    rank = dist.get_rank()
    status = 0
    try:
        result = run(args)
    except RuntimeError as e:  # a peer never joined: gloo times out
        result = {"rank": rank, "error": str(e)[:500]}
        status = 3
    write_outputs(args, rank, result)
    if result.get("skipped") or status:
        wait_for_peers(args, dist.get_world_size())
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a broken group after a hang cannot always be torn down
        pass
    return status


if __name__ == "__main__":
    sys.exit(main())
