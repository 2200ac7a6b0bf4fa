"""A better rank-to-host mapping for the ``placement`` section: a local search over the job's own hosts, and
the step time the replay engine predicts for it.

Search: the unit that moves is a whole host's endpoints (a host keeps its GPU count, and TP, which Megatron
keeps inside a host, stays there). Endpoint k of a host (its endpoints sorted by leaf, then address: rail k)
takes rail k of the host it moves to. Hosts with the same number of endpoints swap places, two at a time;
a Kernighan-Lin pass makes the best swap of hosts not yet swapped in the pass, even one that costs, until
every host has moved once, and keeps the prefix of swaps that cut the cross-pod bytes most (bytes per step of
the strategy's own links, as the flows show them); passes repeat until one cuts nothing (deterministic).
A single swap cannot move a stage that fills two hosts; a pass can.

Prediction: the job's transfers as the flows show them (records of one directed pair that overlap in time
are one transfer) form a dependency graph: a transfer waits for the latest transfer of each of its two
endpoints that ended before it started, plus the gap between (the compute, or the wait, the flows do not
see), which the replay keeps. Replayed unchanged (:func:`rankscope.analysis.replay.replay`, the engine the
simulator and the what-if share) it gives back the capture. For the proposal, a transfer whose unit stops
(or starts) crossing pods (a pipeline link: the link itself; a DP or EP ring: the whole group, whose
slowest link paces it) takes the rate the job's own in-pod (cross-pod) transfers show: its duration is
scaled by the ratio of the two measured rates (bytes over transfer time, per traffic family where the
records have both, else over all of the job's transfers). The step time is the replayed capture's span
over its steps.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.replay import replay
from rankscope.collectors.errors import RankscopeError
from rankscope.collectors.record_class import record

MIN_GAIN = 1e-9
"""a swap must cut at least this share of the job's cross-pod bytes (float noise below)."""
MAX_ROUNDS = 10_000
"""swaps kept at most (each pass strictly cuts the cross-pod bytes, so the search ends well before)."""
RESOLVED_PER_STEP = 2.0
"""merged records a pipeline link's direction must show per step (median over the links) for the replay: each
carries one transfer per microbatch, so a job of two or more microbatches whose records resolve its transfers
shows at least two, while an exporter whose idle timeout outlasts the gaps merges a step's transfers and the
compute between into one record, whose duration is no transfer time to rescale (a single-microbatch job is
left unknown)."""
KL_HOSTS = 512
"""hosts up to which a pass tries a whole sequence of swaps (cubic in hosts); beyond, one best swap a pass
(a plain descent, which a whole stage spread over several hosts can stall)."""


@record
class Search:
    """The local search's result: where each endpoint goes, and the cross-pod bytes before and after."""

    moves: dict[str, str]
    """endpoint -> the endpoint whose place (host, leaf, pod) it takes (only endpoints that move)."""
    cross_before: float
    cross_after: float
    swaps: int


def host_units(topology, ends: set[str]) -> dict[str, list[str]]:
    """host -> the job's endpoints on it, by leaf then address (the position a swap keeps)."""
    host, leaf = topology.column("host"), topology.leaf_of()
    units: dict[str, list[str]] = {}
    for e in sorted(ends):
        if host.get(e) is not None:
            units.setdefault(host[e], []).append(e)
    return {h: sorted(es, key=lambda e: (leaf.get(e) or "", e)) for h, es in sorted(units.items())}


def local_search(units: dict[str, list[str]], pod_of_host: dict[str, str], pair_bytes: dict[tuple, float]) -> Search:
    """Pairwise host swaps minimising the bytes between pods (module doc). ``pair_bytes``: (src, dst) ->
    bytes per step; pairs with an endpoint outside ``units`` keep their cost and are left out."""
    hosts = list(units)
    index = {h: i for i, h in enumerate(hosts)}
    where = {e: index[h] for h, es in units.items() for e in es}
    n = len(hosts)
    S = np.zeros((n, n))
    for (a, b), x in pair_bytes.items():
        if a in where and b in where and where[a] != where[b]:
            S[where[a], where[b]] += x
            S[where[b], where[a]] += x
    pods = sorted({pod_of_host[h] for h in hosts})
    pod = np.array([pods.index(pod_of_host[h]) for h in hosts])
    size = np.array([len(units[h]) for h in hosts])
    place = np.arange(n)  # place[i]: the physical host whose slot content i now occupies

    def cost() -> float:
        return float(np.triu(S * (pod[:, None] != pod[None, :]), 1).sum())

    before = cost()
    same_size = size[:, None] == size[None, :]
    swaps, best = 0, before
    while swaps < MAX_ROUNDS and len(pods) > 1:
        # one Kernighan-Lin pass: the best swap of unlocked hosts, even one that costs (a whole stage of
        # two hosts moves one host at a time), each host once; keep the pass' best prefix
        locked = np.zeros(n, dtype=bool)
        done, run, best_run, best_at = [], 0.0, 0.0, 0
        for _ in range(n // 2 if n <= KL_HOSTS else 1):
            M = np.stack([S[:, pod == p].sum(axis=1) for p in range(len(pods))], axis=1)  # bytes to each pod
            own = M[np.arange(n), pod]
            A = own[:, None] - M[:, pod]  # A[i, j] = M[i, pod_i] - M[i, pod_j]
            ok = same_size & (pod[:, None] != pod[None, :]) & ~locked[:, None] & ~locked[None, :]
            delta = np.where(ok, A + A.T + 2 * S, np.inf)
            i, j = np.unravel_index(int(np.argmin(delta)), delta.shape)
            if not np.isfinite(delta[i, j]):
                break
            pod[i], pod[j] = pod[j], pod[i]
            place[i], place[j] = place[j], place[i]
            locked[i] = locked[j] = True
            done.append((i, j))
            run += float(delta[i, j])
            if run < best_run - MIN_GAIN * max(before, 1.0):
                best_run, best_at = run, len(done)
        for i, j in reversed(done[best_at:]):  # undo the swaps after the best prefix
            pod[i], pod[j] = pod[j], pod[i]
            place[i], place[j] = place[j], place[i]
        if best_at == 0:
            break
        swaps += best_at
        best += best_run
    moves = {}
    for i, h in enumerate(hosts):
        if place[i] != i:
            for e, target in zip(units[h], units[hosts[place[i]]]):
                moves[e] = target
    return Search(moves=moves, cross_before=before, cross_after=cost(), swaps=swaps)


class NoReplay(RankscopeError):
    """The flows hold no transfers to replay, or no rate to give the transfers that change."""


def transfers(job_flows: pl.DataFrame) -> pl.DataFrame:
    """The job's transfers: payload records of one directed pair that overlap in time merged into one.
    Columns src, dst, t0, t1 (ns), bytes."""
    f = job_flows.filter(pl.col("is_data")) if "is_data" in job_flows.columns else job_flows
    size = "est_bytes" if "est_bytes" in f.columns else "size_bytes"
    f = f.select(pl.col("src_addr").alias("src"), pl.col("dst_addr").alias("dst"), pl.col("start_ns").alias("t0"),
                 pl.col("end_ns").alias("t1"), pl.col(size).cast(pl.Float64).alias("bytes"))
    f = f.filter(pl.col("t1") > pl.col("t0")).sort("src", "dst", "t0")
    new = (pl.col("t0") > pl.col("t1").cum_max().shift(1).over("src", "dst")).fill_null(True)
    f = f.with_columns(new.cast(pl.Int64).cum_sum().alias("k"))
    return (f.group_by("k").agg(pl.col("src").first(), pl.col("dst").first(), pl.col("t0").min(),
                                pl.col("t1").max(), pl.col("bytes").sum())
            .drop("k").sort("t0", "src", "dst"))


def _graph(tr: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges (src, dst op ids) and launch delays: each transfer after the latest transfer of each of its
    endpoints that ended before it started."""
    ops = tr.with_row_index("op").with_columns(pl.col("op").cast(pl.Int64))
    ends = pl.concat([ops.select(pl.col("src").alias("e"), "op", "t0", "t1"),
                      ops.select(pl.col("dst").alias("e"), "op", "t0", "t1")])
    prev = ends.select("e", pl.col("op").alias("pred"), pl.col("t1").alias("pe")).sort("pe")
    j = ends.sort("t0").join_asof(prev, left_on="t0", right_on="pe", by="e", strategy="backward",
                                  check_sortedness=False)  # both sorted on the key; polars cannot check it per group
    j = j.filter(pl.col("pred").is_not_null() & (pl.col("pred") != pl.col("op"))).unique(["op", "pred"])
    t0, t1 = ops["t0"].to_numpy().astype(np.float64), ops["t1"].to_numpy().astype(np.float64)
    src, dst = j["pred"].to_numpy(), j["op"].to_numpy()
    latest = np.full(len(t0), -np.inf)
    np.maximum.at(latest, dst, t1[src])
    delay = np.where(np.isfinite(latest), t0 - latest, 0.0)
    return src, dst, np.maximum(delay, 0.0)


def _rates(tr: pl.DataFrame) -> dict:
    """(family, crosses) -> bytes per ns over the transfers of that kind; family None: all of them."""
    dur = (pl.col("t1") - pl.col("t0")).cast(pl.Float64)
    out = {}
    for keys, g in tr.group_by("family", "now"):
        out[tuple(keys)] = float(g["bytes"].sum()) / float(g.select(dur.sum()).item())
    for (now,), g in tr.group_by("now"):
        out[(None, now)] = float(g["bytes"].sum()) / float(g.select(dur.sum()).item())
    return out


def predict(job_flows: pl.DataFrame, unit_of: dict[tuple, tuple], crosses_now: dict[tuple, bool],
            crosses_new: dict[tuple, bool], steps: int) -> dict:
    """Replay the job's transfers today and with the units of ``crosses_new`` (module doc).

    ``unit_of``: (src, dst) -> (family, unit id) for the strategy's links; ``crosses_now/new``: unit ->
    whether it spans pods. Returns step_now_ns, step_proposed_ns (replayed span / steps), rate_in_pod and
    rate_across_pods (bytes per second), transfers_changed. Raises NoReplay when it cannot.
    """
    tr = transfers(job_flows)
    unit = [unit_of.get((a, b)) for a, b in zip(tr["src"].to_list(), tr["dst"].to_list())]
    tr = tr.with_columns(pl.Series("family", [u[0] if u else None for u in unit], dtype=pl.Utf8),
                         pl.Series("now", [bool(u and crosses_now.get(u[1])) for u in unit]),
                         pl.Series("new", [bool(u and crosses_new.get(u[1])) for u in unit]))
    if tr.is_empty():
        raise NoReplay("no timed payload record to replay")
    rates = _rates(tr.filter(pl.col("family").is_not_null()))
    changed = tr["now"] != tr["new"]
    moved_pipe = tr.filter(changed & (pl.col("family") == "pipeline"))
    if not moved_pipe.is_empty():
        per_step = float(tr.filter(pl.col("family") == "pipeline").group_by("src", "dst").len()["len"].median()) \
            / max(steps, 1)
        if per_step < RESOLVED_PER_STEP:
            raise NoReplay(f"the flow records merge a pipeline link's transfers ({per_step:.2g} per step, median "
                           "over its links), so their durations hold the compute between them; the replay needs a "
                           "record per transfer (an exporter idle timeout shorter than the gaps between them)")
    for want in (True, False):
        if (changed & (tr["new"] == want)).any() and (None, want) not in rates:
            raise NoReplay(f"the job has no {'cross-pod' if want else 'in-pod'} transfer to measure the rate that "
                           "the moved transfers would get")

    def rate(fam, x):
        return rates.get((fam, x), rates.get((None, x)))
    scale = np.array([rate(f, a) / rate(f, b) if a != b else 1.0
                      for f, a, b in zip(tr["family"].to_list(), tr["now"].to_list(), tr["new"].to_list())])
    t0 = tr["t0"].to_numpy().astype(np.float64)
    dur = tr["t1"].to_numpy().astype(np.float64) - t0
    src, dst, delay = _graph(tr)
    base = t0.min()
    now = replay(dur, src, dst, launch_delay=delay, release=t0 - base)
    new = replay(dur * scale, src, dst, launch_delay=delay, release=t0 - base)
    per = max(steps, 1)
    return {"step_now_ns": float(now.end.max() - now.start.min()) / per,
            "step_proposed_ns": float(new.end.max() - new.start.min()) / per,
            "rate_in_pod": rates.get((None, False), 0.0) * 1e9 or None,
            "rate_across_pods": rates.get((None, True), 0.0) * 1e9 or None,
            "transfers_changed": int(changed.sum())}
