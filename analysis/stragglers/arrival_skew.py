"""Stragglers from collective arrival skew: the view of hook records alone (comm_op, no compute_op).

Without compute spans a straggler still shows: it is the last to arrive at
each collective while its peers wait (NVIDIA's straggler detection and
Megatron's straggler detector look at ranks the same way). Per rank and step:

- blocked time: the union of the rank's spans inside blocking communication
  (collectives and receives; a send is posted asynchronously and its span
  says when the receiver took it, not that the sender waited);
- own work W = step window - blocked time: what the rank did itself
  (compute, data loading, launches), the time its peers wait for;
- excess = W - the median W of its peers (its stage peers from the layout,
  else the members of its collective groups).

What-ifs on that basis: the worker fix removes the largest excess of one rank
(a step cannot be shorter than its slowest rank's own work); the stage fix
lifts the slowest stage's fastest member to the other stages' level; the
communication fix puts every collective's transfer (first end - last arrival)
at the median of its op and size. T_ideal = T - the sum of the fixes, S = T /
T_ideal; each share is its fix over T - T_ideal. The first step is warm-up
(rendezvous, lazy init) and left out when it is over twice the others' median.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.collectors.schema import P2P_OPS

BLOCKING_EXCLUDE = ("send",)
"""Ops whose span is not time the rank waited (asynchronous sends)."""
SLOW_AT = 1.2
"""a step where a rank's own work is this times its peers' counts as a slow step of that rank."""
WARMUP_FACTOR = 2.0
"""The first step is warm-up when its span is over this times the median of the others."""


def _windows(comm: pl.DataFrame, step_mark: pl.DataFrame | None) -> pl.DataFrame:
    w = comm.group_by("step").agg(pl.col("start_ns").min().alias("lo"), pl.col("end_ns").max().alias("hi"))
    if step_mark is not None and step_mark.height:
        sm = step_mark.filter(pl.col("step").is_not_null()).group_by("step").agg(
            pl.col("start_ns").min().alias("slo"), pl.col("end_ns").max().alias("shi"))
        w = w.join(sm, on="step", how="left").with_columns(
            pl.min_horizontal("lo", "slo").alias("lo"), pl.max_horizontal("hi", "shi").alias("hi")).drop("slo", "shi")
    return w.sort("step")


def _blocked(comm: pl.DataFrame, win: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step): length of the union of blocking spans, clipped to the step window."""
    b = comm.filter(~pl.col("op").is_in(list(BLOCKING_EXCLUDE))).join(win, on="step").with_columns(
        pl.max_horizontal("start_ns", "lo").alias("s"), pl.min_horizontal("end_ns", "hi").alias("e")
    ).filter(pl.col("e") > pl.col("s")).sort("rank", "step", "s")
    b = b.with_columns(pl.col("e").cum_max().shift(1).over("rank", "step").alias("prev")).with_columns(
        (pl.col("e") - pl.max_horizontal("s", pl.col("prev").fill_null(pl.col("s")))).clip(lower_bound=0).alias("c"))
    return b.group_by("rank", "step").agg(pl.col("c").sum().alias("blocked"))


def _peers(comm: pl.DataFrame, ranks: list[int], layout: pl.DataFrame | None) -> tuple[dict, str]:
    if layout is not None and layout.height and layout["stage"].null_count() < layout.height:
        stage = {int(r): s for r, s in layout.select("rank", "stage").iter_rows() if s is not None}
        peers = {r: [p for p in ranks if p != r and stage.get(p) == stage.get(r)] for r in ranks}
        if any(peers.values()):
            return peers, "stage peers (layout)"
    groups = comm.filter(~pl.col("op").is_in(P2P_OPS) & pl.col("group_ranks").is_not_null()
                         & (pl.col("group_ranks").list.len() >= 2)).select("group_ranks").unique()
    # each rank's smallest collective group: its data-parallel (or tensor-parallel) peers, which
    # share its stage; a world-wide group (a barrier, the loss all-reduce) would mix the stages
    best: dict[int, list[int]] = {}
    for (members,) in groups.iter_rows():
        for r in members:
            if r in ranks and (r not in best or len(members) < len(best[r]) + 1):
                best[int(r)] = [int(p) for p in members if p != r and p in ranks]
    peers = {r: sorted(best.get(r, [])) for r in ranks}
    if any(peers.values()):
        return peers, "smallest collective group (no layout)"
    return {r: [p for p in ranks if p != r] for r in ranks}, "all ranks (no groups, no layout)"


def _transfer_excess(comm: pl.DataFrame, steps: list[int]) -> tuple[float, dict]:
    """Per step, the most any one rank loses to collective transfers slower than their op's median."""
    key = ["group_id", "seq", "step"]
    coll = comm.filter(~pl.col("op").is_in(P2P_OPS) & pl.col("seq").is_not_null())
    if coll.height == 0:
        return 0.0, {"collectives": 0}
    inst = coll.group_by(key).agg(
        pl.col("op").first(), pl.col("size_bytes").first(), pl.col("rank"), pl.len().alias("n"),
        (pl.col("end_ns").min() - pl.col("start_ns").max()).clip(lower_bound=0).alias("transfer"))
    # typical transfer of an op at its size: the median rate of the op over all groups; a group's own
    # typical transfer: its median over steps. Only a group that is slow step after step (a slow link)
    # loses time; one-off spikes (a rank descheduled on a busy host) are noise, not the network
    sized = pl.col("size_bytes").fill_null(0) > 0
    inst = inst.filter(pl.col("n") >= 2).with_columns(
        pl.when(sized).then(pl.col("transfer") / pl.col("size_bytes")).median().over("op").alias("rate"),
        pl.col("transfer").median().over("op").alias("typ_any")).with_columns(
        pl.when(sized).then(pl.col("rate") * pl.col("size_bytes")).otherwise(pl.col("typ_any")).alias("typ"),
        pl.col("transfer").median().over("group_id", "op", "size_bytes").alias("own"))
    inst = inst.with_columns((pl.col("own") - pl.col("typ")).clip(lower_bound=0).alias("x"))
    per = inst.filter(pl.col("step").is_in(steps)).explode("rank").group_by("rank").agg(pl.col("x").sum())
    ratio = (inst["own"] / inst["typ"]).filter(inst["typ"] > 0)
    gain = float(per["x"].max()) / len(steps) if per.height else 0.0  # x is per group already typical
    worst = inst.with_columns((pl.col("own") / pl.col("typ")).alias("r")).filter(pl.col("typ") > 0).sort(
        "r", descending=True).head(1)
    slow = None
    if worst.height:
        # persistence: the group's transfers against their typical, step by step (a slow link is slow in
        # every step; a descheduled member makes its group slow in some steps only)
        by_step = inst.filter((pl.col("group_id") == worst["group_id"][0]) & (pl.col("typ") > 0)).group_by(
            "step").agg((pl.col("transfer") / pl.col("typ")).median().alias("r"))
        slow = {"group_id": worst["group_id"][0], "ranks": sorted(int(r) for r in worst["rank"][0]),
                "transfer_ratio": float(worst["r"][0]),
                "min_step_ratio": float(by_step["r"].min()) if by_step.height >= 2 else None,
                "steps_seen": int(by_step.height)}
    return gain, {"collectives": int(inst.height), "slowest_group": slow,
                  "max_group_transfer_vs_typical": float(ratio.max()) if ratio.len() else None}


def arrival_skew(comm_op: pl.DataFrame, step_mark: pl.DataFrame | None = None,
                 layout: pl.DataFrame | None = None) -> dict:
    """S, what-if shares and per-rank evidence from comm_op records alone.

    Needs comm_op columns rank, op, step, start_ns, end_ns, group_id, group_ranks, seq, size_bytes
    (completed ops with a step); step_mark (rank, step, start_ns, end_ns) widens the step windows;
    layout (rank, stage, dp_rank, ...) gives stage peers. Returns a dict with T_ns, T_ideal_ns, S,
    shares {worker, stage_imbalance, communication}, ranks (per-rank own work and excess), top rank,
    steps used and warm-up steps left out.
    """
    comm = comm_op.filter(pl.col("step").is_not_null() & pl.col("end_ns").is_not_null()).with_columns(
        pl.col("start_ns").cast(pl.Float64), pl.col("end_ns").cast(pl.Float64), pl.col("rank").cast(pl.Int64))
    if comm.height == 0:
        return {"evaluated": False, "why": "no completed comm_op record with a step"}
    win = _windows(comm, step_mark)
    span = (win["hi"] - win["lo"]).to_numpy()
    steps = win["step"].to_list()
    warmup = []
    if len(steps) >= 3 and span[0] > WARMUP_FACTOR * float(np.median(span[1:])):
        warmup = [int(steps[0])]
    # a step with under half the typical number of ops is a fragment (a barrier after the loop)
    counts = dict(comm.group_by("step").len().iter_rows())
    typical = float(np.median(list(counts.values())))
    partial = [int(s) for s in steps if counts.get(s, 0) < 0.5 * typical]
    used = [int(s) for s in steps if s not in warmup and s not in partial]
    if not used:
        return {"evaluated": False, "why": f"no whole step: warm-up {warmup}, fragments {partial}"}
    ranks = sorted(int(r) for r in comm["rank"].unique())
    grid = pl.DataFrame({"rank": ranks}).join(win.filter(pl.col("step").is_in(used)), how="cross")
    own = grid.join(_blocked(comm, win), on=["rank", "step"], how="left").with_columns(
        (pl.col("hi") - pl.col("lo") - pl.col("blocked").fill_null(0.0)).alias("W"))
    W = own.pivot(on="rank", index="step", values="W").sort("step")
    peers, peer_basis = _peers(comm, ranks, layout)
    mat = np.column_stack([W[str(r)].to_numpy() for r in ranks])  # steps x ranks
    col = {r: i for i, r in enumerate(ranks)}
    excess = np.zeros_like(mat)
    peer_w = np.full_like(mat, np.nan)
    for r in ranks:
        if peers[r]:
            peer_w[:, col[r]] = np.median(mat[:, [col[p] for p in peers[r]]], axis=1)
            excess[:, col[r]] = mat[:, col[r]] - peer_w[:, col[r]]
    T_steps = span[[steps.index(s) for s in used]]
    # medians over steps throughout: a one-off stall (a rank descheduled once on a busy host) is not a straggler
    T = float(np.median(T_steps))
    mean_excess = np.median(excess, axis=0)
    top_i = int(np.argmax(mean_excess))
    # noise floor: the largest excess that any other rank shows
    others = np.delete(mean_excess, top_i)
    # (a rank faster than a slow peer is not noise: only excess of the same sign counts)
    noise = max(0.0, float(others.max())) if others.size else 0.0
    worker_gain = max(0.0, float(mean_excess[top_i]) - noise)
    stage_gain, stage_ev = _stage_gain(mat, ranks, layout)
    comm_gain, comm_ev = _transfer_excess(comm, used)
    # the fixes overlap when one rank is the whole stage: never remove more than the step
    total = min(worker_gain + stage_gain + comm_gain, 0.95 * T)
    T_ideal = T - total
    gap = T - T_ideal
    share = (lambda g: g / gap if gap > 0 else 0.0)  # noqa: E731
    rank_rows = [{"rank": r, "own_work_ns": float(np.median(mat[:, col[r]])),
                  "peer_own_work_ns": float(np.nanmedian(peer_w[:, col[r]])) if peers[r] else None,
                  # per-step ratio, then the median: the same steps and statistic as the excess
                  "own_vs_peers": (float(np.median(mat[:, col[r]] / np.maximum(peer_w[:, col[r]], 1.0)))
                                   if peers[r] else None),
                  "excess_ns": float(mean_excess[col[r]]),
                  "slow_steps": [int(used[k]) for k in range(len(used)) if peers[r] and peer_w[k, col[r]] > 0
                                 and mat[k, col[r]] >= SLOW_AT * peer_w[k, col[r]]],
                  "last_arrival_share": None} for r in ranks]
    _last_arrivals(comm, used, rank_rows)
    rank_rows.sort(key=lambda x: -x["excess_ns"])
    return {"evaluated": True, "T_ns": T, "T_ideal_ns": T_ideal, "S": T / T_ideal if T_ideal > 0 else 1.0,
            "shares": {"worker": share(worker_gain), "stage_imbalance": share(stage_gain),
                       "communication": share(comm_gain), "sequence_imbalance": 0.0},
            "gains_ns": {"worker": worker_gain, "stage_imbalance": stage_gain, "communication": comm_gain},
            "top_rank": ranks[top_i], "noise_floor_ns": noise, "ranks": rank_rows, "peers": peer_basis, "steps": used, "warmup_steps": warmup, "partial_steps": partial,
            "step_slowdown": [float(t / max(t - total, 0.05 * t)) for t in T_steps],
            "stage": stage_ev, "communication": comm_ev}


def _stage_gain(mat: np.ndarray, ranks: list[int], layout: pl.DataFrame | None) -> tuple[float, dict]:
    """The slowest stage's fastest member against the other stages' (one slow worker is not a slow stage)."""
    if layout is None or not layout.height:
        return 0.0, {}
    stage = {int(r): s for r, s in layout.select("rank", "stage").iter_rows() if s is not None}
    stages = sorted({stage[r] for r in ranks if r in stage})
    if len(stages) < 2:
        return 0.0, {}
    floor = {s: mat[:, [i for i, r in enumerate(ranks) if stage.get(r) == s]].min(axis=1) for s in stages}
    mean = {s: float(v.mean()) for s, v in floor.items()}
    worst = max(mean, key=mean.get)
    others = np.median(np.column_stack([floor[s] for s in stages if s != worst]), axis=1)
    gain = max(0.0, float(np.median(floor[worst] - others)))
    return gain, {"own_work_floor_by_stage_ns": {str(s): v for s, v in mean.items()}, "worst_stage": int(worst),
                  "worst_vs_others": float(mean[worst] / others.mean()) if others.mean() > 0 else None}


def _last_arrivals(comm: pl.DataFrame, steps: list[int], rows: list[dict]) -> None:
    """Per rank: the share of its collectives (of 2+ members) at which it arrived last."""
    coll = comm.filter(~pl.col("op").is_in(P2P_OPS) & pl.col("seq").is_not_null()
                       & pl.col("step").is_in(steps))
    if coll.height == 0:
        return
    coll = coll.with_columns(pl.len().over("group_id", "seq", "step").alias("n")).filter(pl.col("n") >= 2)
    last = coll.with_columns((pl.col("start_ns") == pl.col("start_ns").max().over("group_id", "seq", "step"))
                             .alias("last")).group_by("rank").agg(pl.col("last").mean())
    share = dict(last.iter_rows())
    for row in rows:
        row["last_arrival_share"] = float(share[row["rank"]]) if row["rank"] in share else None
