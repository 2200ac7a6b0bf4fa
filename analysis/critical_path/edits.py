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

from dataclasses import dataclass

import numpy as np
import polars as pl

from rankscope.analysis.whatif.graph import WhatIfGraph
from rankscope.analysis.whatif.metrics import STALL_TYPES

CANDIDATES_PER_KIND = 3
"""how many of the path's heaviest ranks, stages and links are replayed as edits (per kind)."""
TOP_EDITS = 3
NEARLY = 0.9
"""a narrower edit that buys this share of a wider one's saving ranks before it."""


@dataclass(frozen=True)
class Edit:
    kind: str
    what: str
    ranks: list[int]
    stage: int | None
    link: str | None
    path_share: float
    predicted_step_ns: float
    saving: float


@dataclass(frozen=True)
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
    size: np.ndarray
    """bytes moved, nan where unknown."""
    of_kind: dict
    """op type -> its ops (ascending): each candidate reads its op types' ops, not a mask of every op."""

    @staticmethod
    def of(graph: WhatIfGraph) -> _Cols:
        ops = graph.ops
        optype = ops["optype"].fill_null("op")
        comm = ops["comm"].to_numpy()
        size = (ops["size_bytes"].cast(pl.Float64).fill_null(np.nan).to_numpy() if "size_bytes" in ops.columns
                else np.full(ops.height, np.nan))
        kind = optype.cast(pl.Categorical).to_physical().to_numpy()
        order = np.argsort(kind, kind="stable")
        bounds = np.flatnonzero(np.r_[True, kind[order][1:] != kind[order][:-1], True]) if kind.size else [0]
        of_kind = {int(kind[order[a]]): order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)}
        return _Cols(rank=ops["rank"].to_numpy(), stage=ops["stage"].fill_null(0).to_numpy(), comm=comm,
                     compute=~comm & ~optype.is_in(list(STALL_TYPES)).to_numpy(),
                     send=(ops["stream"] == "send").to_numpy(), recv=(ops["stream"] == "recv").to_numpy(),
                     kind=kind, size=np.where(size > 0, size, np.nan), of_kind=of_kind)


def _median_by_kind(values: np.ndarray, c: _Cols, peers: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """For the ops ``idx``, the median of ``values`` over the ``peers`` ops of the same op type (nan: none)."""
    out = np.full(idx.size, np.nan)
    kinds = c.kind[idx]
    for k in np.unique(kinds):
        ops = c.of_kind[int(k)]
        vals = values[ops[peers[ops]]]  # the same values in the same order as values[peers & (kind == k)]
        vals = vals[np.isfinite(vals)]
        if vals.size:
            out[kinds == k] = np.median(vals)
    return out


def _peer_median(c: _Cols, actual: np.ndarray, edited: np.ndarray, peers: np.ndarray) -> np.ndarray:
    """Per edited op, the median actual duration of its op type over the ``peers`` ops (nan elsewhere)."""
    out = np.full(actual.size, np.nan)
    idx = np.flatnonzero(edited)
    out[idx] = _median_by_kind(actual, c, peers, idx)
    return out


def _peer_rate(c: _Cols, actual: np.ndarray, edited: np.ndarray) -> np.ndarray:
    """Per edited op, its op type's median transfer time over the ops outside the edit: the median rate (time
    per byte) times the op's own size where sizes are known, else the median time (nan elsewhere)."""
    out = np.full(actual.size, np.nan)
    idx = np.flatnonzero(edited)
    if idx.size == 0:
        return out
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = actual / c.size
    per_size = _median_by_kind(rate, c, ~edited, idx) * c.size[idx]
    out[idx] = np.where(np.isfinite(per_size), per_size, _median_by_kind(actual, c, ~edited, idx))
    return out


def _faster(actual: np.ndarray, edited: np.ndarray, target: np.ndarray) -> np.ndarray:
    return np.where(edited & np.isfinite(target), np.minimum(actual, target), actual)


def _candidates(graph: WhatIfGraph, seg: pl.DataFrame, actual: np.ndarray, ideal: np.ndarray):
    """(kind, what, ranks, stage, link, op mask, durations) of each candidate edit."""
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
                   _faster(actual, edited, _peer_median(c, actual, edited, peers)))
    if len(np.unique(stage)) > 1:
        for s in heaviest(work, "stage"):
            edited = compute & (stage == s)
            peers = compute & (stage != s)
            yield ("stage", f"stage {s}'s compute as fast as the other stages'",
                   [int(x) for x in np.unique(rank[stage == s])], int(s), None, edited,
                   _faster(actual, edited, _peer_median(c, actual, edited, peers)))
    yield from _link_candidates(graph.group, c, seg, actual, ideal)


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
        pair = np.isin(group, np.intersect1d(sent, received)) & comm
        yield ("link", f"the link {a}->{b} at its op type's median rate", [a, b], None, link, pair,
               _faster(actual, pair, _peer_rate(c, actual, pair)))
    on_path = np.unique(np.concatenate([moved["rank"].to_numpy(), moved.filter(pl.col("waited") >= 0)["waited"]
                                        .to_numpy()]))
    sel = comm & (ideal > 0) & np.isin(rank, on_path)
    ratio = pl.DataFrame({"rank": rank[sel], "x": actual[sel] / ideal[sel]}).group_by("rank").agg(
        pl.col("x").median().alias("ratio")).sort(["ratio", "rank"], descending=[True, False])
    for r in ratio["rank"].head(CANDIDATES_PER_KIND).to_list():
        groups = np.unique(group[(rank == r) & (group >= 0)])
        edited = comm & np.isin(group, groups)
        yield ("link", f"rank {r}'s network link (every transfer of its groups) at its op types' median rate",
               [int(r)], None, f"rank {r}", edited, _faster(actual, edited, _peer_rate(c, actual, edited)))


def top_edits(graph: WhatIfGraph, seg: pl.DataFrame, actual: np.ndarray, ideal: np.ndarray,
              delay: np.ndarray, base_ns: float) -> list[Edit]:
    """The :data:`TOP_EDITS` edits with the shortest predicted mean step time (see module docstring).

    ``seg``: the path's segments over the steps (:func:`rankscope.analysis.critical_path.shares.segment_frame`);
    ``base_ns``: the mean replayed step time the savings are against."""
    run = graph.step_replayer(delay)
    total = float(seg["dur_ns"].sum())
    on_path = np.zeros(graph.ops.height)
    np.add.at(on_path, seg["op"].to_numpy(), seg["dur_ns"].to_numpy())
    out = []
    for kind, what, ranks, stage, link, edited, dur in _candidates(graph, seg, actual, ideal):
        if not np.any(dur < actual):
            continue  # nothing on it is slower than its peers: the edit changes nothing
        pred = float(np.mean(run(dur)))
        share = float(on_path[edited].sum() / total) if total > 0 else 0.0
        out.append(Edit(kind, what, ranks, stage, link, share, pred, 1.0 - pred / base_ns if base_ns > 0 else 0.0))
    return _narrowest_first(out)[:TOP_EDITS]


def _narrowest_first(edits: list[Edit]) -> list[Edit]:
    """Edits by predicted step time, except that an edit of more ranks goes after a narrower one (a subset
    of its ranks) that buys nearly as much (:data:`NEARLY`): the stage edit that includes a slow worker
    buys what the worker's own edit buys, and the worker is the finding."""
    def wider(e: Edit) -> bool:
        return any(set(f.ranks) < set(e.ranks) and f.saving >= NEARLY * e.saving > 0 for f in edits)

    return sorted(edits, key=lambda e: (wider(e), e.predicted_step_ns, -e.path_share, e.what))
