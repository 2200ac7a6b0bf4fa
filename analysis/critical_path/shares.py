"""Who holds the critical path: each rank's, stage's, op class's and link's share of it, and every rank's slack.

Shares are over the steps given (the steady steps): a key's path time summed over the steps, over the steps'
summed time, so they add up to 1 per breakdown (links: over the path's transfer time only, as a share of the
whole path). A launch gap (untraced CPU work before an op) counts for its op's rank and stage under the
op class ``launch_gap``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.critical_path.path import StepPaths
from rankscope.analysis.whatif.graph import WhatIfGraph

GAP_CLASS = "launch_gap"
_MAX_LISTED = 8
"""a collective's link label lists this many member ranks at most."""


def link_labels(graph: WhatIfGraph, ops: np.ndarray) -> list[str | None]:
    """A name for the link each synced op's transfer crossed: ``send 3->5`` for a p2p pair (sender first),
    ``all_reduce:dp [0,2,4,6]`` for a collective (its op type and member ranks); None for a plain op."""
    group = graph.group
    wanted = np.unique(group[ops][group[ops] >= 0])
    members: dict[int, list[int]] = {int(g): [] for g in wanted}
    senders: dict[int, int] = {}
    hit = np.flatnonzero(np.isin(group, wanted))
    # only the rows read: a string column of every op as Python objects was ~120 MB at 1,024 workers
    rows = graph.ops.select("rank", (pl.col("stream") == "send").alias("send"))[hit]
    for i, r, is_send in zip(hit.tolist(), rows["rank"].to_list(), rows["send"].to_list(), strict=True):
        g = int(group[i])
        members[g].append(int(r))
        if is_send:
            senders[g] = int(r)
    optype = graph.ops["optype"].gather(ops).to_list()
    out: list[str | None] = []
    for j, i in enumerate(ops.tolist()):
        g = int(group[i])
        if g < 0:
            out.append(None)
            continue
        rs = sorted(set(members[g]))
        if g in senders and len(rs) == 2:
            a = senders[g]
            out.append(f"send {a}->{rs[0] if rs[1] == a else rs[1]}")
            continue
        listed = ",".join(str(r) for r in rs[:_MAX_LISTED]) + (f",... ({len(rs)} ranks)" if len(rs) > _MAX_LISTED else "")
        out.append(f"{str(optype[j]).split(':')[0]} [{listed}]")
    return out


def segment_frame(graph: WhatIfGraph, paths: StepPaths) -> pl.DataFrame:
    """One row per path segment: step_index, rank, stage, op class, link (transfers), kind, start, dur."""
    ops = graph.ops
    idx = paths.op
    work = paths.kind == 0
    comm = ops["comm"].to_numpy()[idx]
    links = link_labels(graph, idx)
    return pl.DataFrame({
        "step_index": paths.step_index, "op": idx, "rank": ops["rank"].to_numpy()[idx],
        "stage": ops["stage"].fill_null(0).to_numpy()[idx],
        "op_class": np.where(work, ops["optype"].fill_null("op").gather(idx).to_numpy(), GAP_CLASS),
        "comm": comm & work, "link": [lk if w else None for lk, w in zip(links, work, strict=True)],
        "waited": paths.waited, "start_ns": paths.start, "dur_ns": paths.dur})


def shares(seg: pl.DataFrame, total_ns: float) -> dict[str, dict[str, float]]:
    """{'rank'|'stage'|'op_class'|'link': {key: share of the path}}, largest first."""
    out: dict[str, dict[str, float]] = {}
    for col in ("rank", "stage", "op_class", "link"):
        t = seg.filter(pl.col(col).is_not_null()).group_by(col).agg(pl.col("dur_ns").sum()).sort(
            ["dur_ns", col], descending=[True, False])
        out[col] = {str(k): float(v / total_ns) if total_ns > 0 else 0.0 for k, v in t.iter_rows()}
    return out


def rank_slack(graph: WhatIfGraph, op_end: np.ndarray, step_time: np.ndarray) -> dict[str, dict[str, float]]:
    """Per rank, how much later its last op of a step could have ended without moving the step's end
    (the step's replayed time minus the rank's last replayed end): median and least over the steps."""
    rank = graph.ops["rank"].to_numpy()
    key = pl.DataFrame({"rank": rank, "si": graph.step_index, "end": op_end}).group_by("rank", "si").agg(
        pl.col("end").max())
    t = np.asarray(step_time, dtype=np.float64)[key["si"].to_numpy()]
    df = key.with_columns(pl.Series("slack", np.maximum(t - key["end"].to_numpy(), 0.0)))
    per = df.group_by("rank").agg(pl.col("slack").median().alias("median"), pl.col("slack").min().alias("min")).sort(
        "rank")
    return {str(r): {"median_ns": float(m), "min_ns": float(lo)} for r, m, lo in per.iter_rows()}
