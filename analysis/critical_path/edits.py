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


def _peer_median(ops: pl.DataFrame, actual: np.ndarray, edited: np.ndarray, peers: np.ndarray) -> np.ndarray:
    """Per op, the median actual duration of its op type over the ``peers`` ops (nan where none)."""
    df = pl.DataFrame({"optype": ops["optype"], "a": actual, "peer": peers})
    med = df.filter(pl.col("peer")).group_by("optype").agg(pl.col("a").median().alias("m"))
    return df.join(med, on="optype", how="left", maintain_order="left")["m"].fill_null(np.nan).to_numpy()


def _peer_rate(ops: pl.DataFrame, actual: np.ndarray, edited: np.ndarray) -> np.ndarray:
    """Per op, its op type's median transfer time over the ops outside the edit (``edited`` False): at the
    median rate (time per byte) times the op's own size where sizes are known, else the median time (nan
    for ops outside the edit: only the edited ops are looked up)."""
    idx = np.flatnonzero(edited)
    out = np.full(ops.height, np.nan)
    if idx.size == 0:
        return out
    optype = ops["optype"]
    size = (ops["size_bytes"].cast(pl.Float64).fill_null(np.nan).to_numpy() if "size_bytes" in ops.columns
            else np.full(ops.height, np.nan))
    size = np.where(size > 0, size, np.nan)
    kinds = optype.gather(idx).unique()
    peer = ~edited & optype.is_in(kinds.to_list()).to_numpy()
    df = pl.DataFrame({"optype": optype.filter(pl.Series(peer)), "a": actual[peer], "rate": actual[peer] / size[peer]})
    med = df.group_by("optype").agg(pl.col("a").median().alias("m"), pl.col("rate").fill_nan(None).median().alias("r"))
    j = pl.DataFrame({"optype": optype.gather(idx)}).join(med, on="optype", how="left", maintain_order="left")
    per_size = j["r"].fill_null(np.nan).to_numpy() * size[idx]
    out[idx] = np.where(np.isfinite(per_size), per_size, j["m"].fill_null(np.nan).to_numpy())
    return out


def _faster(actual: np.ndarray, edited: np.ndarray, target: np.ndarray) -> np.ndarray:
    return np.where(edited & np.isfinite(target), np.minimum(actual, target), actual)


def _compute_mask(graph: WhatIfGraph) -> np.ndarray:
    ops = graph.ops
    return (~ops["comm"].to_numpy()) & ~ops["optype"].is_in(list(STALL_TYPES)).to_numpy()


def _candidates(graph: WhatIfGraph, seg: pl.DataFrame, actual: np.ndarray, ideal: np.ndarray):
    """(kind, what, ranks, stage, link, op mask, durations) of each candidate edit."""
    ops = graph.ops
    rank = ops["rank"].to_numpy()
    stage = ops["stage"].fill_null(0).to_numpy()
    compute = _compute_mask(graph)
    n_stages = len(np.unique(stage))
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
                   _faster(actual, edited, _peer_median(ops, actual, edited, peers)))
    if n_stages > 1:
        for s in heaviest(work, "stage"):
            edited = compute & (stage == s)
            peers = compute & (stage != s)
            yield ("stage", f"stage {s}'s compute as fast as the other stages'",
                   [int(x) for x in np.unique(rank[stage == s])], int(s), None, edited,
                   _faster(actual, edited, _peer_median(ops, actual, edited, peers)))
    yield from _link_candidates(graph, seg, actual, ideal)


def _link_candidates(graph: WhatIfGraph, seg: pl.DataFrame, actual: np.ndarray, ideal: np.ndarray):
    """Edits of the links on the path: each heavy send/recv pair, and the network link of the path's ranks
    whose transfers are slowest against their op type's median."""
    ops = graph.ops
    rank = ops["rank"].to_numpy()
    comm = ops["comm"].to_numpy()
    group = graph.group
    moved = seg.filter(pl.col("comm"))
    if moved.is_empty():
        return
    pairs = moved.filter(pl.col("link").str.starts_with("send ")).group_by("link").agg(
        pl.col("dur_ns").sum(), pl.col("op").first()).sort(["dur_ns", "link"], descending=[True, False])
    for link, _, _ in pairs.head(CANDIDATES_PER_KIND).iter_rows():
        a, b = (int(x) for x in link.removeprefix("send ").split("->"))
        stream = ops["stream"].to_numpy()
        sent = group[(stream == "send") & (rank == a) & (group >= 0)]
        received = group[(stream == "recv") & (rank == b) & (group >= 0)]
        pair = np.isin(group, np.intersect1d(sent, received)) & comm
        yield ("link", f"the link {a}->{b} at its op type's median rate", [a, b], None, link, pair,
               _faster(actual, pair, _peer_rate(ops, actual, pair)))
    on_path = np.unique(np.concatenate([[int(r) for r in moved["rank"].to_list()],
                                        [int(w) for w in moved["waited"].to_list() if w >= 0]]))
    ratio = pl.DataFrame({"rank": rank, "a": actual, "i": ideal, "comm": comm}).filter(
        pl.col("comm") & (pl.col("i") > 0) & pl.col("rank").is_in(on_path.tolist())).group_by("rank").agg(
        (pl.col("a") / pl.col("i")).median().alias("ratio")).sort(["ratio", "rank"], descending=[True, False])
    for r in ratio["rank"].head(CANDIDATES_PER_KIND).to_list():
        groups = np.unique(group[(rank == r) & (group >= 0)])
        edited = comm & np.isin(group, groups)
        yield ("link", f"rank {r}'s network link (every transfer of its groups) at its op types' median rate",
               [int(r)], None, f"rank {r}", edited, _faster(actual, edited, _peer_rate(ops, actual, edited)))


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
