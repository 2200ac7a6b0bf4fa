"""Each realism option of the simulator puts its property into the records, and truth stays exact."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from rankscope.collectors.errors import ConfigError
from rankscope.collectors.schema import validate
from rankscope.datasets.sim.corpus import corpus_fabrics
from rankscope.datasets.sim.network.noise import wild_background
from rankscope.datasets.simulator import Realism, SimConfig, fabric_seed, simulate, simulate_fabric

BASE = dict(dp=4, pp=2, tp=2, gpus_per_host=2, steps=3, microbatches=4, layers=8, seed=5, gemm_records=False)


def _flows(**realism) -> tuple[pl.DataFrame, dict]:
    res = simulate(SimConfig(**BASE, realism=Realism(**realism)))
    return pl.from_arrow(res.tables["flow"]), res.truth


@pytest.fixture(scope="module")
def ideal():
    return _flows()


def test_defaults_stay_idealised(ideal):
    f, truth = ideal
    assert f["protocol"].unique().to_list() == [17] and f["dst_port"].unique().to_list() == [4791]
    assert f["dst_qp"].null_count() == f.height
    assert all(e.startswith("10.255.") for e in f["exporter"].unique())
    # every record goes from lower to higher ring neighbour or down a pipeline: no record has a twin
    # in the opposite direction at the same start
    assert truth["ranks_per_address"] == 1 and truth["flows"]["reverse_flows"] is False


def test_roce_reverse_flows_exist_are_small_and_start_first(ideal):
    f, _ = _flows(reverse=True, ack_every=16)
    base, _ = ideal
    assert f.height > base.height
    data = f.group_by("src_addr", "dst_addr").agg(pl.col("size_bytes").sum(), pl.col("start_ns").min())
    both = data.join(data, left_on=["src_addr", "dst_addr"], right_on=["dst_addr", "src_addr"], suffix="_rev")
    # PP sends activations down and gradients up, so pairs carry data both ways: compare with the
    # idealised job's bytes to find the added ACK/CTS traffic
    added = f["size_bytes"].sum() - base["size_bytes"].sum()
    assert 0 < added < 0.02 * base["size_bytes"].sum()
    assert both.height == data.height  # every pair now has traffic in both directions
    # a pair that carried data one way only (a ring direction) now has a tiny reverse flow
    one_way = base.group_by("src_addr", "dst_addr").len()
    rev_only = data.join(one_way, on=["src_addr", "dst_addr"], how="anti")
    assert rev_only.height > 0
    fwd = data.rename({"src_addr": "dst_addr", "dst_addr": "src_addr"})
    j = rev_only.join(fwd, on=["src_addr", "dst_addr"], suffix="_data")
    assert (j["size_bytes"] < 0.02 * j["size_bytes_data"]).all()
    assert (j["start_ns"] <= j["start_ns_data"]).all()


def test_roce_acks_leave_from_other_queue_pairs_than_the_reverse_data():
    # NCCL's connections are one-way: B's ACKs and CTS for A's data go out on the QPs of A's connection,
    # B's own data to A on the QPs of its own, so a pipeline link's reverse ACKs are records of their own
    f, _ = _flows(reverse=True, ack_every=16, dst_qp=True)
    f = f.with_columns(payload=pl.col("size_bytes") / pl.col("num_packets") > 1000)
    per_qp = f.group_by("src_addr", "dst_addr", "src_port", "dst_qp").agg(data=pl.col("payload").any(),
                                                                           acks=(~pl.col("payload")).any())
    assert not (per_qp["data"] & per_qp["acks"]).any()  # no 5-tuple mixes payload and ACKs
    # pairs that carry payload both ways (pipeline links) also carry ACK flows both ways
    both = per_qp.group_by("src_addr", "dst_addr").agg(pl.col("data").any(), pl.col("acks").any())
    two_way = both.join(both, left_on=["src_addr", "dst_addr"], right_on=["dst_addr", "src_addr"], suffix="_rev")
    assert two_way.filter(pl.col("data") & pl.col("data_rev")).height > 0
    assert two_way.filter(pl.col("data") & pl.col("data_rev"))["acks"].all()


def test_tcp_opens_both_directions_together_with_small_handshakes():
    res = simulate(SimConfig(**BASE, idle_timeout_s=0.1, realism=Realism(transport="tcp", mtu=8948)))
    f, truth = pl.from_arrow(res.tables["flow"]), res.truth
    assert f["protocol"].unique().to_list() == [6] and truth["flows"]["protocol"] == "tcp"
    conn = f.with_columns(a=pl.min_horizontal("src_addr", "dst_addr"), b=pl.max_horizontal("src_addr", "dst_addr"))
    per = conn.group_by("a", "b", pl.min_horizontal("src_port", "dst_port").alias("lo"),
                        pl.max_horizontal("src_port", "dst_port").alias("hi")).agg(
        pl.col("src_addr").n_unique().alias("dirs"), pl.col("start_ns").min().alias("t0"),
        pl.col("start_ns").filter(pl.col("src_addr") == pl.col("a")).min().alias("ta"),
        pl.col("start_ns").filter(pl.col("src_addr") == pl.col("b")).min().alias("tb"))
    assert (per["dirs"] == 2).all()
    assert ((per["ta"] - per["tb"]).abs() < 100_000).all()  # both directions start within the handshake
    first = f.sort("start_ns").group_by("src_addr", "dst_addr", "src_port", "dst_port").first()
    assert (first["size_bytes"] <= 200).all() and (first["num_packets"] <= 2).all()
    assert (first["start_ns"] < truth["start_ns"]).all()  # set-up precedes the job's first step


def test_tcp_mesh_connects_every_pair_of_a_group():
    kw = dict(BASE, dp=8, pp=1, tp=1, gpus_per_host=1, idle_timeout_s=0.1)
    ring = pl.from_arrow(simulate(SimConfig(**kw, realism=Realism(transport="tcp"))).tables["flow"])
    mesh = pl.from_arrow(simulate(SimConfig(**kw, realism=Realism(transport="tcp", tcp_mesh=True))).tables["flow"])

    def pairs(f):
        return set(zip(f["src_addr"], f["dst_addr"]))

    assert len(pairs(ring)) == 2 * 8 and len(pairs(mesh)) == 8 * 7
    extra = mesh.filter(~pl.struct("src_addr", "dst_addr").is_in(ring.select(pl.struct("src_addr", "dst_addr"))
                                                                  .to_series().implode()))
    assert extra.height and (extra["size_bytes"] <= 200).all()


def test_tcp_connections_close_when_the_first_of_their_ends_exits():
    # a real gloo pipeline's whole-job records ended at the teardown, in the order its processes exited
    kw = dict(BASE, dp=1, pp=4, tp=1, gpus_per_host=1, idle_timeout_s=60.0, active_timeout_s=60.0)
    open_ = pl.from_arrow(simulate(SimConfig(**kw, realism=Realism(transport="tcp"))).tables["flow"])
    closed = pl.from_arrow(simulate(SimConfig(**kw, realism=Realism(transport="tcp", close_lag_s=0.5))).tables["flow"])
    conn = ["src_addr", "dst_addr", "src_port", "dst_port"]

    def ends(f):
        return f.group_by(conn).agg(end=pl.col("end_ns").max(), n=pl.len()).sort(conn)

    a, b = ends(open_), ends(closed)
    assert a.select(conn).equals(b.select(conn))  # the same connections, no new ones
    lag = b["end"] - a["end"]
    # every connection's last record runs on to its teardown, 0.5 s after the last data and more
    assert (lag >= 0.45e9).all() and lag.min() < lag.max()
    # whole-job records: the teardown joins the last record rather than making one of its own
    assert (a["n"] == b["n"]).all()
    with pytest.raises(ConfigError, match="close_lag_s"):
        Realism(close_lag_s=-1.0)


def test_tcp_records_carry_the_flags_of_their_packets_and_roce_records_none():
    # SYN in the handshake's record, FIN in the teardown's, ACK on every TCP record; the exporter ORs them
    kw = dict(BASE, dp=1, pp=4, tp=1, gpus_per_host=1, idle_timeout_s=1.0, active_timeout_s=60.0)
    tcp = pl.from_arrow(simulate(SimConfig(**kw, realism=Realism(transport="tcp", close_lag_s=2.0))).tables["flow"])
    flags = tcp["tcp_flags"]
    assert flags.is_not_null().all() and ((flags & 0x10) > 0).all()
    # the set-up (2 s ahead) and the teardown (2 s after) are records of their own past the 1 s idle timeout
    syn, fin = tcp.filter((pl.col("tcp_flags") & 0x02) > 0), tcp.filter((pl.col("tcp_flags") & 0x01) > 0)
    data = tcp.filter((pl.col("tcp_flags") & 0x03) == 0)
    assert syn.height and fin.height and data.height
    assert syn["end_ns"].max() < data["start_ns"].min() and fin["start_ns"].min() > data["end_ns"].max()
    roce = pl.from_arrow(simulate(SimConfig(**kw, realism=Realism(transport="roce"))).tables["flow"])
    assert roce["tcp_flags"].is_null().all()


def test_millisecond_timestamps():
    f, truth = _flows(timestamp_ns=1_000_000)
    assert f.height and (f["start_ns"] % 1_000_000 == 0).all() and (f["end_ns"] % 1_000_000 == 0).all()
    assert truth["flows"]["timestamp_ns"] == 1_000_000


def test_exporters_per_pod_and_rail_with_independent_offsets(ideal):
    kw = dict(hosts_per_pod=2, exporter_offset_ms=3.0)
    f, truth = _flows(**kw)
    plain, _ = _flows(hosts_per_pod=2)
    exps = sorted(f["exporter"].unique())
    assert len(exps) == 4 * 2  # 8 hosts of 2 GPUs in pods of 2 hosts: 4 pods x 2 rails
    offs = truth["exporter_offsets_ns"]
    assert set(exps) <= set(offs) and len({offs[e] for e in exps}) == len(exps)
    # each exporter's records are shifted by its own offset
    a = f.sort("exporter", "src_addr", "dst_addr", "src_port", "start_ns")
    b = plain.sort("exporter", "src_addr", "dst_addr", "src_port", "start_ns")
    shift = (a["start_ns"] - b["start_ns"]).to_frame("d").with_columns(a["exporter"])
    per = shift.group_by("exporter").agg(pl.col("d").min(), pl.col("d").max().alias("hi"))
    assert (per["d"] == per["hi"]).all()
    assert {r["exporter"]: r["d"] for r in per.iter_rows(named=True)} == {e: offs[e] for e in exps}


def test_rail_jitter_desynchronises_rail_copies():
    def first_starts(f):
        f = f.with_columns(rail=pl.col("src_addr").str.split(".").list.get(1))
        return f.group_by("rail").agg(pl.col("start_ns").sort()).sort("rail")["start_ns"].to_list()

    kw = dict(BASE, jitter=0.0, launch_ns=0.0)  # no compute or launch noise: only the rails can differ
    r0, r1 = first_starts(pl.from_arrow(simulate(SimConfig(**kw)).tables["flow"]))
    assert r0 == r1  # idealised: the two rails' records start together
    j0, j1 = first_starts(pl.from_arrow(simulate(SimConfig(**kw, realism=Realism(rail_jitter_us=50.0)))
                                        .tables["flow"]))
    assert len(j0) == len(j1) and np.mean(np.array(j0) != np.array(j1)) > 0.9


def test_several_ranks_per_address_tcp_ports_tell_them_apart():
    cfg = dict(BASE, gpus_per_host=2)
    res = simulate(SimConfig(**cfg, realism=Realism(transport="tcp", ranks_per_address=2)))
    t, f = res.truth, pl.from_arrow(res.tables["flow"])
    addrs = list(t["endpoints"].values())
    assert len(set(addrs)) == len(addrs) // 2 and t["ranks_per_address"] == 2
    assert sorted(t["address_slot"].values()) == [0] * (len(addrs) // 2) + [1] * (len(addrs) // 2)
    # data between two addresses runs over one connection per rank pair: two distinct port pairs
    heavy = f.filter(pl.col("size_bytes") > 10_000)
    pairs = heavy.group_by("src_addr", "dst_addr").agg(pl.struct("src_port", "dst_port").n_unique().alias("n"))
    assert (pairs["n"] >= 2).all()
    # truth stays exact: ranks of one address are TP peers on one host
    for a in t["endpoints"].values():
        peers = [q for q, b in t["endpoints"].items() if b == a]
        assert any(sorted(map(str, g)) == sorted(peers) for g in t["tp_groups"])


def test_several_ranks_per_address_roce_dst_qp():
    res = simulate(SimConfig(**BASE, realism=Realism(ranks_per_address=2, dst_qp=True)))
    f = pl.from_arrow(res.tables["flow"])
    assert f["dst_qp"].null_count() == 0
    # QP numbers of one address fall in one block per rank
    blocks = f.group_by("dst_addr").agg((pl.col("dst_qp") // 0x4000).n_unique().alias("ranks"))
    assert (blocks["ranks"] == 2).all()


def test_tree_all_reduce_is_the_double_binary_tree():
    # NCCL has no single-tree all-reduce: two complementary trees, so no member hangs on one link
    # (a single tree of 8 is 7 links with leaves of degree 1); the flag only names it
    kw = dict(dp=8, pp=1, tp=1, gpus_per_host=1, steps=2, layers=8, seed=2, algorithm="tree", gemm_records=False)
    plain = pl.from_arrow(simulate(SimConfig(**kw)).tables["flow"])
    named = pl.from_arrow(simulate(SimConfig(**kw, realism=Realism(double_tree=True))).tables["flow"])

    def links(f):
        return {tuple(sorted(p)) for p in zip(f["src_addr"], f["dst_addr"])}

    assert links(plain) == links(named)
    assert len(links(plain)) >= 8
    degree = {}
    for a, b in links(plain):
        degree[a] = degree.get(a, 0) + 1
        degree[b] = degree.get(b, 0) + 1
    assert min(degree.values()) >= 2


def test_wild_background_uses_arbitrary_ports_and_servers_on_the_rails():
    res = simulate(SimConfig(**BASE))
    bg, truth = wild_background([res], res.config.start_ns, np.random.default_rng(3), first_free_host=8,
                                hosts_per_pod=4)
    kinds = {e["kind"] for e in truth}
    assert kinds == {"storage", "checkpoint", "rendezvous", "replication", "monitoring"}
    ports = {e["port"] for e in truth}
    assert not ports & {2049, 29500} and len(ports) >= 4
    servers = set(truth[0]["servers"])
    repl = bg.filter(pl.col("bytes") > 0).with_columns(
        s=pl.col("src_addr"), d=pl.col("dst_addr"))
    to_int = {a: sum(int(x) << (8 * (3 - i)) for i, x in enumerate(a.split("."))) for a in servers}
    srv = set(to_int.values())
    assert repl.filter(pl.col("s").is_in(list(srv)) & pl.col("d").is_in(list(srv))).height > 0
    assert all(a.startswith("10.") and not a.startswith("10.200.") for a in servers)


def test_kineto_records_have_no_layout_columns():
    res = simulate(SimConfig(**BASE, flows=False, realism=Realism(kineto_records=True)))
    comm = pl.from_arrow(res.tables["comm_op"])
    assert "endpoint_map" not in res.tables
    for c in ("group_id", "group_ranks", "seq", "step"):
        assert comm[c].null_count() == comm.height
    assert not validate(res.tables["comm_op"], "comm_op").rejects
    assert res.truth["layout_columns"] is False and res.truth["dp_groups"]


def test_fabric_stream_comes_from_the_job_seeds_not_a_counter():
    a = [SimConfig(job="a", **dict(BASE, seed=1))]
    b = [SimConfig(job="a", **dict(BASE, seed=2))]
    assert fabric_seed(a) != fabric_seed(b) and fabric_seed(a) == fabric_seed(list(a))
    fa = simulate_fabric(a)
    assert fa.truth["fabric"]["seed"] == fabric_seed(a)


def test_corpus_has_every_kind_of_job_and_seeds_do_not_repeat():
    fabs = list(corpus_fabrics(11, 60, 4096))
    cfgs = [c for f in fabs for c in f.configs]
    assert len(cfgs) == 60 and all(8 <= c.world_size <= 4096 for c in cfgs)
    assert any(c.dp == 1 and c.tp == 1 and c.pp > 1 for c in cfgs)  # pure PP
    assert any(c.pp == 1 and c.dp >= 8 for c in cfgs)  # pure DP
    assert {c.realism.transport for c in cfgs} == {"roce", "tcp"}
    assert any(c.realism.ranks_per_address > 1 for c in cfgs) and any(c.algorithm == "tree" for c in cfgs)
    other = [c.seed for f in corpus_fabrics(12, 60, 4096) for c in f.configs]
    assert not set(other) & {c.seed for c in cfgs}


def test_bad_realism_is_a_config_error():
    with pytest.raises(ConfigError, match="transport"):
        Realism(transport="infiniband")
    with pytest.raises(ConfigError, match="ranks_per_address"):
        SimConfig(**dict(BASE, gpus_per_host=2), realism=Realism(ranks_per_address=4))
    assert dataclasses.replace(Realism(), timestamp_ns=1000).timestamp_ns == 1000


def test_everything_on_writes_a_valid_store(tmp_path):
    from rankscope.collectors.store import Store
    from rankscope.datasets.simulator import write_store

    r = Realism(transport="tcp", timestamp_ns=1_000_000, hosts_per_pod=2, exporter_offset_ms=2.0,
                rail_jitter_us=20.0, ranks_per_address=2, wild_background=True, kineto_records=True, tcp_mesh=True)
    fab = simulate_fabric([SimConfig(job="a", **BASE, realism=r)])
    assert not validate(fab.flow, "flow").rejects
    write_store(fab, tmp_path / "s")
    assert Store(tmp_path / "s").count("flow", "fabric") == fab.flow.num_rows


def test_fabric_exporter_offsets_in_truth_are_the_ones_applied():
    cfgs = [SimConfig(job="a", **BASE, realism=Realism(hosts_per_pod=2))]
    shifted = simulate_fabric(cfgs, background=False, realism=Realism(hosts_per_pod=2, exporter_offset_ms=4.0))
    plain = simulate_fabric(cfgs, background=False, realism=Realism(hosts_per_pod=2))
    a = pl.from_arrow(shifted.flow).sort("exporter", "src_addr", "dst_addr", "src_port", "end_ns")
    b = pl.from_arrow(plain.flow).sort("exporter", "src_addr", "dst_addr", "src_port", "end_ns")
    d = a.select("exporter", (a["start_ns"] - b["start_ns"]).alias("d")).group_by("exporter").agg(
        pl.col("d").min(), pl.col("d").max().alias("hi"))
    offs = shifted.truth["fabric"]["exporter_offsets_ns"]
    assert (d["d"] == d["hi"]).all() and all(offs[e] == x for e, x in zip(d["exporter"], d["d"]))
    assert shifted.truth["jobs"]["a"]["exporter_offsets_ns"] == {e: offs[e] for e in
                                                                shifted.truth["jobs"]["a"]["exporters"]}
    assert len(set(offs.values())) == len(offs) > 2


def test_scattered_host_order_permutes_addresses_and_truth_follows():
    from rankscope.datasets.sim.topology import nic_address

    kw = dict(BASE, dp=2, pp=4, tp=1, gpus_per_host=1, seed=7)
    plain = simulate(SimConfig(**kw))
    res = simulate(SimConfig(**kw, realism=Realism(host_order="scattered")))
    t, t0 = res.truth, plain.truth
    assert t["host_order"] == "scattered" and t0["host_order"] == "rank"
    # the same address slots, given to other ranks
    assert sorted(t["endpoints"].values()) == sorted(t0["endpoints"].values())
    assert t["endpoints"] != t0["endpoints"]
    # truth stays one consistent picture: each rank's address is its host's NIC, groups by address
    # are the rank groups read through that map, and the flows run between exactly those addresses
    host_of = {r: int(h[4:]) for h, rs in t["hosts"].items() for r in rs}
    assert all(t["endpoints"][str(r)] == nic_address(host_of[r], 0) for r in host_of)
    for axis in ("dp", "pp"):
        assert t[f"{axis}_groups_by_address"] == [[t["endpoints"][str(r)] for r in g] for g in t[f"{axis}_groups"]]
    flow = pl.from_arrow(res.tables["flow"])
    assert set(flow["src_addr"]) | set(flow["dst_addr"]) == set(t["endpoints"].values())
    # rank order: every pipeline's addresses ascend from first stage to last; scattered: not all do
    ascending = [p == sorted(p, key=lambda a: tuple(map(int, a.split(".")))) for p in t["pp_groups_by_address"]]
    assert all(p == sorted(p, key=lambda a: tuple(map(int, a.split(".")))) for p in t0["pp_groups_by_address"])
    assert not all(ascending)
    # the permutation is the job's own: the same seed gives the same hosts
    again = simulate(SimConfig(**kw, realism=Realism(host_order="scattered")))
    assert again.truth["endpoints"] == t["endpoints"]
    with pytest.raises(ConfigError, match="host_order"):
        Realism(host_order="random")


def test_corpus_scatters_a_share_of_its_jobs():
    from rankscope.datasets.sim.corpus import SCATTERED_SHARE

    cfgs = [c for f in corpus_fabrics(11, 60, 4096) for c in f.configs]
    share = np.mean([c.realism.host_order == "scattered" for c in cfgs])
    assert abs(share - SCATTERED_SHARE) < 0.2
    assert len({c.realism.host_order for c in cfgs}) == 2


def test_corpus_lets_some_tcp_jobs_save_a_checkpoint_before_they_close():
    # real jobs often save at the end: longer than an exporter's idle timeout, so the FIN makes a record of
    # its own (strategy.flows.link_dating.ends_dated); drawn apart, so the shorter lags keep their old draws
    from rankscope.datasets.sim.corpus import CHECKPOINT_SAVE_S, CLOSE_LAGS_S

    cfgs = [c for f in corpus_fabrics(11, 120, 4096) for c in f.configs]
    lags = [c.realism.close_lag_s for c in cfgs if c.realism.transport == "tcp" and c.realism.close_lag_s > 0]
    saved = [x for x in lags if x >= min(CHECKPOINT_SAVE_S)]
    assert lags and 0.2 < len(saved) / len(lags) < 0.8
    # a save is added to one of the usual lags
    assert all(any(abs(x - save - lag) < 1e-9 for save in CHECKPOINT_SAVE_S for lag in CLOSE_LAGS_S) for x in saved)
    assert all(c.realism.close_lag_s == 0 for c in cfgs if c.realism.transport != "tcp")
