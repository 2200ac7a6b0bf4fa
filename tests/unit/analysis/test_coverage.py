"""data_quality.missing_ranks: ranks declared by a world size or named in a group, with no records."""

import polars as pl

from rankscope.analysis.diagnose import diagnose
from rankscope.analysis.model.coverage import rank_coverage
from rankscope.collectors.job_frames import JobFrames, declared_world


def _comp(ranks):
    return pl.DataFrame({"rank": ranks, "name": ["f"] * len(ranks), "category": ["forward"] * len(ranks),
                         "start_ns": [0] * len(ranks), "end_ns": [10] * len(ranks)})


def test_declared_world_size_beyond_the_ranks_present():
    f = JobFrames.from_frames("j", compute_op=_comp([0, 1]))
    f.declared = [{"format": "kineto", "world_size": 8, "source": "a"}]
    cov = rank_coverage(f)
    assert cov.missing_ranks == [2, 3, 4, 5, 6, 7]
    assert cov.ranks.declared_world_size == 8 and cov.ranks.present == 2
    assert diagnose(f).data_quality.missing_ranks == [2, 3, 4, 5, 6, 7]


def test_group_members_without_records_are_missing():
    comm = pl.DataFrame({"rank": [0], "op": ["all_reduce"], "group_ranks": [[0, 1, 2]], "peer": [None],
                         "start_ns": [0], "end_ns": [5]}, schema_overrides={"peer": pl.Int32})
    f = JobFrames.from_frames("j", comm_op=comm, compute_op=_comp([0, 2]))
    assert rank_coverage(f).missing_ranks == [1]


def test_nothing_missing_when_all_declared_ranks_have_records():
    f = JobFrames.from_frames("j", compute_op=_comp([0, 1]))
    f.declared = [{"format": "kineto", "world_size": 2, "source": "a"}]
    cov = rank_coverage(f)
    assert cov.missing_ranks == [] and cov.ranks.note is None


def test_declared_world_from_manifest_notes():
    assert declared_world("kineto", {"world_size": 128, "rank": 0}) == {"format": "kineto", "world_size": 128}
    osdi = declared_world("whatif_parquet", {"layout": {"world_size": 64, "tp_size": 4}})
    assert osdi == {"format": "whatif_parquet", "world_size": 64, "layout": True, "tp_size": 4}
    se = declared_world("whatif_parquet", {"layout": {"world_size": 128, "tp_size": 1, "dsp_size": 2}})
    assert se == {"format": "whatif_parquet", "world_size": 128, "layout": True, "dsp_size": 2}
    assert declared_world("kineto", {"world_size": None}) is None
    assert declared_world("csv", {}) is None
