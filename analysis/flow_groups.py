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
  that split only proposes a labeling (see :func:`flow_link_evidence.early_traffic`);
- *direction lag*: on a pipeline edge the forward direction starts long
  before the backward one (activations before gradients), while the two
  directions of a DP exchange start together; edges that are symmetric and
  lagged vote PP.

Stage order: the direction that starts first on a pipeline edge points
downstream; votes are summed over all pipelines between the same two DP
groups (same pair of stages), so one late-sampled record cannot flip it.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from rankscope.analysis.flow_config import FlowConfig
from rankscope.analysis.flow_jobs import address_key, components
from rankscope.analysis.flow_link_evidence import early_traffic, lag_floor_ns, link_likeness
from rankscope.analysis.flow_models import BALANCED, TWO_WAY, adjacency, group_kind, link_fit
from rankscope.analysis.flow_tie_evidence import break_tie, ends_from_wrap, wrap_by_bytes


@dataclass
class GridFit:
    dp_groups: list[list[str]]
    pipelines: list[list[str]]
    is_pp: np.ndarray
    valid: bool
    score: float
    notes: list[str] = field(default_factory=list)
    fit: float = 0.0
    """mean per-link fit to the traffic models of its labelling (0..1, see flow_models)."""
    group_kinds: dict = field(default_factory=dict)
    """collective kind -> number of DP groups that fit it."""
    alternatives: list[dict] = field(default_factory=list)
    """other valid labellings that explain the traffic (almost) as well: dp, pp, fit."""
    ambiguous: bool = False
    tie_evidence: str = ""
    """what broke a tie between equally fitting labellings (flow_tie_evidence), or why nothing did."""
    tie_broken: bool = False
    tie_kind: str = ""
    """``wrap`` or ``misfit`` (flow_tie_evidence.TieBreak.kind) when a tie was broken."""


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


def staggered_cycle(members: list[int], ea: np.ndarray, eb: np.ndarray, link_t: np.ndarray,
                    min_members: int = 6) -> bool:
    """True when a group's links form one cycle whose first payload times rise link after link round
    it, with one drop (the wrap): the first micro-batch passing an interleaved pipeline's stages. One
    collective's links (ring, tree) all open within the collective; their order round the cycle is
    as good as random, and a random order of 6 or more links rises like this by chance < 2 %."""
    n = len(members)
    if n < min_members or len(ea) != n or not np.isfinite(link_t).all():
        return False
    nxt: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for x, y, t in zip(ea.tolist(), eb.tolist(), link_t.tolist()):
        nxt[x].append((y, t))
        nxt[y].append((x, t))
    if any(len(v) != 2 for v in nxt.values()):
        return False
    start, prev, cur, times = members[0], None, members[0], []
    for _ in range(n):
        (y0, t0), (y1, t1) = nxt[cur]
        y, t = (y0, t0) if y0 != prev else (y1, t1)
        if prev is None:
            y, t = y0, t0
        times.append(t)
        prev, cur = cur, y
    if cur != start:
        return False
    d = np.diff(np.r_[times, times[0]])
    up, down = int((d > 0).sum()), int((d < 0).sum())
    return max(up, down) >= n - 1 and min(up, down) == 1


def byte_rank_candidates(n: int, ai: np.ndarray, bi: np.ndarray, bytes_: np.ndarray, two: np.ndarray
                         ) -> list[np.ndarray]:
    """PP labellings that take the lightest (or heaviest) links, as many as a pipeline grid has.

    Byte modes cannot part DP from PP links whose volumes lie within ``mode_gap`` of each other (a
    tree all-reduce's links next to a deep pipeline's activations, sampled records that blur both).
    Pipeline links still carry one volume, unlike the DP links, so they sit together at one end of
    the links sorted by bytes, and a grid of ``n`` endpoints in pipelines of ``p`` stages has exactly
    ``n - n/p`` pipeline links (``n`` when the pipelines are cycles). Each such count, taken from
    either end of all links or of the two-way ones, is a candidate when its links form disjoint
    simple paths (or cycles) of one length; :func:`_fit` judges it like any other.
    """
    counts = {n - n // p for p in range(2, n + 1) if n % p == 0} | {n}
    out, seen = [], set()
    for base in (np.ones(len(bytes_), dtype=bool), two):
        idx = np.flatnonzero(base)
        order = idx[np.argsort(bytes_[idx], kind="stable")]
        for k in sorted(c for c in counts if c < len(order)):
            for pick in (order[:k], order[len(order) - k:]):
                deg = np.bincount(np.r_[ai[pick], bi[pick]], minlength=n)
                if deg.max() > 2:
                    continue
                sizes = np.bincount(components(list(range(n)), ai[pick], bi[pick]))
                if len(set(sizes.tolist())) != 1 or sizes[0] < 2:
                    continue
                c = np.zeros(len(bytes_), dtype=bool)
                c[pick] = True
                key = c.tobytes()
                if key not in seen:
                    seen.add(key)
                    out.append(c)
    return out


def _fit(nodes: list[str], ai: np.ndarray, bi: np.ndarray, is_pp: np.ndarray, like: np.ndarray,
         modes: np.ndarray, data_sym: np.ndarray, link_t: np.ndarray | None = None) -> GridFit:
    n = len(nodes)
    notes: list[str] = []
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
    # every stage boundary passes the same activations: a pipeline's links are of one byte mode
    if len(pa) and pl.DataFrame({"c": pl_lab[pa], "m": modes[is_pp]}).group_by("c").agg(
            k=pl.col("m").n_unique())["k"].max() > 1:
        valid = False
        notes.append("a pipeline's links carry different byte volumes")
    # activations go downstream and gradients upstream: a pipeline link carries payload both ways
    if is_pp.any() and (data_sym[is_pp] >= TWO_WAY).mean() < 0.5:
        valid = False
        notes.append("pipeline links carry payload one way only")
    dmask = ~is_pp
    da, db = ai[dmask], bi[dmask]
    dp_lab = components(nodes, da, db)
    dsize = np.bincount(dp_lab)
    if len(set(dsize.tolist())) > 1:
        valid = False
        notes.append(f"data-parallel groups of unequal size {sorted(set(dsize.tolist()))}")
    # every DP group must be a collective's link pattern (ring, tree, all-to-all), not any set of links
    adj = adjacency(n, da, db)
    two = data_sym[dmask] >= TWO_WAY
    balanced = data_sym[dmask] >= BALANCED
    members: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(dp_lab.tolist()):
        members[c].append(i)
    link_group = dp_lab[da]
    kinds: dict[int, str | None] = {}
    dt = link_t[dmask] if link_t is not None else None
    for c, m in members.items():
        sel = link_group == c
        kinds[c] = group_kind(m, da[sel], db[sel], two[sel], adj, balanced[sel])
        # a cycle of two-way links whose first payload walks round it stage by stage is a pipeline
        if kinds[c] in ("tree", "ring") and dt is not None and two[sel].all() \
                and staggered_cycle(m, da[sel], db[sel], dt[sel]):
            kinds[c] = None
    bad = [c for c, k in kinds.items() if k is None]
    if bad:
        valid = False
        notes.append(f"{len(bad)} data-parallel group(s) fit no collective (ring, tree, all-to-all)")
    mixed = 0
    if len(da):
        dm = pl.DataFrame({"c": link_group, "m": modes[dmask]}).group_by("c").agg(k=pl.col("m").n_unique())
        mixed = int((dm["k"] - 1).sum())
    # one collective moves the same bytes over every link of its group: a DP group whose links fall
    # into several byte modes is two kinds of traffic lumped together
    if mixed:
        valid = False
        notes.append("a data-parallel group's links carry different byte volumes")
    # grid: no DP group holds two members of one pipeline
    pairs = set(zip(dp_lab.tolist(), pl_lab.tolist()))
    if len(pairs) < n:
        valid = False
        notes.append("a data-parallel group holds two stages of one pipeline")
    kind_of_link: list[str | None] = [None] * len(is_pp)
    for j, e in enumerate(np.flatnonzero(dmask).tolist()):
        kind_of_link[e] = kinds[int(link_group[j])]
    fit = link_fit(is_pp, kind_of_link, data_sym, like)
    mean_fit = float(fit.mean()) if len(fit) else 0.0
    score = float(fit.sum()) + (1e6 if valid else 0.0) - 1e3 * mixed
    dp_groups = _groups(nodes, dp_lab)
    pipes = _groups(nodes, pl_lab)
    counts: dict[str, int] = defaultdict(int)
    for k in kinds.values():
        counts[str(k)] += 1
    return GridFit(dp_groups, pipes, is_pp, valid, score, notes, fit=mean_fit, group_kinds=dict(counts))


def _groups(nodes: list[str], lab: np.ndarray) -> list[list[str]]:
    g: dict[int, list[str]] = defaultdict(list)
    for x, c in zip(nodes, lab.tolist()):
        g[c].append(x)
    return sorted((sorted(m, key=address_key) for m in g.values()), key=lambda m: address_key(m[0]))


def fit_grid(nodes: list[str], edges: pl.DataFrame, config: FlowConfig | None = None,
             resolution_ns: int = 1) -> GridFit:
    """Best DP/PP labeling of one job's heavy edges (see module doc), with near-equal alternatives.

    Needs edges columns a, b, bytes, first_ab, first_ba and data_symmetry (else symmetry).
    """
    cfg = config or FlowConfig()
    idx = {x: i for i, x in enumerate(nodes)}
    ai = np.array([idx[x] for x in edges["a"].to_list()], dtype=np.int64)
    bi = np.array([idx[x] for x in edges["b"].to_list()], dtype=np.int64)
    like = link_likeness(edges, resolution_ns)
    col = "data_symmetry" if "data_symmetry" in edges.columns else "symmetry"
    data_sym = edges[col].fill_null(0.0).fill_nan(0.0).to_numpy().astype(float)
    two = data_sym >= TWO_WAY
    modes = byte_modes(edges["bytes"].to_numpy().astype(float), cfg.mode_gap, cfg.max_modes)
    link_t = edges.select(pl.min_horizontal("first_ab", "first_ba")).to_series().cast(pl.Float64) \
        .fill_null(float("nan")).to_numpy()
    k = int(modes.max()) + 1 if len(modes) else 0
    subsets = [np.isin(modes, s) for r in range(k + 1) for s in itertools.combinations(range(k), r)]
    cands = list(subsets)
    # direction pattern: one-way payload is never a pipeline link
    cands.extend(c & two for c in subsets)
    cands.append(like > 0.5)
    cands.extend(byte_rank_candidates(len(nodes), ai, bi, edges["bytes"].to_numpy().astype(float), two))
    early = early_traffic(edges)
    if (early != 0.5).any():
        cands.append(early > 0.5)
        cands.extend(np.isin(modes, s) & (early > 0.5) for r in range(1, k + 1)
                     for s in itertools.combinations(range(k), r))
    fits: dict[bytes, GridFit] = {}
    for c in cands:
        key = np.packbits(c).tobytes()
        if key not in fits:
            fits[key] = _fit(nodes, ai, bi, c, like, modes, data_sym, link_t)
    ranked = sorted(fits.values(), key=lambda f: -f.score)
    best = ranked[0]
    if not best.valid:
        best.notes.append("no labeling of the traffic forms a dp x pp grid of collectives; best effort shown")
        return best
    seen = {_shape(best)}
    tied = [best]
    for f in ranked[1:]:
        if not f.valid or _shape(f) in seen:
            continue
        seen.add(_shape(f))
        if best.fit - f.fit <= cfg.tie_margin:
            tied.append(f)
    tie = None
    if len(tied) > 1 and {"bytes_ab", "bytes_ba"} <= set(edges.columns):
        tie = break_tie([f.pipelines for f in tied], [f.is_pp for f in tied], edges)
        if tie.winner is not None:
            best = tied[tie.winner]
    for f in tied:
        if f is not best:
            best.alternatives.append({"dp": len(f.dp_groups[0]), "pp": len(f.pipelines[0]),
                                      "fit": round(f.fit, 4), "dp_groups": f.dp_groups[:4]})
    best.tie_broken = bool(tie and tie.winner is not None)
    best.tie_evidence = tie.evidence if tie else ""
    best.tie_kind = tie.kind if tie else ""
    best.ambiguous = bool(best.alternatives) and not best.tie_broken
    if best.alternatives:
        best.notes.append(f"{len(best.alternatives)} other labelling(s) explain the traffic within "
                          f"{cfg.tie_margin:.2f} of the best fit")
    if best.tie_broken:
        best.notes.append(f"tie broken by the bytes per link: {tie.evidence}")
    return best


def _shape(f: GridFit) -> tuple:
    return tuple(tuple(g) for g in f.dp_groups), tuple(tuple(p) for p in f.pipelines)


def _link_times(pe: pl.DataFrame) -> tuple[dict, dict, dict]:
    """(first payload per direction, first payload per link, last record per link) of pipeline links."""
    first, link_first, link_last = {}, {}, {}
    has_last = "last_link" in pe.columns
    for row in pe.iter_rows(named=True):
        a, b, fa, fb = row["a"], row["b"], row["first_ab"], row["first_ba"]
        first[(a, b)], first[(b, a)] = fa, fb
        t = min((x for x in (fa, fb) if x is not None), default=None)
        link_first[frozenset((a, b))] = t
        link_last[frozenset((a, b))] = row["last_link"] if has_last else None
    return first, link_first, link_last


def _link_bytes(pe: pl.DataFrame) -> dict:
    """(a, b) -> bytes a sent b, for both directions of each pipeline link (empty without the columns)."""
    if not {"bytes_ab", "bytes_ba"} <= set(pe.columns):
        return {}
    out = {}
    for a, b, x, y in pe.select("a", "b", "bytes_ab", "bytes_ba").iter_rows():
        out[(a, b)], out[(b, a)] = x, y
    return out


def _wrap_scores(path: list[str], link_first: dict, link_last: dict) -> np.ndarray:
    """Per link of a cycle (link i joins path[i] and path[i+1]): how much it looks like the
    interleaved pipeline's wrap-around link. Going round the cycle the first activation reaches each
    next stage later, so the last stage's link back to the first starts latest of all, and the last
    gradients leave it earliest of all (it is the most downstream link). Link times (either
    direction: the reverse direction's record may open with the transport's ACKs), ranked."""
    n = len(path)
    links = [frozenset((path[i], path[(i + 1) % n])) for i in range(n)]
    score = np.zeros(n)
    for times, sign in ((link_first, 1.0), (link_last, -1.0)):
        t = [times.get(x) for x in links]
        if any(x is None for x in t):
            continue
        from scipy.stats import rankdata

        score += sign * rankdata(np.array(t, dtype=float))  # tied times (coarse clocks) share a rank
    return score


def _walk(p: list[str], adj: dict) -> tuple[list[str], bool]:
    """A pipeline's members in link order from one end (any member for a cycle); whether it is a cycle."""
    ends = sorted((x for x in p if len(adj[x]) == 1), key=address_key)
    path = [ends[0]] if ends else [p[0]]
    while len(path) < len(p):
        nxt = [y for y in adj[path[-1]] if y not in path]
        if not nxt:
            break
        path.append(nxt[0])
    return path, not ends and len(path) > 2


def order_pipelines(fit: GridFit, edges: pl.DataFrame, resolution_ns: int = 1,
                    stage_votes: dict[tuple[int, int], tuple[int, int]] | None = None,
                    exporter_skew_ns: int = FlowConfig.max_exporter_skew_ns) -> tuple[list[list[str]], float]:
    """Order each pipeline first stage to last; returns (pipelines, share of consistent votes: 0 when
    any pipeline got no vote, its direction then being a guess).

    Three kinds of votes, summed per pair of stages (DP groups) over all pipelines, each way apart (the
    share counts the minority against the majority):

    - *link chronology*: the first micro-batch's activations reach each next stage later, so going
      downstream each link's first payload comes later than the previous link's; the last
      gradients leave each stage earlier than its upstream neighbour's, so each link's last
      record ends earlier going downstream. Both are link-level times (either direction) and so
      hold with ACK flows and TCP, where the reverse direction opens with the data;
    - *direction lag*: on one link the activation direction starts before the gradient direction;
      counted only when the two starts are clearly apart (flow_link_evidence.lag_floor_ns: beyond
      ``exporter_skew_ns`` when two exporters timed them, ``same_clock`` not true).

    Needs edges a, b, first_ab, first_ba (last_link when present) and the fit's pipeline edges.
    """
    stage_key = {x: i for i, g in enumerate(fit.dp_groups) for x in g}
    pe = edges.filter(pl.Series(fit.is_pp))
    first, link_first, link_last = _link_times(pe)
    # pro[(i, j)]: the weight of the votes that stage i is upstream of stage j. The two ways are kept
    # apart, so that the minority counts against the agreement: 64 links between two stages voting 40
    # to 24 are noise, not a clear 16 (a RoCE interleaved pipeline whose ACK-opened reverse records
    # lagged by the exporters' offset alone, both ways, was ordered backwards at "voted clearly")
    pro: dict[tuple[int, int], float] = defaultdict(float)

    def vote(u: str, v: str, s: float) -> None:  # s > 0: u is upstream of v
        ku, kv = stage_key[u], stage_key[v]
        if s > 0:
            pro[(ku, kv)] += s
        elif s < 0:
            pro[(kv, ku)] -= s

    # steps whose stages' data-parallel reductions end in one order or the other (flow_stage_order)
    for (i, j), (up, down) in (stage_votes or {}).items():
        if i < j:
            pro[(i, j)] += up
            pro[(j, i)] += down
    same = pe["same_clock"].to_list() if "same_clock" in pe.columns else [None] * pe.height
    for (a, b, fa, fb), sc in zip(pe.select("a", "b", "first_ab", "first_ba").iter_rows(), same):
        if fa is None or fb is None or abs(fa - fb) <= lag_floor_ns(resolution_ns, sc, exporter_skew_ns):
            continue
        vote(a, b, 1.0 if fa < fb else -1.0)  # a's traffic to b started first: a is upstream
    link_bytes = _link_bytes(pe)
    adj: dict[str, list[str]] = defaultdict(list)
    for a, b in pe.select("a", "b").iter_rows():
        adj[a].append(b)
        adj[b].append(a)
    walks = [(p, *_walk(p, adj)) if len(p) > 1 else (p, p, False) for p in fit.pipelines]
    # each time is cut to a clock tick, so two times less than two ticks apart may be in either order:
    # such a difference is no vote (one millisecond between two whole-job TCP records ordered a real
    # 4-stage pipeline backwards, "clearly")
    apart = 2 * int(resolution_ns)
    for _, path, cyclic in walks:
        links = [frozenset(x) for x in zip(path, path[1:] + ([path[0]] if cyclic else []))]
        # consecutive links x=(u,v), y=(v,w) along the walk: later first / earlier last on y says u->v->w
        for i in range(len(links) - 1):
            u, v = path[i], path[i + 1]
            s = 0.0
            f1, f2 = link_first.get(links[i]), link_first.get(links[i + 1])
            if f1 is not None and f2 is not None and abs(f2 - f1) >= apart:
                s += 1.0 if f2 > f1 else -1.0
            l1, l2 = link_last.get(links[i]), link_last.get(links[i + 1])
            if l1 is not None and l2 is not None and abs(l2 - l1) >= apart:
                s += 1.0 if l2 < l1 else -1.0
            if s:
                vote(u, v, s)
                vote(v, path[(i + 2) % len(path)], s)
        # a cycle whose last records end in order round it from its short link (flow_tie_evidence): the
        # last backward pass leaves the wrap first and each link upstream later, so the direction the
        # ends rise in is upstream. Two votes a link: over TCP each link's first record opens with its
        # connection, in any order, and those first-time votes must not outweigh this
        if cyclic and link_bytes:
            w = wrap_by_bytes(path, link_bytes)
            ends = [link_last.get(x) for x in links]
            walk = ends_from_wrap(np.array(ends, float), w) if w is not None and None not in ends else None
            if walk is not None:
                n = len(path)
                for i in range(n):
                    if i != w:
                        u, v = path[i], path[(i + 1) % n]
                        if walk > 0:  # the ends rise going forward: forward is upstream
                            u, v = v, u
                        vote(u, v, 2.0)
    votes = {k: w - pro.get((k[1], k[0]), 0.0) for k, w in pro.items()}
    votes.update({(j, i): -w for (i, j), w in list(votes.items())})
    split = {k: min(w, pro.get((k[1], k[0]), 0.0)) for k, w in pro.items()}
    split.update({(j, i): m for (i, j), m in list(split.items())})
    oriented = []
    # the lowest address of each stage (DP group): with no vote, every pipeline starts from the end
    # whose stage holds the lower one, so that all run the same way through the stages (one grid);
    # rail copies agree where hosts number their NICs alike on every rail (as _tp_groups assumes).
    # Walking each from its own lowest address would orient them at random once addresses do not
    # follow ranks.
    low = {stage_key[g[0]]: address_key(min(g, key=address_key)) for g in fit.dp_groups}
    nets = [sum(votes.get((stage_key[u], stage_key[v]), 0.0)
                for u, v in zip(path, path[1:] + ([path[0]] if cyclic else []))) for _, path, cyclic in walks]
    # a pipeline that no vote reached runs the way the address rule guesses; the voted ones may then run
    # the other way through the stages, and the report claims that its pipelines run alike: when any
    # pipeline is unvoted, all follow the address rule (and no direction is claimed, below)
    guessed = sum(1 for (p, _, _), net in zip(walks, nets) if len(p) > 1 and net == 0)
    for (p, path, cyclic), net in zip(walks, nets):
        if len(p) > 1:
            if guessed:
                net = 0.0
            if net == 0 and not cyclic:
                net = -1.0 if low[stage_key[path[-1]]] < low[stage_key[path[0]]] else 1.0
            elif net == 0:
                i = min(range(len(path)), key=lambda k: low[stage_key[path[k]]])
                before, after = path[i - 1], path[(i + 1) % len(path)]
                net = -1.0 if low[stage_key[before]] < low[stage_key[after]] else 1.0
            if net < 0:
                path = path[::-1]
        oriented.append((p, path, cyclic))
    # every pipeline wraps between the same two stages: pool the wrap evidence over pipelines, so that
    # one exporter's clock offset on one link cannot move the cut
    wrap: dict[frozenset, float] = defaultdict(float)
    pooled: dict[frozenset, int] = defaultdict(int)
    for _, path, cyclic in oriented:
        if cyclic:
            scores = _wrap_scores(path, link_first, link_last)
            # one link short by a model chunk both ways is the wrap whatever the clocks say
            # (flow_tie_evidence): it outweighs both time ranks together (at most 2 n apart)
            short = wrap_by_bytes(path, link_bytes)
            if short is not None:
                scores[short] += 4.0 * len(path)
            for i, sc in enumerate(scores.tolist()):
                key = frozenset((stage_key[path[i]], stage_key[path[(i + 1) % len(path)]]))
                wrap[key] += sc
                pooled[key] += 1
    out, agree, total, cycles, unclear = [], 0.0, 0.0, 0, 0
    for p, path, cyclic in oriented:
        if len(p) == 1:
            out.append(p)
            continue
        if cyclic:
            n = len(path)
            sc = [wrap[frozenset((stage_key[path[i]], stage_key[path[(i + 1) % n]]))] for i in range(n)]
            i = int(np.argmax(sc))
            cycles += 1
            # when both link times agree, the wrap outscores its upstream neighbour by 2 per pipeline
            # pooled; less means one of them disagrees or ties (millisecond clocks): a guess
            npool = pooled[frozenset((stage_key[path[i]], stage_key[path[(i + 1) % n]]))]
            unclear += int(sc[i] - sorted(sc)[-2] < 2 * max(npool, 1))
            path = path[i + 1:] + path[:i + 1]
        for u, v in zip(path, path[1:]):
            w = votes.get((stage_key[u], stage_key[v]), 0.0)
            m = split.get((stage_key[u], stage_key[v]), 0.0)
            agree += max(w, 0.0) + m
            total += abs(w) + 2 * m
        out.append(path)
    share = agree / total if total else 0.0
    # a cycle cut at a guessed link has the right neighbours but maybe the wrong first stage
    share *= 1.0 - 0.5 * (unclear / cycles if cycles else 0.0)
    # the direction of an unvoted pipeline is a coin flip, whatever the others' votes said: no claim
    # (dev corpus: a 4-rail 2-stage job whose reductions voted on three rails and not on the fourth was
    # "voted clearly" and wrong on that rail)
    if guessed:
        share = 0.0
    return sorted(out, key=lambda m: address_key(m[0])), share
