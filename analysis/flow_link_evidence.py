"""What a link's traffic can and cannot say about being pipeline or collective traffic.

Two corrections to the grid fit (flow_groups), each a statement about the
traffic model rather than a threshold:

- *A lag within one clock tick is no evidence.* The direction lag (forward
  activations long before backward gradients) marks pipeline links. Over TCP
  both directions of a connection open together (SYN, SYN-ACK, the receiver's
  ACKs and recv-ready messages), and RoCE answers data with ACK flows, so the
  first records of the two directions coincide on pipeline links too. A
  symmetric link whose directions start within one tick of the exporter's
  clock is therefore *unknown* (0.5), not data-parallel (0): absence of a lag
  must not vote for all-DP.
- *Collectives of three or more members give every member two links.* Ring,
  bidirectional ring, double binary tree, recursive halving-doubling and
  all-to-all all do; only a single binary tree (or a chain) leaves members with
  one link, an open path, which is what a pipeline looks like. When the traffic
  evidence ties, the labelling that needs fewer single-tree collectives wins.
"""

from __future__ import annotations

import numpy as np
import polars as pl

# strictly below one unit of evidence: it only orders labellings the traffic scores the same
SHAPE_TIE_BREAK = 1e-3


def clock_tick_ns(times_ns: np.ndarray) -> int:
    """The exporter clock's resolution: the largest power of ten (up to 1 s) dividing every timestamp."""
    t = np.asarray(times_ns, dtype=np.int64)  # never via float64: epoch nanoseconds lose their last digits
    if t.size == 0:
        return 1
    tick = 1
    while tick < 1_000_000_000 and np.all(t % (tick * 10) == 0):
        tick *= 10
    return tick


def neutral_unresolved_lag(edges: pl.DataFrame, like: np.ndarray) -> np.ndarray:
    """``like`` with 0.5 where a two-way link's directions start within one clock tick.

    Needs edges first_ab, first_ba, symmetry. Links with one-way traffic (a
    ring's links carry data one way, ACKs the other) keep their score.
    """
    firsts = pl.concat([edges["first_ab"], edges["first_ba"]]).drop_nulls().cast(pl.Int64).to_numpy()
    tick = clock_tick_ns(firsts)
    lag = (edges["first_ab"].cast(pl.Int64) - edges["first_ba"].cast(pl.Int64)).abs()
    sym = edges["symmetry"].fill_null(0.0).fill_nan(0.0).to_numpy()
    unresolved = (lag <= tick).fill_null(False).to_numpy() & (sym >= 0.5)
    out = np.asarray(like, dtype=float).copy()
    out[unresolved] = 0.5
    return out


def single_tree_groups(n: int, da: np.ndarray, db: np.ndarray, dp_lab: np.ndarray) -> int:
    """How many data-parallel groups of three or more have a member with fewer than two in-group links."""
    if n == 0:
        return 0
    deg = np.bincount(np.r_[da, db], minlength=n)
    size = np.bincount(dp_lab)
    weak = (deg < 2) & (size[dp_lab] >= 3)
    return int(len(set(dp_lab[weak].tolist())))


def equally_good(fits: list, best) -> list[dict]:
    """Other valid labellings that the traffic scores exactly as well as ``best``, as alternatives.

    ``fits`` are flow_groups.GridFit. Two labellings tie when no evidence
    separates them (e.g. a 2 x 2 address grid over TCP: every link two-way, no
    lag, so DP and PP can swap); the fit then keeps the first candidate tried,
    and the report must say that another answer explains the traffic as well.
    """
    if best is None or not best.valid:
        return []
    key = _grouping(best)
    out, seen = [], {key}
    for f in fits:
        if f is best or not f.valid or abs(f.score - best.score) > 1e-9:
            continue
        k = _grouping(f)
        if k not in seen:
            seen.add(k)
            out.append({"dp_groups": f.dp_groups, "pp_groups": f.pipelines})
    return out


def _grouping(f) -> tuple:
    return (frozenset(frozenset(g) for g in f.dp_groups), frozenset(frozenset(g) for g in f.pipelines))


def mixed_pipelines(pipe_of_link: np.ndarray, mode_of_link: np.ndarray) -> int:
    """How many pipelines have links in more than one byte mode.

    Every microbatch's activations cross every link of its pipeline, so one
    pipeline's links carry about the same bytes; a 'pipeline' whose links fall
    into several modes is two kinds of traffic joined (a 2 x 2 grid read as a
    four-stage ring). Only a tie-break: interleaved schedules' wrap links and
    sampling can legitimately shift a link into a neighbouring mode.
    """
    if len(pipe_of_link) == 0:
        return 0
    modes_per_pipe: dict[int, set] = {}
    for p, m in zip(pipe_of_link.tolist(), mode_of_link.tolist()):
        modes_per_pipe.setdefault(p, set()).add(m)
    return sum(1 for ms in modes_per_pipe.values() if len(ms) > 1)
