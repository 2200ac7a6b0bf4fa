"""The model pieces of tests/jobs/train_dp_pp.py: its tensor-parallel FFN blocks (Megatron's column/row
split, with real all-reduces of activations and input gradients) and its expert layer (--ep: dispatch and
combine all_to_all, the expert-DP gradient reduction). Kept beside the script: torchrun puts the script's
directory first on sys.path.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn


class _ReduceOut(torch.autograd.Function):
    """Megatron's g: all-reduce in forward, identity in backward (after a row-parallel linear)."""

    @staticmethod
    def forward(ctx, x, tp):
        y = x.clone()
        tp.comm.tp_all_reduce(y, tp.group, tp.ranks)
        return y

    @staticmethod
    def backward(ctx, g):
        return g, None


class _CopyIn(torch.autograd.Function):
    """Megatron's f: identity in forward, all-reduce of the input gradient in backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        ctx.tp.comm.tp_all_reduce(g, ctx.tp.group, ctx.tp.ranks)
        return g, None


class TPBlock(nn.Module):
    """One FFN block split over a TP group: column-parallel in, row-parallel out."""

    def __init__(self, hidden, ffn, tp):
        super().__init__()
        self.tp = tp
        self.fc1 = nn.Linear(hidden, ffn // tp.size)
        self.fc2 = nn.Linear(ffn // tp.size, hidden, bias=False)

    def forward(self, x):
        return _ReduceOut.apply(self.fc2(torch.relu(self.fc1(_CopyIn.apply(x, self.tp)))), self.tp)


class TPGroup:
    def __init__(self, comm, group, ranks):
        self.comm, self.group, self.ranks, self.size = comm, group, ranks, len(ranks)


def build_stage(stage, pp, hidden, ffn, layers, tp=None, tp_rank=0):
    if tp is None or tp.size == 1:
        torch.manual_seed(1000 + stage)
        mods = []
        for _ in range(layers):
            mods += [nn.Linear(hidden, ffn), nn.ReLU(), nn.Linear(ffn, hidden)]
    else:
        torch.manual_seed(1000 + 100 * stage + tp_rank)
        mods = [TPBlock(hidden, ffn, tp) for _ in range(layers)]
        torch.manual_seed(1000 + 100 * stage)  # the replicated head is the same on every TP rank
    if stage == pp - 1:
        mods += [nn.Linear(hidden, hidden)]
    return nn.Sequential(*mods)


class Experts:
    """--ep: the stage's expert layer, its all_to_all exchanges and the expert-DP gradient reduction."""

    def __init__(self, args, comm, rank, stage, dp_rank, tp_rank, dp, pp, tp, rank_of, timeout):
        self.comm, self.k, self.rows, self.h = comm, args.ep, args.microbatch_size, args.hidden
        self.ep_groups, self.edp_groups, self.expert = [], [], None
        if self.k <= 1:
            return
        if dp % self.k:
            sys.exit(f"--ep {self.k} does not divide dp {dp}")
        blocks = dp // self.k
        self.ep_groups = [[rank_of(s, b * self.k + x, t) for x in range(self.k)]
                          for s in range(pp) for t in range(tp) for b in range(blocks)]
        self.edp_groups = [[rank_of(s, b * self.k + x, t) for b in range(blocks)]
                           for s in range(pp) for t in range(tp) for x in range(self.k)]
        for g in self.ep_groups:  # every rank creates every group, in the same order
            pg = dist.new_group(g, timeout=timeout)
            if rank in g:
                self.ep_pg, self.ep_ranks = pg, g
        self.edp_pg, self.edp_ranks = None, None
        for g in self.edp_groups:
            pg = dist.new_group(g, timeout=timeout) if len(g) > 1 else None
            if rank in g:
                self.edp_pg, self.edp_ranks = pg, g
        self.block = (stage, tp_rank, dp_rank // self.k)
        torch.manual_seed(5000 + stage)
        self.expert = nn.Linear(args.hidden, args.hidden)

    def exchange(self, step, mb, kind):
        """Dispatch and combine: tokens per member change with the microbatch and pass (routing)."""
        if self.expert is None:
            return
        stage, tp_rank, block = self.block  # the same seed on every member (no str hash: salted per process)
        g = torch.Generator().manual_seed(((step * 1000 + mb) * 2 + (kind == "B")) * 10_000
                                          + (stage * 100 + tp_rank) * 100 + block)
        for _ in range(2):
            rows = max(1, int(self.rows * (0.7 + 0.6 * float(torch.rand((), generator=g)))))
            t = torch.randn(self.k * rows, self.h, generator=g)
            self.comm.all_to_all(torch.empty_like(t), t, self.ep_pg, self.ep_ranks)

    def layer(self, y, step, mb, kind):
        """The expert layer on this rank's tokens, after the dispatch exchange."""
        if self.expert is None:
            return y
        self.exchange(step, mb, kind)
        return y + self.expert(y)

    def parameters(self):
        return [] if self.expert is None else list(self.expert.parameters())

    def reduce_gradients(self):
        if self.expert is None or self.edp_pg is None:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in self.expert.parameters()])
        self.comm.all_reduce(flat, self.edp_pg, self.edp_ranks)
        flat /= len(self.edp_ranks)
        off = 0
        for p in self.expert.parameters():
            p.grad.copy_(flat[off:off + p.numel()].view_as(p.grad))
            off += p.numel()
