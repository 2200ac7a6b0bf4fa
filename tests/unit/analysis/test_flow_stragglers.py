"""Flows-only slow link: the endpoint slow on every one of its pairs is named; a gated ring is not."""

import polars as pl

from rankscope.analysis.diagnosis import Strategy
from rankscope.analysis.flow_stragglers import flow_straggler_section

# DP3 x PP3: pipelines (a0 a1 a2), (b0 b1 b2), (c0 c1 c2); ring per stage a->b->c->a
PIPES = [[f"10.0.{r}.{s}" for s in range(3)] for r in range(3)]
DP = [[p[s] for p in PIPES] for s in range(3)]
STRATEGY = Strategy(dp=3, pp=3, dp_groups=DP, pp_groups=PIPES)


def flows(slow: str | None, factor: float = 2.5) -> pl.DataFrame:
    rows = []

    def add(a, b, nbytes, base_ns, slowed):
        for step in range(4):
            t0 = 10**18 + step * 10**9
            rows.append((a, b, nbytes, t0, t0 + int(base_ns * (factor if slowed else 1.0))))

    for ring in DP:
        gated = slow in ring  # a ring runs at its slowest link's pace: every link of it is slow
        for i, a in enumerate(ring):
            add(a, ring[(i + 1) % 3], 4 << 30, 50_000_000, gated)
    for p in PIPES:
        for a, b in zip(p, p[1:]):
            for x, y in ((a, b), (b, a)):
                add(x, y, 64 << 20, 20_000_000, slow in (x, y))
    df = pl.DataFrame(rows, schema=["src_addr", "dst_addr", "size_bytes", "start_ns", "end_ns"], orient="row")
    return df.with_columns(sampling_rate=pl.lit(1), est_size_bytes=pl.lit(None, pl.Int64))


def test_the_slow_nic_is_named_not_its_ring_peers():
    s = flow_straggler_section(flows("10.0.1.1"), STRATEGY)
    assert s.verdict == "communication"
    assert [w["endpoint"] for w in s.top_workers] == ["10.0.1.1"]
    assert 2.0 < s.top_workers[0]["slowdown"] < 3.0
    assert s.extra["slowdown_evaluated"] is False  # no compute: S cannot be replayed


def test_a_healthy_fabric_names_nobody():
    s = flow_straggler_section(flows(None), STRATEGY)
    assert s.verdict == "none" and s.top_workers == []
    assert s.extra["evidence"]["highest_min_slowness"] < 1.1
