"""Data-parallel groups and pipelines (with stage order) from one job's heavy pair graph.

Every rank sits in one DP group and one pipeline, and a DP group meets each
pipeline at most once (a grid). Pipeline traffic joins neighbouring stages
only, so the pipeline edges form simple paths of one length; DP traffic
(ring, tree, reduce-scatter + all-gather) connects each DP group. Which edge
is which is decided by trying labelings and keeping the best one that forms
that grid:

- *byte modes*: all DP edges of a job carry about the same gradient volume
  per step and all pipeline edges about the same activation volume, so the
  log of per-pair bytes falls into a few modes; every split of the modes into
  {DP, PP} is a candidate;
- *first traffic*: pipeline links carry the first forward pass, DP links
  (except ZeRO-3 parameter gathers) start after the first backward pass;
  that split only proposes a labeling (see :func:`early_traffic`);
- *direction lag*: on a pipeline edge the forward direction starts long
  before the backward one (activations before gradients), while the two
  directions of a DP exchange start together; edges that are symmetric and
  lagged vote PP.

Stage order: the direction that starts first on a pipeline edge points
downstream, and so does the direction whose bytes move earlier on average
(activations before gradients in every step); votes are summed over all
pipelines between the same two DP groups (same pair of stages), so one
late-sampled record cannot flip it.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from rankscope.analysis.flow_config import FlowConfig
from rankscope.analysis.flow_jobs import address_key, components
from rankscope.analysis.flow_link_evidence import (
    SHAPE_TIE_BREAK,
    equally_good,
    mixed_pipelines,
    neutral_unresolved_lag,
    single_tree_groups,
)


@dataclass
class GridFit:
    dp_groups: list[list[str]]
    pipelines: list[list[str]]
    is_pp: np.ndarray
    valid: bool
    score: float
    notes: list[str] = field(default_factory=list)
    alternatives: list[dict] = field(default_factory=list)
    """other valid labellings the traffic scores exactly as well (dp_groups, pp_groups)."""


def byte_modes(bytes_: np.ndarray, gap: float, max_modes: int) -> np.ndarray:
    """Mode label per edge: sorted log-bytes split at gaps wider than ``gap`` (at most ``max_modes``)."""
    if len(bytes_) == 0:
        return np.zeros(0, dtype=int)
    lb = np.log(np.maximum(bytes_, 1.0))
    order = np.argsort(lb)
    d = np.diff(lb[order])
    cuts = np.flatnonzero(d > np.log(gap))
    if len(cuts) >= max_modes:
        cuts = np.sort(cuts[np.argsort(d[cuts])[::-1][: max_modes - 1]])
    lab_sorted = np.zeros(len(lb), dtype=int)
    for c in cuts:
        lab_sorted[c + 1:] += 1
    lab = np.empty_like(lab_sorted)
    lab[order] = lab_sorted
    return lab


def pp_likeness(edges: pl.DataFrame) -> np.ndarray:
    """0..1 per edge: symmetric traffic whose two directions start at clearly different times."""
    sym = edges["symmetry"].fill_null(0.0).fill_nan(0.0).to_numpy()
    fa = edges["first_ab"].to_numpy().astype(float)
    fb = edges["first_ba"].to_numpy().astype(float)
    lag = np.abs(np.nan_to_num(fa - fb, nan=0.0))
    span = max(np.nanmax(np.r_[fa, fb]) - np.nanmin(np.r_[fa, fb]), 1.0) if len(fa) else 1.0
    # lag relative to the large lags of the job: DP lags are sampling noise, PP lags a share of a step
    # (shrinking towards the last stage, hence the low bar of 5 %)
    ref = max(np.quantile(lag, 0.9) if len(lag) else 0.0, 1e-6 * span)
    return np.clip(sym * 2.0, 0, 1) * np.clip(lag / (0.05 * ref), 0, 1)


def early_traffic(edges: pl.DataFrame) -> np.ndarray:
    """1 for edges whose traffic starts in the early group, 0 for the late one, 0.5 when unclear.

    Pipeline links carry the first forward pass, DP links wait for the first
    backward pass to end; so when the capture saw the job start, the first
    record of each link splits into an early (PP) and a late (DP) cluster.
    scikit-learn's KMeans (k=2) on the first start; the split counts only
    when the gap between the clusters is wider than each cluster's spread.
    """
    first = edges.select(pl.min_horizontal("first_ab", "first_ba")).to_series().to_numpy().astype(float)
    out = np.full(len(first), 0.5)
    ok = np.isfinite(first)
    if ok.sum() < 4 or np.ptp(first[ok]) <= 0:
        return out
    from sklearn.cluster import KMeans

    x = (first[ok] - first[ok].min()).reshape(-1, 1)
    km = KMeans(n_clusters=2, n_init=4, random_state=0).fit(x)
    lab = km.labels_
    if len(set(lab.tolist())) < 2:
        return out
    early = int(np.argmin(km.cluster_centers_.ravel()))
    a, b = x[lab == early, 0], x[lab != early, 0]
    if b.min() - a.max() > max(np.ptp(a), np.ptp(b)):
        out[ok] = (lab == early).astype(float)
    return out


ONE_WAY = 0.1
"""An edge whose smaller direction carries under this share of the larger is one-way traffic: a ring
collective's link (data one way, RoCE ACKs or TCP acks back), never a pipeline link, which sends
activations forward and gradients back in equal volumes."""

SAME_COLLECTIVE_BYTES = 0.1
"""The ring links of one DP group carry the same bytes (a ring collective moves the same volume over
each of its links; tree links may carry one or both trees' halves, so only rings are held to it)."""


def _fit(nodes: list[str], ai: np.ndarray, bi: np.ndarray, is_pp: np.ndarray, like: np.ndarray,
         modes: np.ndarray, sym: np.ndarray | None = None, bytes_: np.ndarray | None = None) -> GridFit:
    n = len(nodes)
    notes: list[str] = []
    valid_dir = True
    if sym is not None and (is_pp & (sym < ONE_WAY)).any():
        valid_dir = False
        notes.append("one-way links labelled as pipeline links")
    pa, pb = ai[is_pp], bi[is_pp]
    pl_lab = components(nodes, pa, pb)
    deg = np.bincount(np.r_[pa, pb], minlength=n)
    psize = np.bincount(pl_lab)
    pedges = np.bincount(pl_lab[pa], minlength=len(psize)) if len(pa) else np.zeros(len(psize), int)
    # a path, or a cycle of more than two stages (interleaved schedules send the last stage's
    # output back to the first stage's next model chunk)
    shape_ok = (pedges == psize - 1) | ((pedges == psize) & (psize > 2))
    valid = bool((deg <= 2).all() and shape_ok.all())
    if not valid:
        notes.append("pipeline edges do not form simple paths or cycles")
    if len(set(psize.tolist())) > 1:
        valid = False
        notes.append(f"pipelines of unequal length {sorted(set(psize.tolist()))}")
    da, db = ai[~is_pp], bi[~is_pp]
    dp_lab = components(nodes, da, db)
    dsize = np.bincount(dp_lab)
    if len(set(dsize.tolist())) > 1:
        valid = False
        notes.append(f"data-parallel groups of unequal size {sorted(set(dsize.tolist()))}")
    # a collective's links are a ring (n edges) or a (double) binary tree (< 2n): a denser "DP group"
    # is several kinds of traffic lumped together
    dedges = np.bincount(dp_lab[da], minlength=len(dsize)) if len(da) else np.zeros(len(dsize), int)
    if (dedges > 2 * dsize).any():
        valid = False
        notes.append("data-parallel groups denser than a ring or double tree")
    # a ring has as many links as members and a double binary tree more; links that form a simple
    # path are a pipeline, not a collective (a 2-member group has one link either way)
    if ((dsize >= 3) & (dedges < dsize)).any():
        valid = False
        notes.append("a data-parallel group's links form no ring or double tree (a path or a tree)")
    valid = valid and valid_dir
    # grid: no DP group holds two members of one pipeline
    pairs = set(zip(dp_lab.tolist(), pl_lab.tolist()))
    if len(pairs) < n:
        valid = False
        notes.append("a data-parallel group holds two stages of one pipeline")
    agree = float(np.sum(np.where(is_pp, like, 1.0 - like)))
    # one collective moves the same bytes over every link of its group: a DP group whose links fall
    # into several byte modes is two kinds of traffic lumped together
    mixed = 0
    if len(da):
        dm = pl.DataFrame({"c": dp_lab[da], "m": modes[~is_pp]}).group_by("c").agg(k=pl.col("m").n_unique())
        mixed = int((dm["k"] - 1).sum())
    odd = 0
    if len(da) and sym is not None and bytes_ is not None:
        ring = sym[~is_pp] < ONE_WAY
        # a ring collective spans its whole group (every NCCL ring channel visits every member):
        # one-way links that fall apart into several rings inside one "group" are several groups
        # joined by other traffic
        if ring.any():
            parts = components(nodes, da[ring], db[ring])
            per_group = pl.DataFrame({"c": dp_lab, "p": parts}).group_by("c").agg(k=pl.col("p").n_unique())
            ringed = np.unique(dp_lab[da[ring]])
            if (per_group.filter(pl.col("c").is_in(ringed.tolist()))["k"] > 1).any():
                valid = False
                notes.append("one data-parallel group holds several separate rings")
            rb = pl.DataFrame({"c": dp_lab[da][ring], "b": bytes_[~is_pp][ring]}).with_columns(
                med=pl.col("b").median().over("c"))
            odd = int(((rb["b"] - rb["med"]).abs() > SAME_COLLECTIVE_BYTES * rb["med"]).sum())
    # ties in the traffic evidence go to the labelling with the collective shapes libraries use;
    # links of one pipeline in several byte modes count as weakly as a mixed DP group
    trees = single_tree_groups(n, da, db, dp_lab) + mixed_pipelines(pl_lab[pa], modes[is_pp])
    score = agree + (1e6 if valid else 0.0) - 1e3 * (mixed + odd) - SHAPE_TIE_BREAK * trees
    dp_groups = _groups(nodes, dp_lab)
    pipes = _groups(nodes, pl_lab)
    return GridFit(dp_groups, pipes, is_pp, valid, score, notes)


def _groups(nodes: list[str], lab: np.ndarray) -> list[list[str]]:
    g: dict[int, list[str]] = defaultdict(list)
    for x, c in zip(nodes, lab.tolist()):
        g[c].append(x)
    return sorted((sorted(m, key=address_key) for m in g.values()), key=lambda m: address_key(m[0]))


def fit_grid(nodes: list[str], edges: pl.DataFrame, config: FlowConfig | None = None) -> GridFit:
    """Best DP/PP labeling of one job's heavy edges (see module doc).

    Needs edges columns a, b, bytes, symmetry, first_ab, first_ba.
    """
    cfg = config or FlowConfig()
    idx = {x: i for i, x in enumerate(nodes)}
    ai = np.array([idx[x] for x in edges["a"].to_list()], dtype=np.int64)
    bi = np.array([idx[x] for x in edges["b"].to_list()], dtype=np.int64)
    like = neutral_unresolved_lag(edges, pp_likeness(edges))
    modes = byte_modes(edges["bytes"].to_numpy().astype(float), cfg.mode_gap, cfg.max_modes)
    k = int(modes.max()) + 1 if len(modes) else 0
    cands = [np.isin(modes, s) for r in range(k + 1) for s in itertools.combinations(range(k), r)]
    cands.append(like > 0.5)
    sym = edges["symmetry"].fill_null(0.0).fill_nan(0.0).to_numpy()
    two_way = sym >= ONE_WAY
    # direction pattern: one-way links are ring collectives; two-way ones pipelines or trees
    cands.append(two_way)
    cands.extend(np.isin(modes, s) & two_way for r in range(1, k + 1) for s in itertools.combinations(range(k), r))
    early = early_traffic(edges)
    if (early != 0.5).any():
        cands.append(early > 0.5)
        cands.extend(np.isin(modes, s) & (early > 0.5) for r in range(1, k + 1)
                     for s in itertools.combinations(range(k), r))
    best, fits = None, []
    b = edges["bytes"].to_numpy().astype(float)
    for c in cands:
        f = _fit(nodes, ai, bi, c, like, modes, sym, b)
        fits.append(f)
        if best is None or f.score > best.score:
            best = f
    best.alternatives = equally_good(fits, best)
    if not best.valid:
        best.notes.append("no labeling of the traffic forms a dp x pp grid; best effort shown")
    return best


def _cut_cycle(path: list[str], first: dict) -> list[str]:
    """Open an interleaved pipeline's cycle at its wrap-around link: going round the cycle the
    first activation reaches each next stage later, and the last stage's link back to the first
    stage starts latest of all."""
    n = len(path)
    t = [first.get((path[i], path[(i + 1) % n])) for i in range(n)]
    t = [x if x is not None else -1 for x in t]
    i = int(np.argmax(t))
    return path[i + 1:] + path[:i + 1]


def order_pipelines(fit: GridFit, edges: pl.DataFrame) -> tuple[list[list[str]], float]:
    """Order each pipeline first stage to last; returns (pipelines, share of consistent votes).

    Needs edges a, b, first_ab, first_ba and the fit's pipeline edges.
    """
    stage_key = {x: i for i, g in enumerate(fit.dp_groups) for x in g}
    pe = edges.filter(pl.Series(fit.is_pp))
    votes: dict[tuple[int, int], float] = defaultdict(float)
    for a, b, fa, fb in pe.select("a", "b", "first_ab", "first_ba").iter_rows():
        if fa is None or fb is None or fa == fb:
            continue
        s = 1.0 if fa < fb else -1.0  # a's traffic to b started first: a is upstream
        votes[(stage_key[a], stage_key[b])] += s
        votes[(stage_key[b], stage_key[a])] -= s
    # Within every step activations go downstream before gradients come back, so the bytes of the
    # downstream direction move earlier on average (byte-weighted record midpoints): this holds in
    # every step, whether or not the capture saw the job start, and with millisecond timestamps.
    if "mid_ab" in pe.columns:
        for a, b, ma, mb in pe.select("a", "b", "mid_ab", "mid_ba").iter_rows():
            if ma is None or mb is None or ma == mb:
                continue
            s = 1.0 if ma < mb else -1.0
            votes[(stage_key[a], stage_key[b])] += s
            votes[(stage_key[b], stage_key[a])] -= s
    first = {}
    for a, b, fa, fb in pe.select("a", "b", "first_ab", "first_ba").iter_rows():
        first[(a, b)], first[(b, a)] = fa, fb
    adj: dict[str, list[str]] = defaultdict(list)
    for a, b in pe.select("a", "b").iter_rows():
        adj[a].append(b)
        adj[b].append(a)
    out, agree, total = [], 0.0, 0.0
    for p in fit.pipelines:
        if len(p) == 1:
            out.append(p)
            continue
        ends = sorted((x for x in p if len(adj[x]) == 1), key=address_key)
        path = [ends[0]] if ends else [p[0]]
        while len(path) < len(p):
            nxt = [y for y in adj[path[-1]] if y not in path]
            if not nxt:
                break
            path.append(nxt[0])
        cyclic = not ends and len(path) > 2
        links = list(zip(path, path[1:] + ([path[0]] if cyclic else [])))
        s = sum(votes.get((stage_key[u], stage_key[v]), 0.0) for u, v in links)
        if s < 0:
            path = path[::-1]
        if cyclic:
            path = _cut_cycle(path, first)
        for u, v in zip(path, path[1:]):
            w = votes.get((stage_key[u], stage_key[v]), 0.0)
            agree += max(w, 0.0)
            total += abs(w)
        out.append(path)
    return sorted(out, key=lambda m: address_key(m[0])), (agree / total if total else 0.0)
