"""A small but real DP x PP training job on gloo (CPU), launched by torchrun.

Used by the integration tests and benchmarks: the live hook, the Kineto
importer, the flow interop test in network namespaces, hangs and layout
regressions all run this same job. It is deterministic (same seeds, same
schedule), so its final loss is bit-identical across runs with the same flags.

Layout: world = dp * pp * tp ranks. ``--order dp-first`` is Megatron's order
(tp varies fastest, then dp: stage = rank // (dp*tp), dp_rank = rank // tp % dp,
tp_rank = rank % tp); ``pp-first`` gives stage = rank % pp and the rest from
rank // pp. With ``--tp N`` each block's FFN is split across the stage's TP
group (Megatron's column/row split) with real all-reduces of the activations
in forward and of the input gradients in backward. Each stage is an MLP; the last
computes an MSE loss. The pipeline runs 1F1B over ``--microbatches``; point-to-
point uses isend/irecv (gloo's blocking send would deadlock two stages that
both send), then gradients are all-reduced over the stage's DP group in
buckets of different sizes, and SGD steps.

Faults with a known truth (the truth-matrix tests): ``--work-ms`` adds a
fixed, sleep-based "device time" to every forward (x1), backward (x2) and
optimizer step (x0.5), so timings hold on a loaded CPU; ``--slow-rank R:F``
stretches all of rank R's compute (every op class, as slower hardware would)
F-fold; ``--slow-stage S:F`` stretches the forward/backward work of stage S
F-fold but not its optimizer (more layers, not slower hardware);
``--seq-skew`` makes one microbatch of each step's global batch long (its
DP rank and position move from step to step; work proportional to length; no
batch_meta is written); ``--skip-collective`` makes one rank skip its DP all_reduce (a hang). The environment variable
``TRAIN_SLOW_RANK_FROM=RANK:FACTOR:STEP`` stretches rank RANK's compute FACTOR-fold from step STEP on (a
GPU that degrades mid-run, for the live tests; set in the environment so a launcher passes it to every rank).

``--ep K`` makes it a Mixture-of-Experts job, expert parallelism carved out of DP (Megatron): an
expert-parallel group is K consecutive DP ranks of one stage and TP rank; every forward and backward
pass of every microbatch does a dispatch and a combine ``all_to_all`` among its members (a token
count that changes per microbatch and pass, as routing does, the same on all members); the stage's
expert layer's gradient is all-reduced over the expert-data-parallel group (the same position in every
EP group of the DP group), the dense gradients over the whole DP group.

``--out DIR`` writes DIR/rank<r>.json with the final loss (float.hex), the
per-step losses and ``issued``: every communication call the job itself made,
in order, so a test can check what a hook recorded against it. ``--progress-dir DIR`` appends
``STEP END_NS`` (wall clock) to DIR/rank<r>.steps as each step ends, before ``--step-sleep-ms``, so
a launcher can act between steps (the netns tests throttle a NIC there).
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
from job_layers import Experts, TPGroup, build_stage
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
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (FFN split, all-reduce per block)")
    p.add_argument("--work-ms", type=float, default=0.0,
                   help="sleep-based device time per forward (backward 2x, optimizer 0.5x)")
    p.add_argument("--slow-rank", default=None, metavar="RANK:FACTOR",
                   help="stretch all compute of that rank by FACTOR (slower hardware)")
    p.add_argument("--slow-stage", default=None, metavar="STAGE:FACTOR",
                   help="stretch forward/backward (not optimizer) of that stage by FACTOR (more work)")
    p.add_argument("--seq-skew", action="store_true",
                   help="per-microbatch sequence lengths vary (work proportional to length; no batch_meta)")
    p.add_argument("--ep", type=int, default=1,
                   help="expert-parallel degree carved out of DP (all_to_all per microbatch and pass)")
    p.add_argument("--order", choices=["dp-first", "pp-first"], default="dp-first")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--profile", type=Path, default=None, help="write torch.profiler traces here")
    p.add_argument("--skip-collective", default=None, metavar="RANK:STEP",
                   help="that rank skips its DP all_reduce in that step (its peers hang)")
    p.add_argument("--pg-timeout-s", type=float, default=120.0)
    p.add_argument("--sleep-ms-rank", default=None, metavar="RANK:MS",
                   help="extra compute delay per microbatch forward on one rank")
    p.add_argument("--step-sleep-ms", type=float, default=0.0, help="pause between steps (flow tests)")
    p.add_argument("--exit-sleep-s", type=float, default=0.0,
                   help="pause after the outputs, before the process group closes (a final checkpoint save)")
    p.add_argument("--progress-dir", type=Path, default=None,
                   help="append 'STEP END_NS' to DIR/rank<r>.steps as each step ends (a watcher outside the job)")
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

    def all_to_all(self, out, t, group, ranks):
        self._log("all_to_all", t, ranks)
        dist.all_to_all_single(out, t, group=group)

    def tp_all_reduce(self, t, group, ranks):
        """A TP all-reduce (inside forward/backward); logged like any other call."""
        self.all_reduce(t, group, ranks)

    def barrier(self, world):
        self._log("barrier", None, list(range(world)))
        dist.barrier()


LONG_SEQ = 4.0
"""--seq-skew: the long microbatch's work relative to the mean of the global batch."""


def seq_factor(step, dp_rank, mb, m, dp):
    """Relative sequence length of one microbatch under --seq-skew (mean 1 over the step's global batch).

    One long microbatch among the step's dp * m, on a DP rank and at a position that move from step to
    step (as unsorted variable-length batches give): the rank that holds it does more work that step,
    but no rank is slow in every step."""
    n = dp * m
    heavy = (5 * step + 1) % n
    return LONG_SEQ if dp_rank * m + mb == heavy else (n - LONG_SEQ) / (n - 1)


SLOW_FROM_ENV = "TRAIN_SLOW_RANK_FROM"


def _slow_from(text, rank):
    """(factor, from_step) of ``TRAIN_SLOW_RANK_FROM=RANK:FACTOR:STEP`` for this rank, else None."""
    if not text:
        return None
    try:
        r, f, st = text.split(":")
        r, f, st = int(r), float(f), int(st)
    except ValueError:
        sys.exit(f"{SLOW_FROM_ENV}={text!r}: expected RANK:FACTOR:STEP")
    return (f, st) if r == rank else None


class Work:
    """Sleep-based device time: what a GPU kernel costs the host, unaffected by CPU contention."""

    def __init__(self, args, rank, stage, dp):
        self.ms = args.work_ms
        self.dp = dp
        self.slow_rank = _pair(args.slow_rank, "--slow-rank")
        self.slow_stage = _pair(args.slow_stage, "--slow-stage")
        self.hw = self.slow_rank[1] if self.slow_rank and self.slow_rank[0] == rank else 1.0
        self.hw_from = _slow_from(os.environ.get(SLOW_FROM_ENV), rank)
        self.more = self.slow_stage[1] if self.slow_stage and self.slow_stage[0] == stage else 1.0
        self.skew = args.seq_skew

    def run(self, kind, step, dp_rank, mb, m, t_real):
        """Sleep for this pass's device time plus the hardware stretch of its real CPU time."""
        base = {"F": 1.0, "B": 2.0, "O": 0.5}[kind] * self.ms / 1000
        if kind in ("F", "B"):
            base *= self.more * (seq_factor(step, dp_rank, mb, m, self.dp) if self.skew else 1.0)
        hw = self.hw * (self.hw_from[0] if self.hw_from and step >= self.hw_from[1] else 1.0)
        extra = base * hw + t_real * (hw - 1)
        if extra > 0:
            time.sleep(extra)


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
    if world % (pp * tp):
        sys.exit(f"world size {world} is not a multiple of --pp {pp} x --tp {tp}")
    dp = world // (pp * tp)

    def rank_of(stage, dp_rank, tp_rank=0):
        if args.order == "dp-first":
            return stage * dp * tp + dp_rank * tp + tp_rank
        return (dp_rank * tp + tp_rank) * pp + stage

    if args.order == "dp-first":
        stage, dp_rank, tp_rank = rank // (dp * tp), rank // tp % dp, rank % tp
    else:
        stage, dp_rank, tp_rank = rank % pp, rank // pp // tp, rank // pp % tp
    dp_groups = [[rank_of(s, d, t) for d in range(dp)] for s in range(pp) for t in range(tp)]
    pp_groups = [[rank_of(s, d, t) for s in range(pp)] for d in range(dp) for t in range(tp)]
    tp_groups = [[rank_of(s, d, t) for t in range(tp)] for s in range(pp) for d in range(dp)]
    comm = Comm()
    timeout = timedelta(seconds=args.pg_timeout_s)
    my_dp, my_dp_ranks, my_tp = None, None, None
    for g in dp_groups:  # every rank creates every group, in the same order
        pg = dist.new_group(g, timeout=timeout)
        if rank in g:
            my_dp, my_dp_ranks = pg, g
    if tp > 1:
        for g in tp_groups:
            pg = dist.new_group(g, timeout=timeout)
            if rank in g:
                my_tp = TPGroup(comm, pg, g)
    moe = Experts(args, comm, rank, stage, dp_rank, tp_rank, dp, pp, tp, rank_of, timeout)
    prev_rank = rank_of(stage - 1, dp_rank, tp_rank) if stage > 0 else None
    next_rank = rank_of(stage + 1, dp_rank, tp_rank) if stage < pp - 1 else None

    ffn = args.ffn or 2 * args.hidden
    if ffn % tp:
        sys.exit(f"--ffn {ffn} is not a multiple of --tp {tp}")
    model = build_stage(stage, pp, args.hidden, ffn, args.layers, my_tp, tp_rank)
    device = Work(args, rank, stage, dp)
    opt = torch.optim.SGD(list(model.parameters()) + moe.parameters(), lr=0.01)
    params = [p for p in model.parameters()]
    # Two buckets of different sizes, as DDP's bucketing gives.
    split = max(1, len(params) // 3)
    buckets = [params[:split], params[split:]]
    skip = _pair(args.skip_collective, "--skip-collective")
    slow = _pair(args.sleep_ms_rank, "--sleep-ms-rank")
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

    progress = None
    if args.progress_dir is not None:
        args.progress_dir.mkdir(parents=True, exist_ok=True)
        progress = open(args.progress_dir / f"rank{rank}.steps", "a", encoding="utf-8")  # noqa: SIM115

    skipped = False
    for step in range(args.steps):
        comm.step = step
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        inputs, outputs, pending = {}, {}, []
        step_loss = torch.zeros(())
        for kind, i in one_f_one_b(stage, pp, m):
            if kind == "F":
                # the receive comes before the forward span, as in Megatron's schedule (recv_forward,
                # then forward_step): the span is the stage's own compute, not its wait for the upstream one
                x, target = microbatch(step, dp_rank, i, mbs, h)
                if prev_rank is not None:
                    x = torch.empty(mbs, h)
                    comm.recv(x, prev_rank, world)
                    x.requires_grad_(True)
                with torch.profiler.record_function("forward"):
                    if slow and slow[0] == rank:
                        time.sleep(slow[1] / 1000)
                    t_real = time.perf_counter()
                    y = model(x)
                    device.run("F", step, dp_rank, i, m, time.perf_counter() - t_real)
                    y = moe.layer(y, step, i, "F")
                    if next_rank is None:
                        y = nn.functional.mse_loss(y, target) / m
                        step_loss += y.detach()
                if next_rank is not None:  # send_forward after forward_step, as Megatron does
                    pending.append((comm.isend(y.detach().contiguous(), next_rank, world), y))
                inputs[i], outputs[i] = x, y
            else:
                y = outputs.pop(i)
                x = inputs.pop(i)
                grad = None
                if next_rank is not None:
                    grad = torch.empty(mbs, h)
                    comm.recv(grad, next_rank, world)
                with torch.profiler.record_function("backward"):
                    t_real = time.perf_counter()
                    moe.exchange(step, i, "B")
                    y.backward(grad)
                    device.run("B", step, dp_rank, i, m, time.perf_counter() - t_real)
                if prev_rank is not None:
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
        moe.reduce_gradients()
        with torch.profiler.record_function("optimizer"):
            t_real = time.perf_counter()
            opt.step()
            device.run("O", step, dp_rank, None, m, time.perf_counter() - t_real)
        losses.append(float(step_loss))
        step_times.append(time.perf_counter() - t0)
        if progress is not None:
            progress.write(f"{step} {time.time_ns()}\n")
            progress.flush()
        if prof is not None:
            prof.step()
        if args.step_sleep_ms:
            time.sleep(args.step_sleep_ms / 1000)

    if prof is not None:
        prof.__exit__(None, None, None)
    if progress is not None:
        progress.close()
    if not skipped:
        comm.barrier(world)
    result = {"rank": rank, "stage": stage, "dp_rank": dp_rank, "tp_rank": tp_rank, "world": world, "dp": dp,
              "pp": pp, "tp": tp, "order": args.order, "dp_groups": dp_groups, "pp_groups": pp_groups,
              "tp_groups": tp_groups, "ep": args.ep, "ep_groups": moe.ep_groups, "expert_dp_groups": moe.edp_groups,
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
    elif args.exit_sleep_s:
        time.sleep(args.exit_sleep_s)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a broken group after a hang cannot always be torn down
        pass
    return status


if __name__ == "__main__":
    sys.exit(main())
