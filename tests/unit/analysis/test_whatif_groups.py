"""Sync groups of the generic what-if model: which ops share a group, by integer keys."""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.whatif.generic import _groups


def _partition(codes: np.ndarray) -> set[frozenset]:
    out: dict[int, set] = {}
    for i, c in enumerate(codes.tolist()):
        if c >= 0:
            out.setdefault(c, set()).add(i)
    return {frozenset(v) for v in out.values()}


def test_groups_pair_p2p_and_collectives_and_leave_incomplete_keys_alone():
    rows = [
        # rank, stream, op, peer, group_id, seq, step
        (0, "send", "send", 1, None, 0, 1),          # 0: pairs with 1
        (1, "recv", "recv", 0, None, 0, 1),          # 1
        (0, "send", "send", 1, None, 1, 1),          # 2: next seq, pairs with 3
        (1, "recv", "recv", 0, None, 1, 1),          # 3
        (1, "send", "send", 0, None, 0, 1),          # 4: the other direction, alone
        (0, "tp", "all_reduce", None, "g:1", 5, 1),  # 5: a name with the separator, pairs with 6
        (1, "tp", "all_reduce", None, "g:1", 5, 1),  # 6
        (2, "tp", "all_reduce", None, "g", 5, 1),    # 7: another group
        (0, "dp", "all_gather", None, None, 5, 1),   # 8: no group id: by op name, with 9
        (1, "dp", "all_gather", None, None, 5, 1),   # 9
        (1, "dp", "all_gather", None, None, 5, 2),   # 10: another step
        (0, "tp", "all_reduce", None, "g:1", None, 1),  # 11: no seq: no group
        (0, "send", "send", None, None, 2, 1),       # 12: no peer: no group
        (0, "compute", None, None, None, None, 1),   # 13: compute
    ]
    ops = pl.DataFrame(rows, schema={"rank": pl.Int32, "stream": pl.String, "op": pl.String, "peer": pl.Int32,
                                     "group_id": pl.String, "seq": pl.Int64, "step": pl.Int64}, orient="row")
    codes = _groups(ops)
    assert (codes[[11, 12, 13]] == -1).all()
    assert _partition(codes) == {frozenset(s) for s in ({0, 1}, {2, 3}, {4}, {5, 6}, {7}, {8, 9}, {10})}
    assert sorted(set(codes[codes >= 0].tolist())) == list(range(7))  # numbered densely from 0
