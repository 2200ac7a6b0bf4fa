"""Hand-built comm_op / compute_op frames of a small DP x PP (x TP) job, for white-box tests.

The schedule is GPipe-like per step: forward of every microbatch (send
activations downstream), backward (send gradients upstream), then the DP
gradient all_reduce, plus TP all_reduces per microbatch when tp > 1. Each rank
can get a clock offset and drift, applied to all its records.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.collectors.schema import conform

MS = 1_000_000


def layout(dp: int, pp: int, tp: int = 1, order: str = "dp-first"):
    """rank -> (stage, dp_rank, tp_rank). dp-first: tp fastest, then dp, then pp (Megatron)."""
    world = dp * pp * tp
    out = {}
    for r in range(world):
        if order == "dp-first":
            t, d, s = r % tp, (r // tp) % dp, r // (tp * dp)
        else:  # pp-first: tp fastest, then pp, then dp
            t, s, d = r % tp, (r // tp) % pp, r // (tp * pp)
        out[r] = (s, d, t)
    return out


def build_job(dp=2, pp=2, tp=1, steps=3, microbatches=4, order="dp-first", offsets_ns=None, drift=None,
              step_ms=100.0, seed=0, job="j"):
    lay = layout(dp, pp, tp, order)
    inv = {v: r for r, v in lay.items()}
    rng = np.random.default_rng(seed)
    offsets_ns = offsets_ns or {}
    drift = drift or {}
    comm, comp = [], []
    seq = {}

    def clk(r, t):
        return int(t + offsets_ns.get(r, 0) + drift.get(r, 0.0) * (t - t0))

    fwd_ms = 2.0
    t0 = 1_700_000_000_000_000_000
    for step in range(steps):
        base = t0 + int(step * step_ms * MS)
        for r, (s, d, t) in lay.items():
            dp_group = sorted(inv[(s, x, t)] for x in range(dp))
            tp_group = sorted(inv[(s, d, x)] for x in range(tp))
            for mb in range(microbatches):
                fs = base + int(((mb + s) * fwd_ms) * MS)
                fe = fs + int(fwd_ms * MS * (1 + 0.01 * rng.random()))
                comp.append(dict(job=job, rank=r, name="forward", category="forward", start_ns=clk(r, fs),
                                 end_ns=clk(r, fe), step=step, microbatch=mb, stage=s, source="test"))
                if tp > 1:
                    key = ("tp", tuple(tp_group))
                    seq[key, r] = seq.get((key, r), -1) + 1
                    comm.append(dict(job=job, rank=r, op="all_reduce", group_id=f"tp{tp_group[0]}",
                                     group_ranks=tp_group, size_bytes=1 << 16, start_ns=clk(r, fe),
                                     end_ns=clk(r, fe + MS // 10), seq=seq[key, r], step=step, microbatch=mb,
                                     state="completed", source="test"))
                if s < pp - 1:
                    peer = inv[(s + 1, d, t)]
                    comm.append(dict(job=job, rank=r, op="send", peer=peer, size_bytes=1 << 20,
                                     start_ns=clk(r, fe), end_ns=clk(r, fe + MS // 5), step=step, microbatch=mb,
                                     state="completed", source="test"))
                if s > 0:
                    peer = inv[(s - 1, d, t)]
                    comm.append(dict(job=job, rank=r, op="recv", peer=peer, size_bytes=1 << 20,
                                     start_ns=clk(r, fs - MS // 5), end_ns=clk(r, fs), step=step,
                                     microbatch=mb, state="completed", source="test"))
            bwd0 = base + int((microbatches + pp) * fwd_ms * MS)
            for mb in range(microbatches):
                bs = bwd0 + int(((mb + (pp - 1 - s)) * 2 * fwd_ms) * MS)
                be = bs + int(2 * fwd_ms * MS)
                comp.append(dict(job=job, rank=r, name="backward", category="backward", start_ns=clk(r, bs),
                                 end_ns=clk(r, be), step=step, microbatch=mb, stage=s, source="test"))
                if s > 0:
                    comm.append(dict(job=job, rank=r, op="send", peer=inv[(s - 1, d, t)], size_bytes=1 << 20,
                                     start_ns=clk(r, be), end_ns=clk(r, be + MS // 5), step=step,
                                     microbatch=mb, state="completed", source="test"))
                if s < pp - 1:
                    comm.append(dict(job=job, rank=r, op="recv", peer=inv[(s + 1, d, t)], size_bytes=1 << 20,
                                     start_ns=clk(r, bs - MS // 5), end_ns=clk(r, bs), step=step,
                                     microbatch=mb, state="completed", source="test"))
            ar_start = bwd0 + int((microbatches + pp) * 2 * fwd_ms * MS) + int(rng.integers(0, MS))
            ar_end = bwd0 + int((microbatches + pp + 2) * 2 * fwd_ms * MS)  # ends together on all members
            if dp > 1:
                key = ("dp", tuple(dp_group))
                for b in range(2):
                    seq[key, r] = seq.get((key, r), -1) + 1
                    comm.append(dict(job=job, rank=r, op="all_reduce", group_id=f"dp{dp_group[0]}",
                                     group_ranks=dp_group, size_bytes=1 << 24,
                                     start_ns=clk(r, ar_start + b * MS), end_ns=clk(r, ar_end + b * 2 * MS),
                                     seq=seq[key, r], step=step, state="completed", source="test"))
    cf = pl.from_arrow(conform(pl.DataFrame(comm, infer_schema_length=None), "comm_op"))
    pf = pl.from_arrow(conform(pl.DataFrame(comp, infer_schema_length=None), "compute_op"))
    return cf, pf, lay
