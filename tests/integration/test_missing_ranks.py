"""Meta's HTA sample traces declare more ranks than they hold: data_quality names the missing ones."""

import pytest

from rankscope.analysis.diagnose import diagnose
from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.job_frames import load_job
from rankscope.collectors.store import Store


@pytest.mark.parametrize("files,present,world", [
    (["sampled_rank-0.json.gz", "sampled_rank-1.json.gz"], [0, 1], 128),
    (["nccl_data.json.gz"], [0], 2),
])
def test_hta_missing_ranks(reference_dir, tmp_path, files, present, world):
    d = reference_dir / "kineto-hta"
    st = Store(tmp_path / "st")
    ingest(st, [d / f for f in files])
    dq = diagnose(load_job(st, "default")).data_quality
    assert dq.missing_ranks == [r for r in range(world) if r not in present]
    assert dq.ranks.declared_world_size == world and dq.ranks.present == len(present)


def test_hta_two_ranks_name_no_slow_link(reference_dir, tmp_path):
    # Two ranks share every link they use: a slow transfer cannot be pinned on either end.
    d = reference_dir / "kineto-hta"
    st = Store(tmp_path / "st")
    ingest(st, [d / "sampled_rank-0.json.gz", d / "sampled_rank-1.json.gz"])
    diag = diagnose(load_job(st, "default"))
    findings = diag.findings
    assert not [f for f in findings if f.kind == "slow_link"], findings
