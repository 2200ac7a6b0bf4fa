"""The all-to-all of expert parallelism as a traffic model of its own, and its links set apart.

Mixture-of-Experts jobs carve expert-parallel (EP) groups of ``k`` members out
of each data-parallel group. Every MoE layer does a dispatch and a combine
all-to-all among an EP group's members, in forward and backward, per
microbatch, with sizes that change as routing shifts: a *full mesh* of ``k``
members whose every link carries payload both ways, about as much each way
once summed over the step's many repetitions. Dense gradients are then
reduced over the whole DP group (one ring) and expert gradients over the
*expert-data-parallel* group: the members at the same place in every EP group
of one DP group (their own ring).

None of that is a DP x PP grid: a DP group holds its ring, the meshes' chords
and the expert rings. So before the grid is fit (fabric.grid), the meshes are
found and their traffic taken out:

- *meshes*: the links that carry payload both ways and close triangles
  among such links; a pipeline's two-way links never do (each stage sends to
  its neighbours only). Their connected sets must each be complete graphs of
  one size ``k >= 3``; anything else is no mesh and nothing is set apart.
- *shared links*: where the DP ring runs between two members of one mesh, the
  address pair carries both. The mesh's share is what the smaller direction
  carries (it is the same each way); what is left over, one way, is the
  ring's. A link with no such remainder is the mesh's alone and is dropped.
- *expert rings*: one-way links between members of two different meshes. The
  dense ring enters each mesh at a member that has no ring link in from its
  own mesh and leaves it at one with no ring link out into it; a one-way link
  between two meshes that does not run from such an exit to such an entry is
  an expert ring's. An expert ring of two members sends both ways, like a
  pipeline link; it is taken for one where its two directions start
  together, or, with no lag evidence either way, only when every such link
  pairs two meshes member by member and nothing but that reading leaves a
  valid grid (a pipeline between two meshes reads as no grid at all then:
  its stages would share a DP group). The expert rings must each hold one member of a mesh at most and
  be of one size; else nothing is set apart.

Whether the meshes are expert parallelism is decided by the grid left over:
each mesh must lie inside one DP group of a valid grid, smaller than it. A
mesh as large as its whole DP group is as well an all-to-all collective of
data parallelism; the caller says so as undecided.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import field

import numpy as np
import polars as pl

from rankscope.analysis.fabric.link_models import TWO_WAY
from rankscope.analysis.fabric.pair_graph import address_key, components
from rankscope.collectors.record_class import record

SHARED_REMAINDER = 0.2
"""a mesh link whose larger direction exceeds the smaller by more than this share of the smaller carries a
second collective too (the DP ring); below it, the difference is the all-to-all's own routing imbalance.
Routing moves each call's payload by tens of percent, but a link sums a step's many calls (every layer,
microbatch and pass) both ways, so its two directions agree to a few percent (V7: 7.5 % at most; our
simulator, U(0.7, 1.3) per call: 3 %); the DP ring adds its whole one-way volume, which can be as
small as half the mesh's (our simulator's MoE jobs) or several times it (V7: 2.5x)."""

MIN_MESH = 3
"""a full mesh of fewer members is one link: nothing to tell it from a pair's collective."""


@record(frozen=False)
class ExpertSplit:
    """The meshes found in one job's heavy links, and the links left for the DP x PP grid."""

    ep_groups: list[list[str]]
    """each mesh's members, in address order; groups in the order of their first member."""
    expert_dp_groups: list[list[str]]
    """each expert ring's members (empty when none was told apart)."""
    mesh_only: np.ndarray
    """per input edge row: the link carries the mesh's traffic only (it is left out of the grid)."""
    expert_ring: np.ndarray
    """per input edge row: the link is an expert ring's (left out of the grid)."""
    edges: pl.DataFrame
    """the input edges that are left, with the mesh's share taken out of the shared links."""
    notes: list[str] = field(default_factory=list)

    @property
    def kept(self) -> np.ndarray:
        return ~(self.mesh_only | self.expert_ring)


def _two_way_triangles(n: int, ai: np.ndarray, bi: np.ndarray, two: np.ndarray) -> np.ndarray:
    """Per link: whether it carries payload both ways and closes a triangle of such links."""
    nb: list[set[int]] = [set() for _ in range(n)]
    for x, y in zip(ai[two].tolist(), bi[two].tolist()):
        nb[x].add(y)
        nb[y].add(x)
    return np.array([bool(t) and bool(nb[x] & nb[y]) for x, y, t in zip(ai.tolist(), bi.tolist(), two.tolist())],
                    dtype=bool)


def _meshes(nodes: list[str], ai: np.ndarray, bi: np.ndarray, in_mesh: np.ndarray) -> list[list[int]] | None:
    """The complete graphs of one size that the mesh links form (node indices), or None when they do not."""
    lab = components(nodes, ai[in_mesh], bi[in_mesh])
    members: dict[int, list[int]] = defaultdict(list)
    touched = set(ai[in_mesh].tolist()) | set(bi[in_mesh].tolist())
    for i in sorted(touched):
        members[int(lab[i])].append(i)
    links = np.bincount(lab[ai[in_mesh]], minlength=len(nodes))
    groups = list(members.values())
    if not groups or len({len(g) for g in groups}) != 1 or len(groups[0]) < MIN_MESH:
        return None
    k = len(groups[0])
    if any(links[lab[g[0]]] != k * (k - 1) // 2 for g in groups):
        return None
    return groups


def _directions(edges: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    a = edges["data_ab"].fill_null(0.0).to_numpy().astype(float) if "data_ab" in edges.columns \
        else edges["bytes_ab"].fill_null(0.0).to_numpy().astype(float)
    b = edges["data_ba"].fill_null(0.0).to_numpy().astype(float) if "data_ba" in edges.columns \
        else edges["bytes_ba"].fill_null(0.0).to_numpy().astype(float)
    return a, b


def _take_out_mesh(edges: pl.DataFrame, in_mesh: np.ndarray) -> tuple[pl.DataFrame, np.ndarray]:
    """The edges with the mesh's share (the smaller direction, both ways) taken out of every mesh link,
    and which mesh links carried nothing else."""
    d_ab, d_ba = _directions(edges)
    share = np.minimum(d_ab, d_ba)
    rest = np.abs(d_ab - d_ba)
    only = in_mesh & (rest <= SHARED_REMAINDER * share)
    shared = pl.Series(in_mesh & ~only)
    cols = {}
    for c in ("data_ab", "data_ba", "bytes_ab", "bytes_ba"):
        if c in edges.columns:
            pair = "ba" if c.endswith("ab") else "ab"
            other = pl.col(c[:-2] + pair)
            cols[c] = pl.when(shared).then(pl.col(c) - pl.min_horizontal(pl.col(c), other)).otherwise(pl.col(c))
    out = edges.with_columns(**cols)
    if {"bytes_ab", "bytes_ba"} <= set(out.columns):
        out = out.with_columns(bytes=pl.when(shared).then(pl.col("bytes_ab") + pl.col("bytes_ba"))
                               .otherwise(pl.col("bytes")))
    for sym, (x, y) in (("data_symmetry", ("data_ab", "data_ba")), ("symmetry", ("bytes_ab", "bytes_ba"))):
        if sym in out.columns and {x, y} <= set(out.columns):
            ratio = (pl.min_horizontal(x, y) / pl.max_horizontal(x, y)).fill_nan(0.0).fill_null(0.0)
            out = out.with_columns(pl.when(shared).then(ratio).otherwise(pl.col(sym)).alias(sym))
    return out, only


def _expert_rings(n: int, ai: np.ndarray, bi: np.ndarray, edges: pl.DataFrame, in_mesh: np.ndarray,
                  only: np.ndarray, mesh_of: np.ndarray, like: np.ndarray, pairs: bool) -> np.ndarray:
    """Per link: an expert ring's (see the module doc). ``edges``: with the mesh's share taken out;
    ``mesh_of``: each node's mesh (-1: none); ``like``: each link's pipeline likeness
    (fabric.link_evidence.link_likeness); ``pairs``: two-way links without lag evidence count too."""
    d_ab, d_ba = _directions(edges)
    fwd = d_ab >= d_ba
    src, dst = np.where(fwd, ai, bi), np.where(fwd, bi, ai)
    ring_inside = in_mesh & ~only
    sends_inside = np.zeros(n, dtype=bool)
    takes_inside = np.zeros(n, dtype=bool)
    sends_inside[src[ring_inside]] = True
    takes_inside[dst[ring_inside]] = True
    sym = np.minimum(d_ab, d_ba) / np.maximum(np.maximum(d_ab, d_ba), 1.0)
    between = (mesh_of[ai] >= 0) & (mesh_of[bi] >= 0) & (mesh_of[ai] != mesh_of[bi])
    dense_hop = ~sends_inside[src] & ~takes_inside[dst]
    # an expert ring of two members sends both ways, as a pipeline link does: it is one only where the two
    # directions start together, which a pipeline's (activations first, gradients a share of a step
    # later) do not; with no lag evidence either way it is left to the grid
    pair = between & (sym >= TWO_WAY) & (like < (0.5 if not pairs else 0.5 + 1e-9))
    return (between & (sym < TWO_WAY) & ~dense_hop) | pair


def _valid_rings(nodes: list[str], ai: np.ndarray, bi: np.ndarray, ring: np.ndarray,
                 mesh_of: np.ndarray) -> list[list[int]] | None:
    """The expert rings' members (node indices), or None when they are not rings of one size with one
    member per mesh at most."""
    lab = components(nodes, ai[ring], bi[ring])
    members: dict[int, list[int]] = defaultdict(list)
    for i in sorted(set(ai[ring].tolist()) | set(bi[ring].tolist())):
        members[int(lab[i])].append(i)
    groups = list(members.values())
    links = np.bincount(lab[ai[ring]], minlength=len(nodes))
    ok = groups and len({len(g) for g in groups}) == 1 and all(
        len({int(mesh_of[i]) for i in g}) == len(g) and links[lab[g[0]]] == (len(g) if len(g) > 2 else 1)
        for g in groups)
    return groups if ok else None


def split_expert_links(nodes: list[str], edges: pl.DataFrame, like: np.ndarray | None = None,
                       pairs: bool = False) -> ExpertSplit | None:
    """The all-to-all meshes of one job's heavy links and the links left for the grid (module doc), or
    None when the links hold no full mesh.

    Needs edges a, b, bytes, data_ab, data_ba (else bytes_ab, bytes_ba), data_symmetry (else symmetry);
    ``nodes``: the job's endpoints; ``like``: each link's pipeline likeness (0.5: no evidence); ``pairs``:
    take two-way links between two meshes without lag evidence for expert rings of two members as well
    (None unless every expert ring then is such a pair: the caller tries it when the grid is invalid
    without, and keeps it only when the grid left over is valid). The returned ``edges`` are the input's rows where ``kept``, with the
    same columns.
    """
    if edges.is_empty():
        return None
    like = np.full(edges.height, 0.5) if like is None else like
    idx = {x: i for i, x in enumerate(nodes)}
    ai = np.array([idx[x] for x in edges["a"].to_list()], dtype=np.int64)
    bi = np.array([idx[x] for x in edges["b"].to_list()], dtype=np.int64)
    col = "data_symmetry" if "data_symmetry" in edges.columns else "symmetry"
    two = edges[col].fill_null(0.0).fill_nan(0.0).to_numpy().astype(float) >= TWO_WAY
    in_mesh = _two_way_triangles(len(nodes), ai, bi, two)
    if not in_mesh.any():
        return None
    groups = _meshes(nodes, ai, bi, in_mesh)
    if groups is None:
        return None
    mesh_of = np.full(len(nodes), -1)
    for g, m in enumerate(groups):
        mesh_of[m] = g
    left, only = _take_out_mesh(edges, in_mesh)
    ring = _expert_rings(len(nodes), ai, bi, left, in_mesh, only, mesh_of, like, pairs)
    rings = _valid_rings(nodes, ai, bi, ring, mesh_of) if ring.any() else []
    if pairs and (not rings or any(len(g) != 2 for g in rings)):
        return None
    notes = []
    if rings is None:
        notes.append("one-way links between the all-to-all meshes form no expert-data-parallel rings of "
                     "one size: left to the grid")
        ring, rings = np.zeros(len(ai), dtype=bool), []
    kept = ~(only | ring)

    def named(gs: list[list[int]]) -> list[list[str]]:
        return sorted((sorted((nodes[i] for i in g), key=address_key) for g in gs), key=lambda g: address_key(g[0]))
    return ExpertSplit(named(groups), named(rings), only, ring, left.filter(pl.Series(kept)), notes)
