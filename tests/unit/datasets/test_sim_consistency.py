"""The simulator's done-when checks: records agree with each other and with physics."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from rankscope.collectors.schema import validate
from rankscope.datasets.sim.network.flow_export import HEADER_BYTES
from rankscope.datasets.simulator import Fault, SimConfig, simulate

from .conftest import frames


def test_every_table_fits_its_record_kind(multi_host):
    res, _ = multi_host
    assert set(res.tables) == {"comm_op", "compute_op", "step_mark", "batch_meta", "endpoint_map", "flow"}
    for kind, table in res.tables.items():
        v = validate(table, kind)
        assert not v.rejects, (kind, dict(v.rejects))
        assert table.num_rows > 0, kind
    assert set(pl.from_arrow(res.tables["flow"])["job"]) == {"fabric"}
    assert set(pl.from_arrow(res.tables["comm_op"])["job"]) == {"default"}


def _implied_transfers(comm: pl.DataFrame, host_of: dict[int, str]) -> list[int]:
    """Payload bytes of every inter-host transfer implied by the comm_ops (NCCL ring / p2p), written
    independently of the simulator: a plain loop over records."""
    out = []
    for r in comm.filter(pl.col("state") == "completed").iter_rows(named=True):
        ranks, me, size = r["group_ranks"], r["rank"], r["size_bytes"]
        n = len(ranks)
        if r["op"] == "send":
            pairs = [(r["peer"], size)]
        elif r["op"] == "recv":
            continue
        elif r["op"] == "all_to_all":
            pairs = [(peer, size // n) for peer in ranks if peer != me]
        else:
            nxt = ranks[(ranks.index(me) + 1) % n]
            nbytes = {"all_reduce": 2 * (n - 1) * size // n, "reduce_scatter": (n - 1) * size // n,
                      "all_gather": (n - 1) * size}[r["op"]]
            pairs = [(nxt, nbytes)]
        out += [b for peer, b in pairs if host_of[peer] != host_of[me]]
    return out


def test_flow_bytes_equal_the_bytes_the_comm_ops_imply(multi_host):
    res, f = multi_host
    host_of = dict(zip(f["endpoint_map"]["rank"], f["endpoint_map"]["host"]))
    payloads = _implied_transfers(f["comm_op"], host_of)
    mtu = res.config.mtu
    expected = sum(payloads) + HEADER_BYTES * sum(math.ceil(b / mtu) for b in payloads)
    flow = f["flow"]
    assert flow["size_bytes"].sum() == expected
    assert flow["num_packets"].sum() == sum(math.ceil(b / mtu) for b in payloads)
    assert set(flow["dst_port"]) == {4791} and set(flow["protocol"]) == {17}


def test_flow_bytes_with_zero3_moe_and_context_parallel():
    cfg = SimConfig(dp=2, pp=2, tp=1, ep=2, cp=2, gpus_per_host=2, steps=2, microbatches=2, layers=4,
                    dp_sync="zero3", gemm_records=False, seed=4)
    res = simulate(cfg)
    f = frames(res)
    ops = set(f["comm_op"]["op"])
    assert {"all_to_all", "all_gather", "reduce_scatter", "send", "recv"} <= ops
    host_of = dict(zip(f["endpoint_map"]["rank"], f["endpoint_map"]["host"]))
    payloads = _implied_transfers(f["comm_op"], host_of)
    expected = sum(payloads) + HEADER_BYTES * sum(math.ceil(b / cfg.mtu) for b in payloads)
    assert f["flow"]["size_bytes"].sum() == expected
    g = f["comm_op"].filter(~pl.col("op").is_in(["send", "recv"])).group_by("group_id", "seq").agg(
        pl.col("end_ns").n_unique())
    assert (g["end_ns"] == 1).all()


def test_sampled_flows_estimate_the_implied_bytes():
    cfg = SimConfig(dp=4, pp=2, tp=2, gpus_per_host=4, steps=2, microbatches=4, layers=8, seed=2, sampling=100,
                    gemm_records=False)
    res = simulate(cfg)
    f = frames(res)
    host_of = dict(zip(f["endpoint_map"]["rank"], f["endpoint_map"]["host"]))
    payloads = _implied_transfers(f["comm_op"], host_of)
    expected = sum(payloads) + HEADER_BYTES * sum(math.ceil(b / cfg.mtu) for b in payloads)
    flow = f["flow"]
    assert set(flow["sampling_rate"]) == {100}
    assert flow["size_bytes"].sum() < expected / 50  # exported counts are the sampled ones
    assert abs(flow["est_size_bytes"].sum() / expected - 1) < 0.02


def test_flows_only_between_hosts_on_the_sources_rail(multi_host):
    _, f = multi_host
    ep = f["endpoint_map"]
    host = dict(zip(ep["address"], ep["host"]))
    gpu = dict(zip(ep["address"], ep["gpu"]))
    flow = f["flow"]
    assert all(host[s] != host[d] for s, d in zip(flow["src_addr"], flow["dst_addr"]))
    assert all(e == f"10.255.{gpu[s]}.1/0" for e, s in zip(flow["exporter"], flow["src_addr"]))
    # several queue pairs (source ports) per peer connection
    ports = flow.group_by("src_addr", "dst_addr").agg(pl.col("src_port").n_unique())
    assert ports["src_port"].min() >= 2


def test_members_of_one_collective_finish_together(multi_host):
    _, f = multi_host
    comm = f["comm_op"].filter(~pl.col("op").is_in(["send", "recv"]))
    g = comm.group_by("group_id", "seq").agg(pl.col("end_ns").n_unique().alias("ends"), pl.len().alias("n"),
                                            pl.col("group_ranks").first().list.len().alias("size"),
                                            pl.col("start_ns").min().alias("first"))
    assert g.height > 10
    assert (g["ends"] == 1).all()
    assert (g["n"] == g["size"]).all()
    # a send and its recv complete together too
    p2p = f["comm_op"].filter(pl.col("op").is_in(["send", "recv"]))
    send = p2p.filter(pl.col("op") == "send").select("rank", "peer", "seq", "end_ns")
    recv = p2p.filter(pl.col("op") == "recv").select(pl.col("peer").alias("rank"), pl.col("rank").alias("peer"),
                                                    "seq", pl.col("end_ns").alias("recv_end"))
    j = send.join(recv, on=["rank", "peer", "seq"], how="full")
    assert j.height == send.height == recv.height
    assert (j["end_ns"] == j["recv_end"]).all()


def test_no_rank_compute_stream_overlaps_itself(multi_host):
    _, f = multi_host
    c = f["compute_op"].sort("rank", "stream", "start_ns").with_columns(
        prev_end=pl.col("end_ns").shift(1).over(["rank", "stream"]))
    assert c.filter(pl.col("stream") == 7).height > 0  # kernels are checked too
    assert (c["start_ns"] >= c["prev_end"]).fill_null(True).all()


def test_slow_worker_factor_in_own_compute_and_peers_wait(slow_worker):
    slow, fs, _base, fb = slow_worker
    c = fs["compute_op"].filter(pl.col("category").is_in(["forward", "backward"])).with_columns(
        dur=pl.col("end_ns") - pl.col("start_ns"))
    stage1 = c.filter(pl.col("stage") == 1)
    own = stage1.filter(pl.col("rank") == 5)["dur"].mean()
    peers = stage1.filter(pl.col("rank") != 5)["dur"].mean()
    assert abs(own / peers - 1.5) < 0.03
    # its data-parallel peers (4, 6, 7) wait in the gradient all_reduce for rank 5
    ar = fs["comm_op"].filter((pl.col("stream") == "dp") & pl.col("group_ranks").list.contains(5)).with_columns(
        dur=pl.col("end_ns") - pl.col("start_ns"))
    first = ar.group_by("rank", "step").agg(pl.col("dur").sort_by("seq").first())
    wait_peers = first.filter(pl.col("rank") != 5)["dur"].mean()
    wait_self = first.filter(pl.col("rank") == 5)["dur"].mean()
    per_step = c.filter(pl.col("rank").is_in([4, 5])).group_by("rank", "step").agg(pl.col("dur").sum())
    extra_bwd = (per_step.filter(pl.col("rank") == 5)["dur"].mean() - per_step.filter(pl.col("rank") == 4)["dur"].mean())
    # rank 5 is on the last stage, so its peers wait for all of its extra compute
    assert abs((wait_peers - wait_self) / extra_bwd - 1) < 0.1
    # and the whole job is slower than without the fault
    assert np.mean(slow.truth["step_times_ns"]) > 1.1 * np.mean(_base.truth["step_times_ns"])


def test_hang_leaves_pending_ops_for_ranks_that_joined():
    res = simulate(SimConfig(dp=4, pp=2, steps=3, microbatches=2, layers=4, gemm_records=False, flows=False,
                             faults=(Fault("hang", {"rank": 6}),)))
    comm = pl.from_arrow(res.tables["comm_op"])
    p = res.truth["faults"][0]["params"]
    assert p["step"] == 2
    at = comm.filter((pl.col("group_id") == p["group_id"]) & (pl.col("seq") == p["seq"]))
    assert sorted(at["rank"]) == sorted(set(p["group_ranks"]) - {6})
    assert (at["state"] == "pending").all() and at["end_ns"].null_count() == at.height
    assert comm.filter(pl.col("state") == "pending")["end_ns"].null_count() == comm.filter(
        pl.col("state") == "pending").height
    assert res.truth["completed_steps"] == 2 and len(res.truth["step_times_ns"]) == 2


def test_chunked_replay_equals_whole_replay(monkeypatch):
    import rankscope.datasets.simulator as sim

    # jitter=0: the noise draws (not the timing model) depend on how steps are chunked
    cfg = SimConfig(dp=2, pp=2, tp=2, gpus_per_host=4, steps=4, microbatches=2, layers=4, gemm_records=False,
                    jitter=0.0)
    whole = simulate(cfg)
    monkeypatch.setattr(sim, "CHUNK_OPS", 1)
    chunked = simulate(cfg)
    assert whole.truth["step_times_ns"] == chunked.truth["step_times_ns"]
    a = pl.from_arrow(whole.tables["comm_op"]).sort("rank", "start_ns")
    b = pl.from_arrow(chunked.tables["comm_op"]).sort("rank", "start_ns")
    assert a.select("start_ns", "end_ns").equals(b.select("start_ns", "end_ns"))
