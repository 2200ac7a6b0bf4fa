"""The corpus bench's account of its misses (benchmarks/bench_corpus.py): each job not exact apart from tp is
counted under one kind, so that the misses the records leave to chance are told from wrong answers."""

import importlib.util
from pathlib import Path

import polars as pl

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_corpus.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_corpus_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_each_miss_is_counted_once_under_its_kind():
    rows = pl.DataFrame({
        # exact; unrecognised; a tie listing the truth, listed second; an unclaimed order listed backwards;
        # a wrong claim; a tie whose alternatives miss the truth (wrong)
        "recognised": [True, False, True, True, True, True],
        "shape_ok": [True, False, False, False, False, False],
        "ok_reported": [True, False, False, True, False, False],
        "order_claimed": [True, True, True, False, True, True],
        "groups_ok": [True, False, False, True, False, False],
        "truth_in_tie": [False, False, True, False, False, False],
    })
    kinds = dict(_bench().misses_by_kind(rows))
    assert kinds == {"unrecognised (no job found with exactly its endpoints)": 1,
                     "standing tie, the truth listed as its alternative": 1,
                     "stage order not claimed, groups and pipelines right": 1,
                     "a reported field wrong": 2}


def test_rows_saved_before_the_kinds_were_recorded_give_none():
    assert _bench().misses_by_kind(pl.DataFrame({"shape_ok": [False]})) == []
