"""A small DP=2 x PP=2 job written by hand into a Store (no simulator needed).

Ranks 0..3; pipelines [0, 1] and [2, 3] (stage 0 sends activations to stage 1);
data-parallel groups [0, 2] and [1, 3] all-reduce gradients at the end of each
step. Rank ``slow_rank`` computes ``slow_factor`` times longer.
"""

from __future__ import annotations

import polars as pl

from rankscope.collectors.schema import conform
from rankscope.collectors.store import Store

MS = 1_000_000
PIPELINES = [[0, 1], [2, 3]]
DP_GROUPS = [[0, 2], [1, 3]]


def write_hand_store(root, job: str = "handjob", steps: int = 4, slow_rank: int = 3,
                     slow_factor: float = 1.5, t0: int = 1_700_000_000 * 10**9, first_step: int = 0) -> Store:
    """Write steps ``first_step`` .. ``first_step + steps - 1`` of the job (step k starts at t0 + k * 100 ms)."""
    comm, comp, marks = [], [], []
    step_ns = 100 * MS
    for step in range(first_step, first_step + steps):
        s0 = t0 + step * step_ns
        for rank in range(4):
            stage = rank % 2
            marks.append(dict(job=job, rank=rank, step=step, start_ns=s0, end_ns=s0 + step_ns, source="hand"))
            fwd = int(30 * MS * (slow_factor if rank == slow_rank else 1.0))
            begin = s0 + stage * 35 * MS
            comp.append(dict(job=job, rank=rank, name="forward", category="forward", start_ns=begin,
                             end_ns=begin + fwd, step=step, microbatch=0, stage=stage, source="hand"))
            peer = rank + 1 if stage == 0 else rank - 1
            p2p_start = s0 + 32 * MS
            comm.append(dict(job=job, rank=rank, op="send" if stage == 0 else "recv", peer=peer,
                             group_id=f"pp{rank // 2}", group_ranks=PIPELINES[rank // 2], size_bytes=1 << 20,
                             dtype="bfloat16", start_ns=p2p_start, end_ns=p2p_start + 2 * MS, seq=step,
                             step=step, microbatch=0, source="hand"))
            ar_start = s0 + 80 * MS
            comm.append(dict(job=job, rank=rank, op="all_reduce", group_id=f"dp{stage}",
                             group_ranks=DP_GROUPS[stage], size_bytes=64 << 20, dtype="bfloat16",
                             start_ns=ar_start, end_ns=ar_start + 10 * MS, seq=step, step=step, source="hand"))
    store = Store(root)
    for kind, rows in (("comm_op", comm), ("compute_op", comp), ("step_mark", marks)):
        store.write(kind, conform(pl.DataFrame(rows), kind))
    return store
