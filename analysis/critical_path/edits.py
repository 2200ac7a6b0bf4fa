""""What would shorten this step": edits to the critical path, each replayed on the job's dependency graph.

Three kinds of edit, each named by what it changes (the path says where to look, the replay says what it
would buy):

- ``worker``: one rank's compute as fast as its stage peers' (per op type, their median), where the rank has
  stage peers;
- ``stage``: one pipeline stage's compute as fast as the other stages' (per op type, their median), where the
  job has more than one stage;
- ``link``: transfers at their op type's median rate over the transfers outside the edit (their peers'),
  either one send/recv pair's link or every transfer of one rank's groups (its network link).

An edit never makes an op slower (each op takes the lesser of its own and its peers' time). Candidates are the
ranks, stages and links that hold the most of the path; each is replayed over every step, and the three with
the shortest predicted mean step time are kept.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.critical_path import template
from rankscope.analysis.whatif.graph import WhatIfGraph
from rankscope.analysis.whatif.metrics import STALL_TYPES
from rankscope.collectors.record_class import record

CANDIDATES_PER_KIND = 3
"""how many of the path's heaviest ranks, stages and links are replayed as edits (per kind)."""
TOP_EDITS = 3
NEARLY = 0.9
"""a narrower edit that buys this share of a wider one's saving ranks before it."""


@record
class Edit:
    kind: str
    what: str
    ranks: list[int]
    stage: int | None
    link: str | None
    path_share: float
    predicted_step_ns: float
    saving: float


@record
class _Cols:
    """The op columns every candidate reads, taken out of the op table once (string columns are slow to
    convert, and a 4,096-GPU job has ~5 M ops)."""

    rank: np.ndarray
    stage: np.ndarray
    comm: np.ndarray
    compute: np.ndarray
    """compute that is work (not a stall)."""
    send: np.ndarray
    recv: np.ndarray
    kind: np.ndarray
    """the op type as a small integer."""
    size: np.ndarray | None
    """bytes moved, nan where unknown; None: no op's size is known."""
    of_kind: dict
    """op type -> its ops (ascending): each candidate reads its op types' ops, not a mask of every op."""

    @staticmethod
    def of(graph: WhatIfGraph) -> _Cols:
        ops = graph.ops
        comm = ops["comm"].to_numpy()
        size = (ops["size_bytes"].cast(pl.Float64).fill_null(np.nan).to_numpy() if "size_bytes" in ops.columns
                else None)
        kind, stall, send, recv = _string_columns(graph)
        order = np.argsort(kind, kind="stable")  # small codes: a radix sort
        bounds = np.flatnonzero(np.r_[True, kind[order][1:] != kind[order][:-1], True]) if kind.size else [0]
        of_kind = {int(kind[order[a]]): order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)}
        return _Cols(rank=ops["rank"].to_numpy(), stage=ops["stage"].fill_null(0).to_numpy(), comm=comm,
                     compute=~comm & ~stall, send=send, recv=recv, kind=kind,
                     size=None if size is None else np.where(size > 0, size, np.nan), of_kind=of_kind)


def _string_columns(graph: WhatIfGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per op: its op type as a small code, whether it is a stall, a send, a recv (string columns: the slow
    ones). With a template they are read for one instance and spread by template position: every
    instance's op at a position has its op type and stream."""
    order = template.order_of(graph)
    cols = graph.ops.select(pl.col("optype").fill_null("op"), "stream")
    if order is not None:
        cols = cols[order.op[:, 0]]
    optype = cols["optype"]
    types = optype.unique().sort().cast(pl.String)  # the same lexical order from a String or Categorical column
    # an enum of the few op types: 4x faster than a categorical cast of ~2 M strings
    kind = optype.cast(pl.Enum(types)).to_physical().to_numpy()
    kind = kind.astype(np.min_scalar_type(max(types.len() - 1, 0)))
    out = (kind, optype.is_in(list(STALL_TYPES)).to_numpy(), (cols["stream"] == "send").to_numpy(),
           (cols["stream"] == "recv").to_numpy())
    if order is None:
        return out
    pos = order.flat // order.op.shape[1]  # every op's template op
    return tuple(a[pos] for a in out)


def _distinct(a: np.ndarray) -> np.ndarray:
    """np.unique(a) of integers; by a count of each value where they are small and non-negative (np.unique
    hashes or sorts them: a tenth of the edits' time)."""
    if a.size and 0 <= a.min() and a.max() < max(4 * a.size, 1 << 16):
        return np.flatnonzero(np.bincount(a)).astype(a.dtype, copy=False)
    return np.unique(a)


def _median_by_kind(values: np.ndarray, c: _Cols, peers: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """For the ops ``idx``, the median of ``values`` over the ``peers`` ops of the same op type (nan: none)."""
    out = np.full(idx.size, np.nan)
    kinds = c.kind[idx]
    for k in _distinct(kinds):
        ops = c.of_kind[int(k)]
        vals = values[ops[peers[ops]]]  # the same values in the same order as values[peers & (kind == k)]
        finite = np.isfinite(vals)
        if not finite.all():
            vals = vals[finite]
        if vals.size:
            # vals is this loop's own copy: partitioned in place (the median's values are the same)
            out[kinds == k] = np.median(vals, overwrite_input=True)
    return out


def _peer_median(c: _Cols, actual: np.ndarray, edited: np.ndarray, peers: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The edited ops and, per edited op, the median actual duration of its op type over the ``peers`` ops."""
    idx = np.flatnonzero(edited)
    return idx, _median_by_kind(actual, c, peers, idx)


def _peer_rate(c: _Cols, actual: np.ndarray, edited: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The edited ops and, per edited op, its op type's median transfer time over the ops outside the edit: the
    median rate (time per byte) times the op's own size where sizes are known, else the median time."""
    idx = np.flatnonzero(edited)
    out = np.full(idx.size, np.nan)
    # the rate's median only where some edited op has a size (it is multiplied by the op's size)
    if c.size is not None and np.isfinite(c.size[idx]).any():
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = actual / c.size
        out = _median_by_kind(rate, c, ~edited, idx) * c.size[idx]
    unsized = ~np.isfinite(out)
    if unsized.any():
        out[unsized] = _median_by_kind(actual, c, ~edited, idx[unsized])
    return idx, out


def _faster(actual: np.ndarray, edit: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The ops whose duration an edit sets, and their durations: of the edited ops ``edit`` = (ops, their
    target), those with a target, at the lesser of their own and the target (every other op keeps its own)."""
    idx, target = edit
    ok = np.isfinite(target)
    return idx[ok], np.minimum(actual[idx[ok]], target[ok])


def _candidates(graph: WhatIfGraph, seg: pl.DataFrame, actual: np.ndarray, ideal: np.ndarray):
    """(kind, what, ranks, stage, link, op mask, (ops, their durations)) of each candidate edit."""
    c = _Cols.of(graph)
    rank, stage, compute = c.rank, c.stage, c.compute
    work = seg.filter(~pl.col("comm") & (pl.col("op_class") != "launch_gap"))

    def heaviest(frame: pl.DataFrame, col: str) -> list:
        return frame.group_by(col).agg(pl.col("dur_ns").sum()).sort(["dur_ns", col], descending=[True, False])[
            col].head(CANDIDATES_PER_KIND).to_list()

    for r in heaviest(work, "rank"):
        s = stage[rank == r][0]
        peers = compute & (stage == s) & (rank != r)
        if peers.any():
            edited = compute & (rank == r)
            yield ("worker", f"rank {r}'s compute as fast as its stage peers'", [int(r)], int(s), None, edited,
                   _faster(actual, _peer_median(c, actual, edited, peers)))
    if stage.size and np.any(stage != stage[0]):  # more than one stage
        for s in heaviest(work, "stage"):
            edited = compute & (stage == s)
            peers = compute & (stage != s)
            yield ("stage", f"stage {s}'s compute as fast as the other stages'",
                   [int(x) for x in _distinct(rank[stage == s])], int(s), None, edited,
                   _faster(actual, _peer_median(c, actual, edited, peers)))
    yield from _link_candidates(graph.group, c, seg, actual, ideal)


def _in_groups(group: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per op, whether its sync group (-1: none) is one of ``groups``: np.isin by a table of the group ids
    (np.isin sorts every op's group)."""
    table = np.zeros(int(group.max()) + 2 if group.size else 1, dtype=bool)  # the last entry is -1's
    table[groups[groups >= 0]] = True
    return table[group]


def _link_candidates(group: np.ndarray, c: _Cols, seg: pl.DataFrame, actual: np.ndarray, ideal: np.ndarray):
    """Edits of the links on the path: each heavy send/recv pair, and the network link of the path's ranks
    whose transfers are slowest against their op type's median."""
    moved = seg.filter(pl.col("comm"))
    if moved.is_empty():
        return
    rank, comm = c.rank, c.comm
    pairs = moved.filter(pl.col("link").str.starts_with("send ")).group_by("link").agg(
        pl.col("dur_ns").sum()).sort(["dur_ns", "link"], descending=[True, False])
    for link in pairs["link"].head(CANDIDATES_PER_KIND).to_list():
        a, b = (int(x) for x in link.removeprefix("send ").split("->"))
        sent = group[c.send & (rank == a) & (group >= 0)]
        received = group[c.recv & (rank == b) & (group >= 0)]
        pair = _in_groups(group, np.intersect1d(sent, received)) & comm
        yield ("link", f"the link {a}->{b} at its op type's median rate", [a, b], None, link, pair,
               _faster(actual, _peer_rate(c, actual, pair)))
    on_path = np.unique(np.concatenate([moved["rank"].to_numpy(), moved.filter(pl.col("waited") >= 0)["waited"]
                                        .to_numpy()]))
    sel = comm & (ideal > 0) & np.isin(rank, on_path)
    ratio = pl.DataFrame({"rank": rank[sel], "x": actual[sel] / ideal[sel]}).group_by("rank").agg(
        pl.col("x").median().alias("ratio")).sort(["ratio", "rank"], descending=[True, False])
    for r in ratio["rank"].head(CANDIDATES_PER_KIND).to_list():
        groups = _distinct(group[(rank == r) & (group >= 0)])
        edited = comm & _in_groups(group, groups)
        yield ("link", f"rank {r}'s network link (every transfer of its groups) at its op types' median rate",
               [int(r)], None, f"rank {r}", edited, _faster(actual, _peer_rate(c, actual, edited)))


def top_edits(graph: WhatIfGraph, seg: pl.DataFrame, actual: np.ndarray, ideal: np.ndarray,
              delay: np.ndarray, base_ns: float) -> list[Edit]:
    """The :data:`TOP_EDITS` edits with the shortest predicted mean step time (see module docstring).

    ``seg``: the path's segments over the steps (:func:`rankscope.analysis.critical_path.shares.segment_frame`);
    ``base_ns``: the mean replayed step time the savings are against."""
    total = float(seg["dur_ns"].sum())
    on_path = np.zeros(graph.ops.height)
    np.add.at(on_path, seg["op"].to_numpy(), seg["dur_ns"].to_numpy())
    # nothing on an edit slower than its peers: it changes nothing, and is not replayed. Each edit's share is
    # taken as it comes, so its op mask (a byte per op) is not kept until the replays
    cands = [(kind, what, ranks, stage, link, float(on_path[edited].sum() / total) if total > 0 else 0.0, change)
             for kind, what, ranks, stage, link, edited, change in _candidates(graph, seg, actual, ideal)
             if np.any(change[1] < actual[change[0]])]
    times = _replayer(graph, actual, delay)([c[-1] for c in cands])
    out = []
    for (kind, what, ranks, stage, link, share, _), t in zip(cands, times, strict=True):
        pred = float(np.mean(t))
        out.append(Edit(kind, what, ranks, stage, link, share, pred, 1.0 - pred / base_ns if base_ns > 0 else 0.0))
    return _narrowest_first(out)[:TOP_EDITS]


def _replayer(graph: WhatIfGraph, actual: np.ndarray, delay: np.ndarray):
    """A function ``run(edits)``: per edit (ops, durations), the replayed time of each step with ``actual``
    durations except ``durations`` on ``ops``. A graph with a template replays it directly (no wave plan to
    build for a dozen replays), its edits batched (:func:`template.edit_replayer`)."""
    order = template.order_of(graph)
    if order is not None:
        return template.edit_replayer(graph.template, order, actual, delay)
    step_times = graph.step_replayer(delay)

    def run(edits: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        out = []
        for ops, durations in edits:
            dur = actual.copy()
            dur[ops] = durations
            out.append(step_times(dur))
        return out

    return run


def _narrowest_first(edits: list[Edit]) -> list[Edit]:
    """Edits by predicted step time, except that an edit of more ranks goes after a narrower one (a subset
    of its ranks) that buys nearly as much (:data:`NEARLY`): the stage edit that includes a slow worker
    buys what the worker's own edit buys, and the worker is the finding."""
    def wider(e: Edit) -> bool:
        return any(set(f.ranks) < set(e.ranks) and f.saving >= NEARLY * e.saving > 0 for f in edits)

    return sorted(edits, key=lambda e: (wider(e), e.predicted_step_ns, -e.path_share, e.what))
