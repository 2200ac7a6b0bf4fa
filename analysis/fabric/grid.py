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
  that split only proposes a labeling (see :func:`fabric.link_evidence.early_traffic`);
- *direction lag*: on a pipeline edge the forward direction starts long
  before the backward one (activations before gradients), while the two
  directions of a DP exchange start together; edges that are symmetric and
  lagged vote PP.

The stage order of the pipelines found here: :func:`rankscope.analysis.strategy.flows.stage_order.order_pipelines`.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import field

import numpy as np
import polars as pl

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.expert import ExpertSplit, split_expert_links
from rankscope.analysis.fabric.link_evidence import early_traffic, link_likeness
from rankscope.analysis.fabric.link_models import (
    BALANCED,
    TWO_WAY,
    adjacency,
    group_kind,
    link_fit,
)
from rankscope.analysis.fabric.pair_graph import address_key, components
from rankscope.analysis.fabric.tie_evidence import break_tie
from rankscope.collectors.record_class import record


@record(frozen=False)
class GridFit:
    dp_groups: list[list[str]]
    pipelines: list[list[str]]
    is_pp: np.ndarray
    valid: bool
    score: float
    notes: list[str] = field(default_factory=list)
    fit: float = 0.0
    """mean per-link fit to the traffic models of its labelling (0..1, see fabric.link_models)."""
    group_kinds: dict = field(default_factory=dict)
    """collective kind -> number of DP groups that fit it."""
    alternatives: list[dict] = field(default_factory=list)
    """other valid labellings that explain the traffic (almost) as well: dp, pp, fit."""
    ambiguous: bool = False
    tie_evidence: str = ""
    """what broke a tie between equally fitting labellings (fabric.tie_evidence), or why nothing did."""
    tie_broken: bool = False
    tie_kind: str = ""
    """``wrap`` or ``misfit`` (fabric.tie_evidence.TieBreak.kind) when a tie was broken."""
    ep_groups: list[list[str]] = field(default_factory=list)
    """the all-to-all meshes of expert parallelism, each inside one DP group (fabric.expert); empty: none."""
    expert_dp_groups: list[list[str]] = field(default_factory=list)
    """the expert-data-parallel rings that reduce the experts' gradients, when told apart."""
    mesh_only: np.ndarray | None = None
    """per link: it carries an all-to-all mesh's traffic only (neither DP nor PP); None without meshes."""
    ep_undecided: str = ""
    """why the flows cannot tell whether full meshes are expert parallelism, when they cannot."""


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


def _pipeline_faults(nodes: list[str], ai: np.ndarray, bi: np.ndarray, is_pp: np.ndarray, modes: np.ndarray,
                     data_sym: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """The pipelines the links labelled ``is_pp`` form (a component label per node) and why they are no
    set of pipelines (empty when they are): each must be a simple path or cycle, all of one length,
    its links of one byte mode, carrying payload both ways and about as much each way."""
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
    if not bool((deg <= 2).all() and shape_ok.all()):
        notes.append("pipeline edges do not form simple paths or cycles")
    if len(set(psize.tolist())) > 1:
        notes.append(f"pipelines of unequal length {sorted(set(psize.tolist()))}")
    # every stage boundary passes the same activations: a pipeline's links are of one byte mode
    if len(pa) and pl.DataFrame({"c": pl_lab[pa], "m": modes[is_pp]}).group_by("c").agg(
            k=pl.col("m").n_unique())["k"].max() > 1:
        notes.append("a pipeline's links carry different byte volumes")
    # activations go downstream and gradients upstream: a pipeline link carries payload both ways
    if is_pp.any() and (data_sym[is_pp] >= TWO_WAY).mean() < 0.5:
        notes.append("pipeline links carry payload one way only")
    # and as much each way: an activation's gradient has the activation's shape
    elif is_pp.any() and (data_sym[is_pp] >= BALANCED).mean() < 0.5:
        notes.append("pipeline links carry far more payload one way than the other")
    return pl_lab, notes


def _dp_group_kinds(n: int, da: np.ndarray, db: np.ndarray, dp_lab: np.ndarray, dsym: np.ndarray,
                    dt: np.ndarray | None) -> dict[int, str | None]:
    """The collective (fabric.link_models.group_kind) each DP group's links fit, None for none.

    ``da``, ``db``: the DP links of ``n`` nodes; ``dp_lab``: DP group per node; ``dsym``: the links'
    data symmetry; ``dt``: their first payload times, if known: a ring or tree of two-way links whose
    first payload walks round it stage by stage is a pipeline, so it fits no collective."""
    adj = adjacency(n, da, db)
    two = dsym >= TWO_WAY
    balanced = dsym >= BALANCED
    members: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(dp_lab.tolist()):
        members[c].append(i)
    link_group = dp_lab[da]
    kinds: dict[int, str | None] = {}
    for c, m in members.items():
        sel = link_group == c
        kinds[c] = group_kind(m, da[sel], db[sel], two[sel], adj, balanced[sel])
        if kinds[c] in ("tree", "ring") and dt is not None and two[sel].all() \
                and staggered_cycle(m, da[sel], db[sel], dt[sel]):
            kinds[c] = None
    return kinds


def _mixed_modes(link_group: np.ndarray, dmodes: np.ndarray) -> int:
    """How many byte modes beyond one the DP groups' links fall into, summed over the groups
    (``link_group``: DP group of each DP link, ``dmodes``: its byte mode)."""
    if not len(link_group):
        return 0
    dm = pl.DataFrame({"c": link_group, "m": dmodes}).group_by("c").agg(k=pl.col("m").n_unique())
    return int((dm["k"] - 1).sum())


def _fit(nodes: list[str], ai: np.ndarray, bi: np.ndarray, is_pp: np.ndarray, like: np.ndarray,
         modes: np.ndarray, data_sym: np.ndarray, link_t: np.ndarray | None = None) -> GridFit:
    """One labelling ``is_pp`` (per link ai-bi: pipeline, else DP) judged: its DP groups and pipelines,
    whether they form a dp x pp grid of collectives (notes say why not), and its score: the links' fit
    to their traffic models, + 1e6 when valid, - 1e3 per byte mode a DP group has beyond one."""
    n = len(nodes)
    pl_lab, notes = _pipeline_faults(nodes, ai, bi, is_pp, modes, data_sym)
    dmask = ~is_pp
    da, db = ai[dmask], bi[dmask]
    dp_lab = components(nodes, da, db)
    dsize = np.bincount(dp_lab)
    if len(set(dsize.tolist())) > 1:
        notes.append(f"data-parallel groups of unequal size {sorted(set(dsize.tolist()))}")
    # every DP group must be a collective's link pattern (ring, tree, all-to-all), not any set of links
    kinds = _dp_group_kinds(n, da, db, dp_lab, data_sym[dmask], link_t[dmask] if link_t is not None else None)
    bad = [c for c, k in kinds.items() if k is None]
    if bad:
        notes.append(f"{len(bad)} data-parallel group(s) fit no collective (ring, tree, all-to-all)")
    link_group = dp_lab[da]
    # one collective moves the same bytes over every link of its group: a DP group whose links fall
    # into several byte modes is two kinds of traffic lumped together
    mixed = _mixed_modes(link_group, modes[dmask])
    if mixed:
        notes.append("a data-parallel group's links carry different byte volumes")
    # grid: no DP group holds two members of one pipeline
    pairs = set(zip(dp_lab.tolist(), pl_lab.tolist()))
    if len(pairs) < n:
        notes.append("a data-parallel group holds two stages of one pipeline")
    valid = not notes  # every fault above leaves a note
    kind_of_link: list[str | None] = [None] * len(is_pp)
    for j, e in enumerate(np.flatnonzero(dmask).tolist()):
        kind_of_link[e] = kinds[int(link_group[j])]
    fit = link_fit(is_pp, kind_of_link, data_sym, like)
    mean_fit = float(fit.mean()) if len(fit) else 0.0
    score = float(fit.sum()) + (1e6 if valid else 0.0) - 1e3 * mixed
    counts: dict[str, int] = defaultdict(int)
    for k in kinds.values():
        counts[str(k)] += 1
    return GridFit(_groups(nodes, dp_lab), _groups(nodes, pl_lab), is_pp, valid, score, notes, fit=mean_fit,
                   group_kinds=dict(counts))


def _groups(nodes: list[str], lab: np.ndarray) -> list[list[str]]:
    g: dict[int, list[str]] = defaultdict(list)
    for x, c in zip(nodes, lab.tolist()):
        g[c].append(x)
    return sorted((sorted(m, key=address_key) for m in g.values()), key=lambda m: address_key(m[0]))


def fit_grid(nodes: list[str], edges: pl.DataFrame, config: FlowConfig | None = None,
             resolution_ns: int = 1) -> GridFit:
    """Best DP/PP labeling of one job's heavy edges (see module doc), with near-equal alternatives.

    Needs edges columns a, b, bytes, first_ab, first_ba and data_symmetry (else symmetry). All-to-all
    meshes (expert parallelism, fabric.expert) are set apart first; they are the fit's ``ep_groups`` when
    the grid left over is valid and holds each inside a larger DP group.
    """
    like = link_likeness(edges, resolution_ns) if edges.height else None
    split = split_expert_links(nodes, edges, like)
    if split is None:
        return _fit_plain(nodes, edges, config, resolution_ns)
    k = len(split.ep_groups[0])
    rest = _fit_plain(nodes, split.edges, config, resolution_ns)
    if not rest.valid:
        # expert rings of two members send both ways, as pipeline links do: try them as such
        by_pairs = split_expert_links(nodes, edges, like, pairs=True)
        if by_pairs is not None:
            split, rest = by_pairs, _fit_plain(nodes, by_pairs.edges, config, resolution_ns)
            split.notes.append("the two-way links pairing the meshes member by member read as expert-data-"
                               "parallel pairs: as pipeline links they leave no valid grid")
    if _holds_meshes(rest, split, k):
        is_pp = np.zeros(edges.height, dtype=bool)
        is_pp[np.flatnonzero(split.kept)] = rest.is_pp
        rest.is_pp, rest.mesh_only = is_pp, split.mesh_only
        rest.ep_groups, rest.expert_dp_groups = split.ep_groups, split.expert_dp_groups
        rest.notes.extend(split.notes)
        return rest
    plain = _fit_plain(nodes, edges, config, resolution_ns)
    if plain.valid and plain.group_kinds.get("all_to_all") and max(len(g) for g in plain.dp_groups) == k:
        plain.ep_undecided = (f"every DP group of {k} is one full mesh: an all-to-all collective of data "
                              f"parallelism, or expert parallelism with EP = DP = {k}; flows cannot tell them apart")
    else:
        plain.notes.append(f"{len(split.ep_groups)} full mesh(es) of {k} members (all-to-all) found, but "
                           + ("the links left over form no valid grid" if not rest.valid else
                              "they do not each lie inside one larger DP group") + ": not expert parallelism")
    return plain


def _holds_meshes(fit: GridFit, split: ExpertSplit, k: int) -> bool:
    """Whether a grid is valid and holds each mesh and expert ring inside one DP group larger than a mesh."""
    dp_of = {x: i for i, g in enumerate(fit.dp_groups) for x in g}
    inside = all(len({dp_of.get(x) for x in g}) == 1 for g in split.ep_groups + split.expert_dp_groups)
    return bool(fit.valid and inside and len(fit.dp_groups[0]) > k)


def _fit_plain(nodes: list[str], edges: pl.DataFrame, config: FlowConfig | None = None,
               resolution_ns: int = 1) -> GridFit:
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
