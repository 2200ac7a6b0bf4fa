import numpy as np
import polars as pl
import pytest

from rankscope.analysis.model.clocks import (
    ClockConfig,
    apply_exporter_offsets,
    apply_rank_offsets,
    exporter_clock_offsets,
    rank_clock_offsets,
)
from rankscope.collectors.errors import ConfigError

from .wb_frames import build_job


def test_offsets_and_drift_are_removed_up_to_one_common_shift():
    off = {0: 0, 1: 3_000_000, 2: -2_000_000, 3: 5_000_000}
    drift = {1: 2e-5, 3: -1e-5}
    skewed, _, _ = build_job(dp=4, pp=1, steps=6, offsets_ns=off, drift=drift)
    clean, _, _ = build_job(dp=4, pp=1, steps=6)
    o = rank_clock_offsets(skewed)
    fixed = apply_rank_offsets(skewed, o)
    err = (fixed["end_ns"] - clean["end_ns"]).to_numpy()
    # raw clocks disagree by up to 7 ms; after alignment every record is off by the same shift
    assert np.ptp((skewed["end_ns"] - clean["end_ns"]).to_numpy()) > 5_000_000
    assert np.ptp(err) < 20_000


def test_offset_only_fit_without_drift():
    skewed, _, _ = build_job(dp=4, pp=1, steps=3, offsets_ns={2: 4_000_000})
    o = rank_clock_offsets(skewed, ClockConfig(fit_drift=False))
    by = dict(zip(o["rank"].to_list(), o["offset_ns"].to_list()))
    assert by[2] - by[0] == pytest.approx(4_000_000, abs=1_000)
    assert o["drift"].abs().max() == 0


def test_host_is_the_clock_domain_when_known():
    skewed, _, _ = build_job(dp=4, pp=1, steps=3, offsets_ns={2: 4_000_000, 3: 4_000_000})
    skewed = skewed.with_columns(host=pl.when(pl.col("rank") < 2).then(pl.lit("a")).otherwise(pl.lit("b")))
    o = rank_clock_offsets(skewed)
    assert o["domain"].n_unique() == 2
    by = dict(zip(o["rank"].to_list(), o["offset_ns"].to_list()))
    assert by[3] == by[2] and by[2] - by[0] == pytest.approx(4_000_000, abs=5_000)


def test_no_collectives_means_no_correction():
    comm, _, _ = build_job(dp=1, pp=2, steps=1)
    o = rank_clock_offsets(comm)
    assert o.height == 2 and o["offset_ns"].abs().max() == 0


def test_config_is_validated():
    with pytest.raises(ConfigError, match="iterations"):
        ClockConfig(iterations=0)


def test_exporter_offset_from_flows_seen_twice():
    base = dict(src_addr=["10.0.0.1"] * 3, dst_addr=["10.0.0.2"] * 3, src_port=[1, 1, 2], dst_port=[4791] * 3,
                protocol=[17] * 3, start_ns=[100, 200, 300], end_ns=[150, 250, 350])
    a = pl.DataFrame({**base, "exporter": ["leaf1"] * 3})
    b = pl.DataFrame({**base, "exporter": ["leaf2"] * 3}).with_columns(pl.col("start_ns", "end_ns") + 7_000)
    extra = pl.DataFrame({**{k: v[:1] for k, v in base.items()}, "exporter": ["leaf1"]})
    flow = pl.concat([a, b, extra.with_columns(src_port=pl.lit(9, pl.Int64))])
    o = exporter_clock_offsets(flow)
    by = dict(zip(o["exporter"].to_list(), o["offset_ns"].to_list()))
    assert by == {"leaf1": 0.0, "leaf2": 7000.0}
    fixed = apply_exporter_offsets(flow, o)
    assert fixed.filter(pl.col("exporter") == "leaf2")["start_ns"].to_list() == [100, 200, 300]
