"""Traffic models of collectives and pipelines, job evidence, rail correlation and timestamp resolution."""

import numpy as np
import polars as pl

from rankscope.analysis.fabric.clock import timestamp_resolution_ns
from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.grid import fit_grid
from rankscope.analysis.fabric.heavy_links import light_pendants, storage_hubs
from rankscope.analysis.fabric.job_evidence import burst_counts
from rankscope.analysis.fabric.link_models import adjacency, group_kind
from rankscope.analysis.fabric.rails import rail_correlations
from rankscope.analysis.strategy.flows.period import whole_step
from tests.unit.analysis.flow_records import (
    JOB_OR_STORAGE_HOSTS,
    JOB_OR_STORAGE_SERVERS,
    directed_edges,
    endpoints,
    job_or_storage_links,
)


def _kind(n, links, two_way):
    a = np.array([x for x, _ in links])
    b = np.array([y for _, y in links])
    return group_kind(list(range(n)), a, b, np.array(two_way), adjacency(n, a, b))


def test_a_ring_is_a_collective_and_a_long_path_is_not():
    ring = [(i, (i + 1) % 8) for i in range(8)]
    assert _kind(8, ring, [False] * 8) == "ring"
    path = [(i, i + 1) for i in range(15)]
    assert _kind(16, path, [True] * 15) is None  # a 16-stage pipeline is no tree all-reduce
    assert _kind(16, path, [False] * 15) is None  # nor a ring
    heap = [(i, (i - 1) // 2) for i in range(1, 15)]
    # NCCL's double binary tree: the heap and its mirror (a leaf of one is inner in the other)
    mirror = [(14 - a, 14 - b) for a, b in heap]
    double = sorted({tuple(sorted(e)) for e in heap + mirror})
    assert _kind(15, double, [True] * len(double)) == "tree"
    assert _kind(15, heap, [True] * 14) is None  # one tree alone (n - 1 links) is no collective's shape
    assert _kind(2, [(0, 1)], [True]) == "pair"


def test_a_cycle_with_the_same_payload_both_ways_is_no_ring():
    # an interleaved pipeline's links (activations one way, gradients back) close a cycle too
    cyc = [(i, (i + 1) % 16) for i in range(16)]
    a, b = np.array([x for x, _ in cyc]), np.array([y for _, y in cyc])
    adj = adjacency(16, a, b)
    assert group_kind(list(range(16)), a, b, np.ones(16, bool), adj, np.ones(16, bool)) is None
    assert group_kind(list(range(16)), a, b, np.zeros(16, bool), adj, np.zeros(16, bool)) == "ring"


def test_interleaved_pipeline_cycle_is_not_read_as_a_data_parallel_ring():
    # 16 stages in a cycle, balanced payload both ways, both directions starting together (ACK flows)
    rows = [(f"n{i:02d}", f"n{(i + 1) % 16:02d}", 1e9, 100 * i, 100 * i, 1.0) for i in range(16)]
    fit = fit_grid([f"n{i:02d}" for i in range(16)], _edges(rows), FlowConfig())
    assert fit.valid and len(fit.pipelines) == 1 and len(fit.pipelines[0]) == 16


def _edges(rows):
    return pl.DataFrame(rows, schema=["a", "b", "bytes", "first_ab", "first_ba", "data_symmetry"], orient="row")


def test_pure_pipeline_is_not_read_as_data_parallel():
    # 6 stages, payload both ways, gradients start well after activations
    rows = [(f"n{i}", f"n{i + 1}", 1e9, 100 * i, 10_000 - 100 * i, 1.0) for i in range(5)]
    fit = fit_grid([f"n{i}" for i in range(6)], _edges(rows), FlowConfig())
    assert fit.valid and len(fit.pipelines) == 1 and len(fit.pipelines[0]) == 6
    assert all(len(g) == 1 for g in fit.dp_groups)


def test_one_way_star_is_no_grid_and_one_way_links_are_no_pipeline():
    rows = [("s", f"c{i}", 1e9, 0, 0, 0.001) for i in range(3)]
    fit = fit_grid(["s", "c0", "c1", "c2"], _edges(rows), FlowConfig())
    assert not fit.valid


def test_links_that_carry_far_more_one_way_are_no_pipeline():
    # two hosts of a PP2 job (activations and their gradients: as many bytes each way), each writing to
    # its own storage server as many bytes as the job moves, a quarter of them coming back: the path
    # server-host-host-server is no 4-stage pipeline (it was one, at confidence 0.99)
    rows = [("s1", "h1", 2.5e6, 0, 0, 0.22), ("h1", "h2", 2.0e6, 10, 10, 0.95), ("h2", "s2", 2.5e6, 0, 0, 0.22)]
    fit = fit_grid(["h1", "h2", "s1", "s2"], _edges(rows), FlowConfig())
    assert not (fit.valid and any(len(p) == 4 for p in fit.pipelines)), fit
    # the same path with balanced links is a pipeline
    rows = [(a, b, x, t0, t1, 0.9) for a, b, x, t0, t1, _ in rows]
    fit = fit_grid(["h1", "h2", "s1", "s2"], _edges(rows), FlowConfig())
    assert fit.valid and [len(p) for p in fit.pipelines] == [4]


def test_storage_server_by_shape_not_port():
    ring = [(f"r{i}", f"r{(i + 1) % 8}") for i in range(8)]
    star = [("srv", f"r{i}") for i in range(8)]
    e = pl.DataFrame(ring + star, schema=["a", "b"], orient="row")
    assert storage_hubs(e) == {"srv"}
    pend = pl.DataFrame([("a", "b", 1e10), ("a", "x", 1e8), ("b", "c", 1e10)], schema=["a", "b", "bytes"],
                        orient="row")
    assert light_pendants(pend, 2.5) == {"x"}


def test_bursts_are_counted_across_idle_gaps():
    f = pl.DataFrame({"src_addr": ["a"] * 4, "dst_addr": ["b"] * 4, "start_ns": [0, 10, 1000, 2000],
                      "end_ns": [5, 20, 1010, 2010]})
    assert burst_counts(f, 100)["bursts"].to_list() == [3]


def test_millisecond_timestamps_are_seen_as_such():
    t = 1_794_881_340_000_000_000 + np.arange(50) * 7_000_000 + 128  # float blur in the last digits
    assert timestamp_resolution_ns(t) == 1_000_000
    assert timestamp_resolution_ns(np.arange(1, 50) * 137) == 1


def _rail(offset_ns, rng, period=300_000_000, steps=8):
    starts = np.array([s * period + int(rng.normal(0, 1e6)) for s in range(steps)]) + offset_ns
    return starts, starts + 100_000_000


def test_rails_of_one_job_correlate_and_two_jobs_do_not_with_ms_stamps():
    rng = np.random.default_rng(0)
    rows = []
    for c, (off, period) in enumerate([(0, 300_000_000), (4_000_000, 300_000_000), (0, 410_000_000)]):
        s, e = _rail(off, rng, period)
        s, e = s // 1_000_000 * 1_000_000, e // 1_000_000 * 1_000_000
        rows += [(c, int(a), int(b), 1e9) for a, b in zip(s, e)]
    f = pl.DataFrame(rows, schema=["c", "start_ns", "end_ns", "est_bytes"], orient="row")
    corr, bin_ns = rail_correlations(f, [0, 1, 2], FlowConfig(), 1_000_000)
    assert bin_ns >= 4_000_000
    assert corr[(0, 1)][0] > 0.8 and corr[(0, 2)][0] < 0.8


def test_whole_step_from_a_sub_period():
    # four bursts a step, the last one (gradient sync) much bigger: a link's period is a quarter step
    rows = []
    for s in range(8):
        for q in range(4):
            t = s * 1_000_000_000 + q * 250_000_000
            rows.append((t, t + 50_000_000, 5e9 if q == 3 else 1e9))
    f = pl.DataFrame(rows, schema=["start_ns", "end_ns", "est_bytes"], orient="row")
    w = whole_step(f, 250_000_000, 1)
    assert w["multiple"] == 4 and abs(w["step_ns"] - 1e9) < 1e6


def test_a_multiple_held_too_few_times_leaves_the_period_uncertain():
    # the same steps, in captures of 2.6 and 3.4 steps: the step repeats at 4 periods in both, but held
    # under three times its autocorrelation is a repeat or two, which noise alone can lift past the margin
    def capture(steps):
        rows = []
        for i in range(int(steps * 4)):
            t = i * 250_000_000
            rows.append((t, t + 50_000_000, 5e9 if i % 4 == 3 else 1e9))
        return pl.DataFrame(rows, schema=["start_ns", "end_ns", "est_bytes"], orient="row")

    short = whole_step(capture(2.6), 250_000_000, 1)
    assert short["multiple"] == 1 and short["step_ns"] == 250_000_000
    assert short["weak"] and short["unconfirmed_multiple"] == 4 and short["corr"][4] > short["corr"][1]
    held = whole_step(capture(3.4), 250_000_000, 1)
    assert held["multiple"] == 4 and not held["weak"] and "unconfirmed_multiple" not in held


def _ring_records(n=6, steps=6, step=1_000_000_000, late=None, slow=None, res=1_000_000, roce=False):
    rows = []
    rng = np.random.default_rng(1)
    for s in range(steps):
        for i in range(n):
            src, dst = f"10.0.{i}.1", f"10.0.{(i + 1) % n}.1"
            t = s * step + 600_000_000 + int(rng.normal(0, 2e6)) + (150_000_000 if src == late else 0)
            t += 150_000_000 if roce and dst == late else 0  # RoCE: the writer waits for its posted buffers
            dur = 200_000_000 * (2.5 if slow in (src, dst) else 1.0) * (1 + rng.normal(0, 0.01))
            a, b = t // res * res, int(t + dur) // res * res
            rows.append((src, dst, a, b, 4e9, True))
    return pl.DataFrame(rows, schema=["src_addr", "dst_addr", "start_ns", "end_ns", "est_bytes", "is_data"],
                        orient="row")


def test_flow_stragglers_name_a_slow_nic_and_a_late_sender():
    from rankscope.analysis.report import Steps, Strategy
    from rankscope.analysis.stragglers.from_flows import flow_straggler_section

    strat = Strategy(dp=6, dp_groups=[[f"10.0.{i}.1" for i in range(6)]])
    steps = Steps(count=6, median_ns=1e9)
    nic = flow_straggler_section(_ring_records(slow="10.0.3.1"), strat, steps, 1_000_000)
    assert nic.verdict == "communication" and nic.top_workers[0].endpoint == "10.0.3.1"
    late = flow_straggler_section(_ring_records(late="10.0.4.1"), strat, steps, 1_000_000)
    assert late.verdict == "worker" and late.top_workers[0].endpoint == "10.0.4.1"
    calm = flow_straggler_section(_ring_records(), strat, steps, 1_000_000)
    assert calm.evaluated is False and not calm.top_workers


def test_over_roce_the_late_member_is_the_one_on_both_late_links():
    """Its predecessor's link into it opens late as well (RDMA writes wait for its posted buffers):
    two senders are late, and the one that also receives late is named, not its predecessor."""
    from rankscope.analysis.report import Steps, Strategy
    from rankscope.analysis.stragglers.from_flows import flow_straggler_section

    strat = Strategy(dp=6, dp_groups=[[f"10.0.{i}.1" for i in range(6)]])
    late = flow_straggler_section(_ring_records(late="10.0.4.1", roce=True), strat, Steps(count=6, median_ns=1e9),
                                  1_000_000)
    assert late.verdict == "worker" and [w.endpoint for w in late.top_workers] == ["10.0.4.1"]
    links = sorted(map(tuple, late.findings_flows[0]["late_links"]))
    assert links == [("10.0.3.1", "10.0.4.1"), ("10.0.4.1", "10.0.5.1")]


def test_a_cycle_whose_first_payload_walks_round_it_is_a_pipeline_not_a_tree():
    from rankscope.analysis.fabric.grid import staggered_cycle

    n = 8
    a, b = np.arange(n), (np.arange(n) + 1) % n
    walk = np.arange(n, dtype=float) * 5e6  # each next stage's link opens 5 ms later, the wrap last
    assert staggered_cycle(list(range(n)), a, b, walk)
    together = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=float)  # one collective: an arbitrary order
    assert not staggered_cycle(list(range(n)), a, b, together)
    assert not staggered_cycle(list(range(4)), a[:4] % 4, b[:4] % 4, walk[:4])  # too short to tell
    # fit_grid: a two-way balanced 8-cycle with staggered links is one pipeline, not a tree all-reduce
    rows = [(f"n{i}", f"n{(i + 1) % n}", 1e9, 5_000_000 * i, 5_000_000 * i, 1.0) for i in range(n)]
    fit = fit_grid([f"n{i}" for i in range(n)], _edges(rows), FlowConfig())
    assert fit.valid and len(fit.pipelines) == 1 and len(fit.pipelines[0]) == n


def test_storage_servers_as_many_as_the_hosts_are_peeled_by_shape():
    # a 4-stage pipeline (payload both ways, gradients late) whose every host writes checkpoints to each
    # of 4 servers over links as heavy as its own; the servers replicate among themselves, one way
    from rankscope.analysis.fabric.heavy_links import peel_servers, storage_shaped

    hosts, servers = [f"h{i}" for i in range(4)], [f"s{i}" for i in range(4)]
    rows = [(hosts[i], hosts[i + 1], 1e9, 100 * i, 10_000 - 100 * i, 1.0) for i in range(3)]
    rows += [(h, s, 8e8, 50, 50, 0.003) for h in hosts for s in servers]
    rows += [(servers[i], servers[(i + 1) % 4], 3e8, 70, 70, 0.002) for i in range(4)]
    e = _edges(rows)
    shape = dict(storage_shaped(e.with_columns(data_ab=pl.col("bytes"), data_ba=pl.col("bytes") * pl.col(
        "data_symmetry"))).select("n", "server").iter_rows())
    assert all(shape[s] for s in servers)
    assert not fit_grid(hosts + servers, e, FlowConfig()).valid
    # four servers among eight endpoints: more than the busiest-first peeling may take (a quarter)
    e = e.with_columns(data_ab=pl.col("bytes"), data_ba=pl.col("bytes") * pl.col("data_symmetry"))
    assert peel_servers(e, FlowConfig()) == set(servers)


def _storage(hosts, servers, write, replicate):
    """Every host writes to every server (sizes spread 1..3x; one way, but a third of the links read
    some back), the servers replicate both ways."""
    rows = [(h, s, write * (1 + (i * 7 + j * 3) % 5 / 2), write * 0.4 * ((i + j) % 3 == 0), 50, 50)
            for i, h in enumerate(hosts) for j, s in enumerate(servers)]
    rows += [(s, t, replicate, 0.95 * replicate, 70, 70) for i, s in enumerate(servers) for t in servers[i + 1:]]
    return rows


def test_servers_a_small_ring_writes_to_part_from_it_by_byte_scale():
    # 4 hosts in a one-way ring; 3 storage servers that every host writes to replicate among themselves.
    # For the servers the writes are heavy (a tenth of their replication), so the 7 endpoints form one
    # set that no grid fits, and the hosts, sending one way round the ring, look more like servers
    from rankscope.analysis.fabric.heavy_links import heavy_edges, peel_servers

    hosts, servers = [f"10.0.0.{i}" for i in (1, 2, 3, 4)], ["10.0.0.5", "10.0.0.7", "10.1.0.6"]
    ring = [(hosts[i], hosts[(i + 1) % 4], 1.4e11, 0.0, 10, 10) for i in range(4)]
    e = directed_edges(ring + _storage(hosts, servers, 3e8, 3.5e9))
    assert not fit_grid(hosts + servers, e, FlowConfig()).valid
    assert peel_servers(e, FlowConfig()) == set(servers)
    heavy = heavy_edges(e)
    assert endpoints(heavy) == set(hosts)
    assert fit_grid(hosts, heavy, FlowConfig()).valid


def test_pipeline_links_lighter_than_the_writes_stay_with_the_job():
    # dp2 x pp2: all-reduce pairs at 9e10, pipeline links at 1.1e10 and writes up to 3e9: the servers go,
    # the pipeline links (as light as the writes next to the all-reduce) stay
    from rankscope.analysis.fabric.heavy_links import heavy_edges

    hosts, servers = [f"10.0.0.{i}" for i in (1, 2, 3, 4)], ["10.0.0.5", "10.0.0.7", "10.1.0.6"]
    job = [(hosts[0], hosts[2], 4.5e10, 4.5e10, 10, 10), (hosts[1], hosts[3], 4.5e10, 4.5e10, 10, 10),
           (hosts[0], hosts[1], 5.7e9, 5.7e9, 1, 900), (hosts[2], hosts[3], 5.7e9, 5.7e9, 1, 900)]
    heavy = heavy_edges(directed_edges(job + _storage(hosts, servers, 1e9, 3e9)))
    assert endpoints(heavy) == set(hosts) and heavy.height == 4
    fit = fit_grid(hosts, heavy, FlowConfig())
    assert fit.valid and sorted(map(len, fit.pipelines)) == [2, 2]


def test_a_pure_pipeline_lighter_than_its_storage_is_not_traded_for_the_servers():
    # the servers replicate more than the pipeline's hosts send each other: the servers are the upper
    # byte scale, but they receive about as much as they replicate, so they are not taken for a job
    from rankscope.analysis.fabric.heavy_links import below_scale_gap, heavy_edges

    hosts, servers = [f"10.0.0.{i}" for i in (1, 2, 3, 4)], ["10.0.0.5", "10.0.0.7", "10.1.0.6"]
    pipe = [(hosts[i], hosts[i + 1], 5e8, 5e8, 100 * i, 10_000 - 100 * i) for i in range(3)]
    e = directed_edges(pipe + _storage(hosts, servers, 4e8, 3e9))
    assert not below_scale_gap(hosts + servers, e, FlowConfig())
    assert set(hosts) <= endpoints(heavy_edges(e))
    # with writes light for the hosts the pipeline is the upper scale: the servers go, the pipeline stays
    e = directed_edges(pipe + _storage(hosts, servers, 1e7, 1.5e8))
    assert below_scale_gap(hosts + servers, e, FlowConfig()) == set(servers)
    heavy = heavy_edges(e)
    assert endpoints(heavy) == set(hosts)
    fit = fit_grid(hosts, heavy, FlowConfig())
    assert fit.valid and [len(p) for p in fit.pipelines] == [4]


def test_replicating_storage_alone_is_no_job_and_keeps_its_shape():
    # only the servers' replication is above the scale gap, but they receive from their clients more than
    # a training host writes: the byte scales do not take the clients for the servers of a "job" made of
    # the servers
    from rankscope.analysis.fabric.heavy_links import below_scale_gap

    clients, servers = [f"10.2.0.{i}" for i in range(1, 4)], ["10.0.0.5", "10.0.0.7", "10.1.0.6"]
    e = directed_edges(_storage(clients, servers, 3e8, 3.5e9))
    assert not fit_grid(clients + servers, e, FlowConfig()).valid
    assert not below_scale_gap(clients + servers, e, FlowConfig())


def test_a_correlation_peak_at_the_end_of_the_lag_window_is_no_rail_alignment():
    """Two jobs with the same step time whose bursts are 100 ms apart correlate more and more toward a
    lag the exporters' clocks cannot have (max_exporter_skew_ns, 20 ms): the peak within the window
    sits at its end (0.89 there) and is no alignment. A rail 8 ms off peaks inside the window."""
    rows = []
    for c, off in enumerate([0, 100_000_000, 8_000_000]):
        for s in range(12):
            a = s * 3_000_000_000 + off
            rows += [(c, a + k * 1_000_000, a + 1_500_000_000 + k * 1_000_000, 1e9) for k in range(4)]
    f = pl.DataFrame(rows, schema=["c", "start_ns", "end_ns", "est_bytes"], orient="row")
    corr, bin_ns = rail_correlations(f, [0, 1, 2], FlowConfig(), 1_000_000)
    assert corr[(0, 1)][0] < 0.8 and corr[(1, 2)][0] < 0.8
    assert corr[(0, 2)][0] > 0.99 and corr[(0, 2)][1] * bin_ns == -8_000_000


def test_a_server_whose_clients_read_and_write_is_peeled_by_its_lopsided_links():
    # dev corpus (seed 5): an 8-stage interleaved pipeline (a cycle, its wrap link half as heavy) whose
    # hosts write to four servers. Three servers take writes one way; the fourth also serves reads, so
    # its links carry 15-25 % back, more than an ACK flow (5 %) and far from a pipeline's or a tree's
    # balance. Counted as two-way, that server kept the set from any grid and the job went unrecognised
    from rankscope.analysis.fabric.heavy_links import heavy_edges, peel_servers

    hosts = [f"10.0.0.{i}" for i in range(1, 9)]
    writes, mixed = ["10.0.0.9", "10.1.0.10", "10.0.0.11"], "10.1.0.12"
    cycle = [(hosts[i], hosts[i + 1], 3.8e9, 3.8e9, 10 + i, 500 - i) for i in range(7)]
    cycle.append((hosts[0], hosts[7], 1.9e9, 1.9e9, 10, 500))
    rows = cycle + [(h, s, 1.0e9 + 1e8 * i, 3e6, 50, 50) for i, h in enumerate(hosts) for s in writes]
    back = [0.15, 0.25, 0.0, 0.8, 0.2, 0.76, 0.14, 0.2]
    rows += [(h, mixed, 1.4e9, 1.4e9 * r, 50, 50) for h, r in zip(hosts, back)]
    servers = writes + [mixed]
    rows += [(s, t, 3e8, 2.9e8, 70, 70) for i, s in enumerate(servers) for t in servers[i + 1:]]
    e = directed_edges(rows)
    assert not fit_grid(hosts + servers, e, FlowConfig()).valid
    assert peel_servers(e, FlowConfig()) == set(servers)
    heavy = heavy_edges(e)
    assert endpoints(heavy) == set(hosts)
    fit = fit_grid(hosts, heavy, FlowConfig())
    assert fit.valid and [len(p) for p in fit.pipelines] == [8]


def test_ring_hosts_that_also_use_storage_are_not_peeled_as_storage_servers():
    # dev corpus (seed 1): a DP4 x TP2 ring job on two rails, 1 in 1,000 packets sampled, whose hosts read
    # from and write to five storage servers (a5, a7, a9, b6, b8) that replicate among themselves, 100x
    # lighter than the ring links. A ring host's links are all one-way, like a server's: two hosts were
    # peeled with the servers and the job went unrecognised. Its two heaviest links (one in, one out, an
    # order of magnitude over the rest) are a ring member's.
    # (a, b, payload a->b, b->a, first a->b, first b->a in ms, payload samples)
    rows = [
        ("a1", "a2", 6.95e10, 0, 484, None, 16777), ("a1", "a4", 0, 6.8e10, None, 488, 16423),
        ("a1", "a5", 1.24e8, 0, 2827, 2827, 30), ("a1", "b6", 2.95e8, 1.08e8, 2825, 0, 97),
        ("a2", "a3", 6.81e10, 0, 484, None, 16447), ("a2", "a5", 2.16e8, 3.73e8, 2825, 0, 142),
        ("a2", "a7", 7.05e7, 0, 2828, 2828, 17), ("a2", "a9", 1.16e8, 0, 2824, 2824, 28),
        ("a3", "a4", 6.85e10, 0, 488, None, 16551), ("a3", "a5", 8.71e7, 2.78e8, 2825, 0, 88),
        ("a3", "a9", 2.12e8, 0, 2825, 2825, 51), ("a3", "b6", 9.96e7, 0, 2827, 2827, 24),
        ("a4", "a7", 0, 6.26e8, 0, 0, 151), ("a4", "b8", 3.98e8, 0, 2827, 2827, 96),
        ("a5", "b2", 0, 1.29e8, 2827, 2827, 31), ("a7", "b1", 0, 1.24e8, 2824, 2824, 30),
        ("a7", "b2", 0, 1.04e8, 2824, 2824, 25), ("a7", "b3", 0, 9.54e7, 2828, 2828, 23),
        ("a9", "b3", 0, 9.13e7, 2825, 2825, 22), ("a9", "b4", 0, 2.2e8, 2824, 2824, 53),
        ("b1", "b2", 6.85e10, 0, 484, None, 16538), ("b1", "b4", 0, 6.8e10, None, 488, 16426),
        ("b1", "b8", 2.57e8, 0, 2827, 2827, 62), ("b2", "b3", 6.84e10, 0, 484, None, 16526),
        ("b2", "b6", 1.04e8, 0, 2824, 2824, 25), ("b2", "b8", 1.16e8, 0, 2828, 2828, 28),
        ("b3", "b4", 6.91e10, 0, 488, None, 16684), ("b3", "b6", 1.16e8, 0, 2824, 2824, 28),
        ("b3", "b8", 9.54e7, 0, 2824, 2824, 23), ("b4", "b6", 1.78e8, 0, 2828, 2828, 43),
        ("a5", "a7", 7.22e8, 0, 224, 224, 174), ("a5", "a9", 0, 6.3e8, 224, 224, 152),
        ("a5", "b6", 7.13e8, 0, 224, 224, 172), ("a5", "b8", 0, 7.92e8, 224, 224, 191),
        ("a7", "a9", 6.97e8, 0, 225, 225, 168), ("a7", "b6", 0, 6.8e8, 224, 224, 164),
        ("a7", "b8", 6.89e8, 0, 224, 224, 166), ("a9", "b6", 7.3e8, 0, 224, 572, 176),
        ("a9", "b8", 0, 6.51e8, 224, 224, 157), ("b6", "b8", 7.76e8, 0, 224, 224, 187)]
    from rankscope.analysis.fabric.heavy_links import heavy_edges, storage_shaped

    ms = 1_000_000
    e = directed_edges([(a, b, float(x), float(y), None if f is None else f * ms, None if g is None else g * ms)
                   for a, b, x, y, f, g, _ in rows]).with_columns(data_samples=pl.Series([r[6] for r in rows]))
    hosts = {f"{r}{i}" for r in "ab" for i in range(1, 5)}
    assert endpoints(heavy_edges(e)) == hosts
    shaped = storage_shaped(e)
    assert set(shaped.filter(pl.col("server"))["n"]) <= {"a5", "a7", "a9", "b6", "b8"}


def test_rails_whose_records_last_the_whole_job_line_up_by_their_opens():
    """Dev corpus (seed 4): an exporter whose active timeout outlasts the job writes one record per
    connection. Two rails of one job then show two instants each: opens in the same millisecond tick,
    closes 16 ms apart (the last reduction ends later on one rail). Opens and closes together correlate
    at 0.47 and the rails were reported as two jobs; the opens alone line up. A job that starts 100 ms
    later is no rail of it."""
    rows = []
    for c, (start, end) in enumerate([(260, 7752), (260, 7768), (360, 7852)]):
        for k in range(12):
            rows.append((c, start * 1_000_000, (end + (k % 2)) * 1_000_000, 1e9))
    f = pl.DataFrame(rows, schema=["c", "start_ns", "end_ns", "est_bytes"], orient="row")
    # the two rails alone span the window: their bytes, spread over the records, are flat
    corr, _ = rail_correlations(f.filter(pl.col("c") < 2), [0, 1], FlowConfig(), 1_000_000)
    assert corr[(0, 1)][0] >= 0.8
    corr, _ = rail_correlations(f.filter(pl.col("c") != 1), [0, 2], FlowConfig(), 1_000_000)
    assert corr[(0, 2)][0] < 0.8


def test_two_hosts_and_their_replicating_servers_are_no_job_either_way():
    # dev corpus (seed 2): a 2-host pipeline (9.8 GB both ways) whose hosts write a checkpoint to the
    # servers and read from them (one-way and lopsided links), three servers replicating to each other both
    # ways (3.1 GB a pair). The hosts, two of three links one-way, were peeled as servers and the servers'
    # triangle was named a 3-stage pipeline at 0.99. The "servers" peeled have fewer links than the rest
    # and a heavier link among themselves: neither reading is claimed
    from rankscope.analysis.fabric.heavy_links import heavy_edges, peel_servers

    everyone = JOB_OR_STORAGE_HOSTS + JOB_OR_STORAGE_SERVERS
    e = directed_edges([(a, b, ab, ba, 50, 50) for a, b, ab, ba in job_or_storage_links()])
    assert not fit_grid(everyone, e, FlowConfig()).valid
    assert peel_servers(e, FlowConfig()) == set(everyone)
    assert heavy_edges(e).is_empty()
    # with replication a tenth as heavy the hosts are still the ones peeled (their links' shape) and the
    # triangle was still named; their link outweighs the triangle's as before: neither
    light = job_or_storage_links(replication_scale=0.1)
    assert heavy_edges(directed_edges([(a, b, ab, ba, 50, 50) for a, b, ab, ba in light])).is_empty()


def test_more_servers_than_hosts_are_peeled_when_they_have_no_balanced_link():
    # dev corpus (seed 2), its heavy links as measured: a 2-host pipeline (1.6 GB both ways) whose hosts
    # write a checkpoint to three or four servers and read from one (one-way or lopsided), six servers
    # replicating one way round a mesh (120-150 MB a link). The hosts, three of four links one-way, looked
    # like servers too; the most-linked-first peel took three servers and left a path of one-way links:
    # unrecognised. No server has a balanced link; both hosts do
    from rankscope.analysis.fabric.heavy_links import heavy_edges, peel_servers

    a1, a2, a3, a5, a7 = (f"10.0.0.{i}" for i in (1, 2, 3, 5, 7))
    b4, b6, b8 = (f"10.1.0.{i}" for i in (4, 6, 8))
    links = [(a1, a2, 8.02e8, 8.17e8), (a1, a5, 1.13e9, 0), (a1, b6, 6.96e8, 0), (a2, b6, 5.18e8, 8.21e7),
             (a2, a5, 5.33e8, 0), (a2, b8, 5.04e8, 0), (a1, b8, 0, 2.59e8), (a2, a7, 2.47e8, 0),
             (b6, b8, 1.46e8, 0), (a7, b6, 0, 1.35e8), (a3, b8, 0, 1.35e8), (a3, a5, 1.34e8, 0),
             (a3, b4, 1.3e8, 0), (a5, b6, 1.28e8, 0), (b4, b6, 1.28e8, 0), (a3, a7, 0, 1.28e8),
             (b4, b8, 0, 1.28e8), (a7, b8, 1.27e8, 0), (a5, b4, 0, 1.24e8), (a5, a7, 1.23e8, 0)]
    e = directed_edges([(a, b, ab, ba, 50, 50) for a, b, ab, ba in links])
    servers = {a3, a5, a7, b4, b6, b8}
    assert not fit_grid(sorted(servers | {a1, a2}), e, FlowConfig()).valid
    assert peel_servers(e, FlowConfig()) == servers
    assert endpoints(heavy_edges(e)) == {a1, a2}


def test_a_server_trading_balanced_payload_with_one_client_is_peeled_in_a_second_pass():
    # dev corpus (seed 4), heavy links as measured: a 2-stage pipeline on two rails (h1-h2, g1-g2) whose
    # hosts write to six servers replicating one way; server s03 also reads and writes with g1 in balance
    # (0.71). The one-way peel leaves s03, which then joins the rails in a set no grid fits; among that
    # rest its other links are one-way and it has the storage shape. Was unrecognised
    from rankscope.analysis.fabric.heavy_links import heavy_edges, peel_servers

    h1, h2, g1, g2, s03, s05, s07, s14, s16, s18 = (
        "10.0.0.1", "10.0.0.2", "10.1.0.1", "10.1.0.2", "10.0.0.3", "10.0.0.5", "10.0.0.7", "10.1.0.4",
        "10.1.0.6", "10.1.0.8")
    links = [(h1, h2, 5.74e8, 5.51e8), (g1, g2, 5.45e8, 5.42e8), (g1, s16, 5.19e8, 0), (h1, s03, 5.16e8, 0),
             (g1, s14, 4.95e8, 0), (g2, s14, 4.74e8, 0), (h2, s07, 4.63e8, 0), (s03, g1, 2.37e8, 1.68e8),
             (h1, s05, 3.21e8, 0), (h2, s03, 2.18e8, 6.97e7), (s03, g2, 0, 2.32e8), (s07, g2, 0, 2.31e8),
             (h2, s14, 2.28e8, 0), (h2, s16, 2.24e8, 0), (h2, s05, 2.23e8, 0), (s05, g2, 0, 2.13e8),
             (g2, s16, 2.04e8, 0), (s05, g1, 0, 1.69e8), (h1, s18, 1.64e8, 0), (h1, s16, 1.63e8, 0),
             (h1, s14, 1.53e8, 0), (s05, s14, 0, 1.53e8), (s05, s16, 1.52e8, 0), (s03, s14, 1.52e8, 0),
             (s07, s16, 0, 1.51e8), (s14, s16, 1.48e8, 0), (s16, s18, 1.48e8, 0), (s03, s07, 0, 1.46e8),
             (s05, s07, 1.45e8, 0), (s03, s18, 0, 1.45e8), (s14, s18, 0, 1.4e8), (s03, s05, 1.39e8, 0),
             (s07, s18, 1.32e8, 0)]
    e = directed_edges([(a, b, ab, ba, 50, 50) for a, b, ab, ba in links])
    servers = {s03, s05, s07, s14, s16, s18}
    assert not fit_grid(sorted(servers | {h1, h2, g1, g2}), e, FlowConfig()).valid
    assert peel_servers(e, FlowConfig()) == servers
    assert endpoints(heavy_edges(e)) == {h1, h2, g1, g2}


def test_a_rail_whose_host_reads_more_from_a_server_than_from_its_peer_stays():
    # a storage server that eight hosts of another job write to (one-way), and two hosts of a 2-stage
    # pipeline trading 0.25 GB both ways, one of which also trades 0.87 GB with the server (dev corpus seed 6:
    # the pair's link was taken for a light pendant of that host, whose busiest link was the server's, and the
    # job was found one rail short)
    from rankscope.analysis.fabric.heavy_links import heavy_edges

    writers = [(f"w{i}", "srv", 1.2e9, 1.5e6, 10, 10) for i in range(8)]
    ring = [(f"w{i}", f"w{(i + 1) % 8}", 4e9, 4e9, 10, 10) for i in range(8)]
    rail = [("h1", "h2", 1.25e8, 1.25e8, 10, 12), ("h1", "srv", 7.0e8, 1.7e8, 10, 10)]
    heavy = heavy_edges(directed_edges(writers + ring + rail))
    pairs = {frozenset(x) for x in heavy.select("a", "b").iter_rows()}
    assert frozenset(("h1", "h2")) in pairs
    assert not any("srv" in p for p in pairs)
    # with no server the same light link off a host's heavy one is still a pendant (a control host)
    pend = heavy_edges(directed_edges(ring + [("w0", "ctl", 1e8, 1e8, 10, 10)]))
    assert "ctl" not in endpoints(pend)


def test_an_unconfirmed_multiple_is_said_in_the_steps_doubt():
    from rankscope.analysis.strategy.flows.steps import _period_doubt

    no_timer = {"timer_cut": False, "coverage": 0.0}
    why = _period_doubt({"weak": True, "unconfirmed_multiple": 3}, no_timer, 0.1, 0.1)
    assert "every 3 periods" in why and "too few times" in why
    assert _period_doubt({"weak": False}, no_timer, 0.1, 0.1) is None
