"""Ground truth of a simulated job: the entry of ``truth.json`` every accuracy test checks against.

Layout (shared/design.md)::

    {"capture": <flow capture name>,
     "jobs": {<job>: {"degrees": {...}, "world_size", "rank_order", "schedule", "microbatches",
                      "dp_groups", "pp_groups" (first stage -> last), "tp_groups", "ep_groups", "cp_groups",
                      "<axis>_groups_by_address", "endpoints": {rank: address}, "hosts": {host: [ranks]},
                      "faults": [{"kind": <verdict>, "injected": <cli kind>, "params": {...}}],
                      "step_times_ns": [...], "clock_offsets_ns": {host: ns}, ...}},
     "background": [{"kind": storage|checkpoint|rendezvous, ...}]}
"""

from __future__ import annotations

import numpy as np

from rankscope.datasets.sim.job_config import AXES, SimConfig
from rankscope.datasets.sim.network.transport import rank_exporters
from rankscope.datasets.sim.op_graph import Templates
from rankscope.datasets.sim.stage_ops import OP
from rankscope.datasets.sim.topology import Topology


def fault_truth(cfg: SimConfig, topo: Topology, T: Templates) -> list[dict]:
    out = []
    for f in cfg.faults:
        p = dict(cfg.fault_params(f))
        if f.kind == "gc":
            p["at_steps"] = [s for s in range(cfg.steps) if s % p["every"] == 0]
        if f.kind == "hang":
            dp_row = int(topo.group_of["dp"][p["rank"]])
            s0 = int(T.offset[topo.coord["pp"][p["rank"]]])
            rows = range(s0, s0 + int(T.length[topo.coord["pp"][p["rank"]]]))
            per_step = sum(1 for i in rows if T.stream[i] == 2)
            grads = [i for i in rows if T.name[i].startswith("grad_")]
            p["group_id"] = f"dp{dp_row}"
            p["group_ranks"] = topo.groups["dp"][dp_row].tolist()
            p["seq"] = int(p["step"] * per_step + T.cidx[grads[p["index"]]])
        if f.kind == "seq-skew":
            # compute of one microbatch pass = a * s + b * s^2 flops (forward; backward is twice that)
            fwd = T.op_code == OP["forward"]
            p["a_flops_per_token"] = float(T.lin[fwd].max())
            p["b_flops_per_token2"] = float(T.quad[fwd].max())
        if f.kind == "slow-link":
            p["address"] = topo.addresses[p["rank"]]
        if f.kind in ("dead-link", "misgrouped", "bad-nic"):
            from rankscope.datasets.sim.network.faults import network_fault_truth

            p.update(network_fault_truth(cfg, topo, f.kind, p))
        out.append({"kind": f.verdict, "injected": f.kind, "params": p})
    return out


def job_truth(cfg: SimConfig, topo: Topology, T: Templates, step_end: np.ndarray, t_first: float,
              host_offsets: dict[str, int], exporter_offsets: dict[str, int]) -> dict:
    done = np.isfinite(step_end)
    ends = step_end[done]
    step_times = np.diff(np.r_[t_first, ends]) if len(ends) else np.zeros(0)
    hosts: dict[str, list[int]] = {}
    for r, h in enumerate(topo.host.tolist()):
        hosts.setdefault(topo.host_name(h), []).append(r)
    t = {
        "degrees": {a: getattr(cfg, a) for a in ("dp", "pp", "tp", "ep", "cp")},
        "world_size": topo.world,
        "rank_order": cfg.rank_order,
        "schedule": cfg.schedule,
        "microbatches": cfg.microbatches,
        "virtual_stages": cfg.chunks,
        "steps": cfg.steps,
        "completed_steps": int(done.sum()),
        "dp_sync": cfg.dp_sync,
        "algorithm": cfg.algorithm,
        "gpus_per_host": cfg.gpus_per_host,
        "seed": cfg.seed,
    }
    for a in AXES:
        t[f"{a}_groups"] = topo.group_lists(a)
    for a in AXES:
        t[f"{a}_groups_by_address"] = topo.group_addresses(a)
    if cfg.ep_in_dp:
        # EP carved out of DP: the data-parallel group is the ep x dp ranks; the dp axis reduces the experts
        t["degrees"]["dp"] = cfg.dp * cfg.ep
        t["expert_dp_groups"], t["expert_dp_groups_by_address"] = t["dp_groups"], t["dp_groups_by_address"]
        t["dp_groups"], t["dp_groups_by_address"] = topo.group_lists("dpx"), topo.group_addresses("dpx")
        t["ep_in_dp"] = True
    t["endpoints"] = {str(r): a for r, a in enumerate(topo.addresses)}
    t["hosts"] = hosts
    t["exporters"] = sorted(set(rank_exporters(cfg, topo).to_list()))
    t["faults"] = fault_truth(cfg, topo, T)
    t["step_times_ns"] = [int(round(x)) for x in step_times]
    t["start_ns"] = int(cfg.start_ns + round(t_first))
    t["clock_offsets_ns"] = host_offsets
    t["exporter_offsets_ns"] = exporter_offsets
    r = cfg.realism
    tcp = r.transport == "tcp"
    t["flows"] = {"capture": cfg.capture, "sampling_rate": cfg.sampling, "active_timeout_s": cfg.active_timeout_s,
                  "idle_timeout_s": cfg.idle_timeout_s, "qps_per_peer": 1 if tcp else cfg.qps,
                  "protocol": "tcp" if tcp else "udp", "dst_port": None if tcp else 4791,
                  "reverse_flows": tcp or r.reverse, "timestamp_ns": r.timestamp_ns,
                  "hosts_per_pod": r.hosts_per_pod, "rail_jitter_us": r.rail_jitter_us, "dst_qp": r.dst_qp and not tcp}
    # several ranks per address: the address alone does not name a rank; slot = index on the address
    t["ranks_per_address"] = r.ranks_per_address
    t["address_slot"] = {str(k): int(v) for k, v in enumerate(topo.slot.tolist())} if topo.slot is not None else {}
    t["tree"] = "double"  # algorithm="tree" is always NCCL's double binary tree
    t["layout_columns"] = not r.kineto_records
    # scattered: host (and address) order does not follow the ranks, so address order is not stage order
    t["host_order"] = r.host_order
    return t
