"""Pipelines whose links carry bytes within a byte mode of the DP links' (fabric.grid.byte_rank_candidates)."""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.grid import byte_rank_candidates, fit_grid


def _grid(dp: int, pp: int, pp_bytes: float, dp_bytes: float, seed: int = 0):
    """Edges of dp pipelines of pp stages (node k*pp+s is stage s of pipeline k) and, per stage, a DP
    group whose links form a cycle carrying the same payload both ways (a small double binary tree's
    shape). Bytes carry +-2 % noise; every link's two directions start together (no lag evidence)."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(dp):
        for s in range(pp - 1):
            rows.append((k * pp + s, k * pp + s + 1, pp_bytes))
    for s in range(pp):
        for k in range(dp):
            rows.append((k * pp + s, ((k + 1) % dp) * pp + s, dp_bytes))
    nodes = [f"n{i:03d}" for i in range(dp * pp)]
    e = pl.DataFrame({"a": [nodes[a] for a, _, _ in rows], "b": [nodes[b] for _, b, _ in rows],
                      "bytes": [b * rng.uniform(0.98, 1.02) for _, _, b in rows],
                      "first_ab": [0] * len(rows), "first_ba": [0] * len(rows),
                      "data_symmetry": rng.uniform(0.9, 1.0, len(rows))})
    pipes = sorted(sorted(nodes[k * pp:(k + 1) * pp]) for k in range(dp))
    return nodes, e, pipes


def test_pipeline_links_lighter_than_tree_links_within_one_byte_mode_are_found():
    # 1.5x apart: one byte mode (mode_gap 2.5), both kinds two-way and balanced, no lag, no early traffic
    nodes, e, pipes = _grid(dp=4, pp=16, pp_bytes=4e8, dp_bytes=6e8)
    fit = fit_grid(nodes, e, FlowConfig())
    assert fit.valid, fit.notes
    assert sorted(sorted(p) for p in fit.pipelines) == pipes
    assert {len(g) for g in fit.dp_groups} == {4}


def test_pipeline_links_heavier_than_the_dp_links_are_found_from_the_other_end():
    nodes, e, pipes = _grid(dp=4, pp=16, pp_bytes=9e8, dp_bytes=6e8)
    fit = fit_grid(nodes, e, FlowConfig())
    assert fit.valid, fit.notes
    assert sorted(sorted(p) for p in fit.pipelines) == pipes


def test_no_candidate_when_the_lightest_links_are_not_disjoint_paths_of_one_length():
    nodes, e, _ = _grid(dp=4, pp=16, pp_bytes=4e8, dp_bytes=6e8)
    n = len(nodes)
    idx = {x: i for i, x in enumerate(nodes)}
    ai = np.array([idx[x] for x in e["a"]])
    bi = np.array([idx[x] for x in e["b"]])
    two = np.ones(e.height, dtype=bool)
    right = byte_rank_candidates(n, ai, bi, e["bytes"].to_numpy(), two)
    assert right, "the 60 lightest links are the pipelines: one candidate at least"
    # bytes in no order that sets the pipeline links apart: every prefix breaks the path shape
    shuffled = np.random.default_rng(3).permutation(e["bytes"].to_numpy())
    for c in byte_rank_candidates(n, ai, bi, shuffled, two):
        deg = np.bincount(np.r_[ai[c], bi[c]], minlength=n)
        assert deg.max() <= 2  # whatever is proposed keeps the pipeline shape; _fit judges the rest
