"""Small simulated jobs shared by the dataset tests (each simulates in well under a second)."""

from __future__ import annotations

import polars as pl
import pytest

from rankscope.datasets.simulator import Fault, SimConfig, simulate


def frames(res) -> dict[str, pl.DataFrame]:
    return {k: pl.from_arrow(t) for k, t in res.tables.items()}


@pytest.fixture(scope="package")
def multi_host():
    """16 GPUs on 4 hosts of 4: dp4 x pp2 x tp2, flows unsampled, no fault."""
    cfg = SimConfig(dp=4, pp=2, tp=2, gpus_per_host=4, steps=3, microbatches=4, layers=8, seed=1)
    res = simulate(cfg)
    return res, frames(res)


@pytest.fixture(scope="package")
def slow_worker():
    """dp4 x pp2 (one host), rank 5 computes 1.5x slower; plus the same job without the fault."""
    kw = dict(dp=4, pp=2, steps=4, microbatches=4, layers=8, seed=3, flows=False, gemm_records=False)
    slow = simulate(SimConfig(faults=(Fault("slow-worker", {"rank": 5, "factor": 1.5}),), **kw))
    base = simulate(SimConfig(**kw))
    return slow, frames(slow), base, frames(base)
