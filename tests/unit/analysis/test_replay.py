"""The dependency-graph replay engine (shared by the simulator and the what-if analysis)."""

from __future__ import annotations

import numpy as np
import pytest

from rankscope.analysis.replay.engine import CycleError, chain_edges, replay


def _naive(duration, src, dst, delay, group, release):
    """Reference: repeated relaxation until nothing changes (slow, obviously right)."""
    n = len(duration)
    end = np.full(n, np.nan)
    preds = [[] for _ in range(n)]
    for s, d in zip(src, dst):
        preds[d].append(s)
    members = {}
    for i, g in enumerate(group):
        members.setdefault(g if g >= 0 else -(i + 1), []).append(i)
    done = set()
    while len(done) < len(members):
        progressed = False
        for key, ops in members.items():
            if key in done or any(np.isnan(end[p]) for i in ops for p in preds[i]):
                continue
            ready = [max([end[p] for p in preds[i]], default=release[i]) + delay[i] for i in ops]
            start = max(ready)
            for i in ops:
                end[i] = start + max(duration[j] for j in ops)
            done.add(key)
            progressed = True
        if not progressed:
            raise AssertionError("cycle")
    return end


def test_chain_and_collective_semantics():
    # two ranks: compute a0 (3), a1 (5); then an all_reduce pair (2) ; then compute b0, b1 (1)
    dur = np.array([3, 5, 2, 2, 1, 1], dtype=float)
    src, dst = np.array([0, 1, 2, 3]), np.array([2, 3, 4, 5])
    sync = np.array([-1, -1, 7, 7, -1, -1])
    r = replay(dur, src, dst, sync_group=sync, launch_delay=np.array([0, 0, 0.5, 0.5, 0, 0]))
    assert r.ready.tolist() == [0, 0, 3.5, 5.5, 7.5, 7.5]
    assert r.start[2] == r.start[3] == 5.5 and r.end[2] == r.end[3] == 7.5
    assert r.wait.tolist() == [0, 0, 2.0, 0, 0, 0]
    assert r.end.max() == 8.5 and r.makespan == 8.5


def test_random_dags_match_the_naive_reference():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(5, 60))
        dur = rng.uniform(0, 10, n)
        # edges only from lower to higher index, and pairs of ops synced: acyclic by construction
        src = rng.integers(0, n - 1, 2 * n)
        dst = src + rng.integers(1, 5, 2 * n)
        keep = dst < n
        src, dst = src[keep], dst[keep]
        group = np.full(n, -1)
        for k, i in enumerate(rng.choice(n - 1, size=n // 6, replace=False)):
            if group[i] < 0 and group[i + 1] < 0 and not np.any((src == i) & (dst == i + 1)):
                group[i] = group[i + 1] = k
        delay = rng.uniform(0, 1, n)
        release = rng.uniform(0, 3, n)
        try:
            want = _naive(dur, src, dst, delay, group, release)
        except AssertionError:
            with pytest.raises(CycleError):
                replay(dur, src, dst, launch_delay=delay, sync_group=group, release=release)
            continue
        got = replay(dur, src, dst, launch_delay=delay, sync_group=group, release=release)
        assert np.allclose(got.end, want)


def test_infinite_delay_is_a_hang_that_blocks_dependents_only():
    dur = np.ones(5)
    sync = np.array([1, 1, -1, -1, -1])
    # op 0 never launches; op 1 (its collective partner) and op 2 (after op 1) never finish; 3->4 run
    r = replay(dur, np.array([1, 3]), np.array([2, 4]), sync_group=sync,
               launch_delay=np.array([np.inf, 0, 0, 0, 0]))
    assert np.isfinite(r.ready[1]) and np.isinf(r.end[1]) and np.isinf(r.end[2])
    assert r.end[4] == 2.0


def test_cycles_are_reported():
    with pytest.raises(CycleError):
        replay(np.ones(2), np.array([0, 1]), np.array([1, 0]))
    with pytest.raises(CycleError):  # an edge inside one sync group is a self-wait
        replay(np.ones(2), np.array([0]), np.array([1]), sync_group=np.array([3, 3]))


def test_chain_edges_orders_each_stream():
    src, dst = chain_edges(np.array([1, 0, 1, 0, 1]), np.array([5, 2, 1, 9, 3]))
    assert sorted(zip(src.tolist(), dst.tolist())) == sorted([(2, 4), (4, 0), (1, 3)])
