"""Process groups of unlabelled collectives (gloo Kineto), one source per rank, and sequence agreement."""

from __future__ import annotations

import numpy as np
import polars as pl

from rankscope.analysis.model.sources import one_source_per_rank
from rankscope.analysis.strategy.groups_from_streams import label_groups, memberships_from
from rankscope.analysis.strategy.whitebox import infer_whitebox
from rankscope.analysis.whatif.graph import BWD, FWD
from rankscope.analysis.whatif.sequence import heaviest_agreement

TP = [[0, 1], [2, 3], [4, 5], [6, 7]]
DP = [[0, 2], [1, 3], [4, 6], [5, 7]]
PIPES = [[0, 4], [1, 5], [2, 6], [3, 7]]
MS = 1_000_000


def _calls(seed: int = 0) -> pl.DataFrame:
    """DP2 x PP2 x TP2 as gloo Kineto shows it: collectives without group; TP and DP all-reduces of one
    rank share the op and, at one stage, TP calls of both DP replicas share shape and count."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(3):
        t0 = step * 1000 * MS
        for g in TP:  # 8 TP calls per step, members end within microseconds, replicas ms apart
            base = t0 + g[0] * 3 * MS
            for k in range(8):
                end = base + (k + 1) * 20 * MS
                for r in g:
                    rows.append((r, "all_reduce", 1024, end - 5 * MS, end + int(rng.integers(0, 20_000))))
        for g in DP:  # two gradient buckets at the end of the step
            for k, size in enumerate((4224, 12416)):
                end = t0 + 400 * MS + g[0] * 7 * MS + k * 10 * MS
                for r in g:
                    rows.append((r, "all_reduce", size + 64 * (r >= 4), end - 2 * MS, end + int(rng.integers(0, 20_000))))
        for a, b in PIPES:
            rows.append((a, "send", 1024, t0 + 30 * MS, t0 + 31 * MS, b))
            rows.append((b, "recv", 1024, t0 + 29 * MS, t0 + 31 * MS, a))
    df = pl.DataFrame([r if len(r) == 6 else (*r, None) for r in rows],
                      schema={"rank": pl.Int32, "op": pl.Utf8, "size_bytes": pl.Int64, "start_ns": pl.Int64,
                              "end_ns": pl.Int64, "peer": pl.Int32}, orient="row")
    return df.with_columns(pl.lit(None, dtype=pl.List(pl.Int32)).alias("group_ranks"),
                           pl.lit(None, dtype=pl.Utf8).alias("group_id"), pl.lit(None, dtype=pl.Int64).alias("microbatch"),
                           pl.int_range(pl.len()).over("rank").cast(pl.Int64).alias("seq"),
                           pl.lit("kineto").alias("source"))


def _declared() -> list[dict]:
    """What each rank's distributedInfo.pg_config says: the world, its DP group and its TP group."""
    return [{"world_size": 8, "groups": [list(range(8)), dp, tp]}
            for r in range(8) for dp in DP for tp in TP if r in dp and r in tp]


def test_streams_matched_to_declared_groups_by_end_times():
    comm, notes = label_groups(_calls(), memberships_from(_declared()))
    assert notes["labelled"] == notes["streams"] and notes["undecided"] == 0
    coll = comm.filter(pl.col("op") == "all_reduce")
    tp = coll.filter(pl.col("size_bytes") == 1024)
    assert {tuple(g) for g in tp["group_ranks"].to_list()} == {tuple(g) for g in TP}
    assert {tuple(g) for g in coll.filter(pl.col("size_bytes") > 1024)["group_ranks"].to_list()} == \
        {tuple(g) for g in DP}
    # group ids name the members and the sequence restarts per group, so the n-th calls of one group meet
    per = coll.group_by("group_id", "seq").agg(n=pl.len())
    assert (per["n"] == 2).all()
    s = infer_whitebox(comm)
    assert (s.dp, s.pp, s.tp) == (2, 2, 2)
    assert sorted(s.tp_groups) == TP and sorted(s.dp_groups) == DP


def test_without_memberships_nothing_is_guessed():
    comm, notes = label_groups(_calls(), {})
    assert notes == {} and comm["group_ranks"].null_count() == comm.height


def test_undecided_when_two_groups_end_alike():
    df = _calls()
    # every member of both candidate groups ends together: the end times cannot tell them apart
    df = df.with_columns(pl.col("end_ns").min().over("op", "size_bytes", "seq").alias("end_ns"))
    comm, notes = label_groups(df.filter(pl.col("rank") < 4), memberships_from(_declared()))
    assert notes["undecided"] > 0


def test_one_source_per_rank_prefers_named_groups():
    hook = pl.DataFrame({"rank": [0, 0, 1], "source": ["hook"] * 3, "group_ranks": [[0, 1]] * 3})
    kin = pl.DataFrame({"rank": [0, 0, 0, 1], "source": ["kineto"] * 4, "group_ranks": [None] * 4},
                       schema={"rank": pl.Int64, "source": pl.Utf8, "group_ranks": pl.List(pl.Int64)})
    kept, dropped = one_source_per_rank(pl.concat([hook, kin]))
    assert set(kept["source"]) == {"hook"} and kept.height == 3
    assert dropped == {0: ["kineto"], 1: ["kineto"]}
    marks = pl.DataFrame({"rank": [0, 0], "source": ["hook", "kineto"]})
    kept, _ = one_source_per_rank(marks, prefer=pl.DataFrame({"rank": [0], "source": ["kineto"]}))
    assert kept["source"].to_list() == ["kineto"]


def _passes(heavy: dict, jitter: dict, steps: int = 6, m: int = 4) -> pl.DataFrame:
    rows = []
    for r in range(4):
        for s in range(steps):
            for mb in range(m):
                f = 3.0 if heavy.get((r, s)) == mb else 1.0
                rows.append((r, s, mb, FWD, f * (jitter.get((r, s, mb, FWD), 1.0))))
                rows.append((r, s, mb, BWD, 2 * f * (jitter.get((r, s, mb, BWD), 1.0))))
    return pl.DataFrame(rows, schema={"rank": pl.Int64, "step": pl.Int64, "microbatch": pl.Int64,
                                      "optype": pl.Utf8, "a": pl.Float64}, orient="row")


def test_heaviest_microbatch_agreement_separates_batches_from_jitter():
    heavy = {(r, s): (s + r) % 4 for r in range(2) for s in range(6)}  # two ranks hold long sequences
    # a descheduled pass here and there: one pass only, never both
    jitter = {(r, s, (s + 1) % 4, FWD if r % 2 else BWD): 2.0 for r in range(4) for s in range(6)}
    res = heaviest_agreement(_passes(heavy, jitter), 1.2)
    assert res["agree"] == 12 and res["p_value"] < 1e-3
    clean = heaviest_agreement(_passes({}, jitter), 1.2)
    assert clean["agree"] == 0 and clean["p_value"] == 1.0
