"""Pipeline schedules: the order in which one pipeline rank runs its forward and backward passes.

Each schedule returns, for one pipeline rank, the list of ``(is_backward,
microbatch, chunk)`` in execution order; ``chunk`` is the model chunk
(virtual stage ``chunk * pp + stage``) and is always 0 unless interleaved.
Orders follow Megatron-LM: GPipe (all forwards, then all backwards), 1F1B
(``pp - stage - 1`` warm-up forwards, then one forward one backward), and
interleaved 1F1B (warm-up ``2 * (pp - stage - 1) + (chunks - 1) * pp``).
"""

from __future__ import annotations


def _interleaved_ids(k: int, pp: int, chunks: int, backward: bool) -> tuple[int, int]:
    group = k // (pp * chunks)
    chunk = (k // pp) % chunks
    if backward:
        chunk = chunks - 1 - chunk
    return group * pp + k % pp, chunk


def stage_order(schedule: str, stage: int, pp: int, microbatches: int, chunks: int = 1
                ) -> list[tuple[bool, int, int]]:
    """Execution order of forward/backward passes on pipeline rank ``stage``."""
    m = microbatches
    if schedule == "gpipe":
        return [(False, i, 0) for i in range(m)] + [(True, i, 0) for i in range(m)]
    if schedule == "1f1b":
        chunks = 1
        fwd = [(False, i, 0) for i in range(m)]
        bwd = [(True, i, 0) for i in range(m)]
        warm = min(pp - stage - 1, m)
    elif schedule == "interleaved":
        total = m * chunks
        fwd = [(False, *_interleaved_ids(k, pp, chunks, False)) for k in range(total)]
        bwd = [(True, *_interleaved_ids(k, pp, chunks, True)) for k in range(total)]
        warm = min(2 * (pp - stage - 1) + (chunks - 1) * pp, total)
    else:
        raise ValueError(schedule)
    out = fwd[:warm]
    f, b = warm, 0
    while f < len(fwd):
        out.append(fwd[f])
        out.append(bwd[b])
        f += 1
        b += 1
    out.extend(bwd[b:])
    return out
