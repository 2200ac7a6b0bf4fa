"""Where every rank sits: parallel coordinates, process groups, hosts, NICs, rails.

Rank order: the config lists the five axes fastest-varying first, so with
Megatron's ``tp-cp-ep-dp-pp`` the tp peers are consecutive ranks and the
pipeline stages are the slowest-varying coordinate.

Fabric: hosts of ``gpus_per_host`` GPUs; GPU g of every host has its own NIC
on leaf switch ("rail") g. NIC address of GPU g on host h (global host index
on the fabric): ``10.<g>.<h // 250>.<h % 250 + 1>``; host name ``host<h:04>``.
Each leaf exports the flows entering it from its host ports, as exporter
``10.255.<g>.1/0``, so every inter-host transfer is exported exactly once.
Traffic inside a host (NVLink) never reaches a switch.

Hosts: rank r sits on the job's host slot ``r // gpus_per_host`` (slots
``host_offset ..``). With ``realism.host_order == "scattered"`` the slots are
permuted (a stream keyed by the job's seed), so a host's address no longer
tells its ranks; every group, address and truth entry follows the permuted hosts. ``SimConfig.host_map``
gives the slots outright (a deliberate placement).

Pods: with ``realism.hosts_per_pod`` host h sits in pod ``h // hosts_per_pod``; a transfer between pods runs
at ``SimConfig.pod_uplink_gbps`` plus ``pod_latency_ns`` (:func:`pod_of`).
"""

from __future__ import annotations

import numpy as np

from rankscope.collectors.record_class import record
from rankscope.datasets.sim.job_config import AXES, SimConfig

STORAGE_EXPORTER = "10.255.100.1/0"


def rail_exporter(rail: int) -> str:
    return f"10.255.{rail}.1/0"


def nic_address(host: int, gpu: int) -> str:
    return f"10.{gpu}.{host // 250}.{host % 250 + 1}"


@record
class Topology:
    """Per-rank coordinates and groups of one job (arrays indexed by rank)."""

    world: int
    coord: dict[str, np.ndarray]
    """axis -> coordinate of each rank on that axis."""
    groups: dict[str, np.ndarray]
    """axis -> (num_groups, size) member ranks, each row ordered by the axis coordinate."""
    group_of: dict[str, np.ndarray]
    """axis -> row of ``groups[axis]`` each rank belongs to."""
    host: np.ndarray
    """global host index (fabric-wide) of each rank."""
    gpu: np.ndarray
    addresses: list[str]
    addr_int: np.ndarray
    """the NIC address as a 32-bit integer (sorts like the address)."""
    cross_host: dict[str, np.ndarray]
    """axis -> per group row, True when its members sit on more than one host."""
    nic: np.ndarray | None = None
    """NIC (= rail) of each rank on its host; GPUs share a NIC when realism.ranks_per_address > 1."""
    slot: np.ndarray | None = None
    """index of each rank among the ranks that share its address (0 with one rank per address)."""

    @property
    def rail(self) -> np.ndarray:
        return self.gpu if self.nic is None else self.nic

    def host_name(self, h: int) -> str:
        return f"host{h:04d}"

    def group_lists(self, axis: str) -> list[list[int]]:
        return self.groups[axis].tolist()

    def group_addresses(self, axis: str) -> list[list[str]]:
        return [[self.addresses[r] for r in row] for row in self.groups[axis].tolist()]


HOST_ORDER_STREAM = 0x4057
"""key of the host permutation's stream, apart from the job's other random streams."""


def host_slots(cfg: SimConfig) -> np.ndarray:
    """Host slot (0-based, before host_offset) of each of the job's hosts, in rank order."""
    n = -(-cfg.world_size // cfg.gpus_per_host)
    if cfg.host_map is not None:  # a given mapping (SimConfig.host_map) wins over the host order
        return np.asarray(cfg.host_map, dtype=np.int64)
    if cfg.realism.host_order != "scattered":
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng([cfg.seed, HOST_ORDER_STREAM]).permutation(n).astype(np.int64)


def pod_of(cfg: SimConfig, host: np.ndarray) -> np.ndarray | None:
    """Pod of each (global) host index, or None on a fabric without pods."""
    hpp = cfg.realism.hosts_per_pod
    return None if hpp <= 0 else np.asarray(host) // hpp


def build_topology(cfg: SimConfig) -> Topology:
    size = {"tp": cfg.tp, "cp": cfg.cp, "ep": cfg.ep, "dp": cfg.dp, "pp": cfg.pp}
    order = cfg.rank_order.split("-")
    stride, s = {}, 1
    for a in order:
        stride[a] = s
        s *= size[a]
    world = cfg.world_size
    ranks = np.arange(world, dtype=np.int64)
    coord = {a: (ranks // stride[a]) % size[a] for a in AXES}
    groups, group_of = {}, {}
    for a in AXES:
        base = ranks[coord[a] == 0]
        groups[a] = base[:, None] + np.arange(size[a])[None, :] * stride[a]
        row_of_base = np.full(world, -1, dtype=np.int64)
        row_of_base[base] = np.arange(len(base))
        group_of[a] = row_of_base[ranks - coord[a] * stride[a]]
    host = cfg.host_offset + host_slots(cfg)[ranks // cfg.gpus_per_host]
    gpu = ranks % cfg.gpus_per_host
    share = cfg.realism.ranks_per_address
    nic, slot = gpu // share, gpu % share
    addresses = [nic_address(int(h), int(g)) for h, g in zip(host, nic)]
    addr_int = (10 << 24) + (nic << 16) + ((host // 250) << 8) + (host % 250 + 1)
    # the whole data-parallel group of an EP-in-DP job: the ranks that differ in ep and dp only, in
    # data-parallel rank order (ep fastest: an EP group is consecutive DP ranks)
    coord["dpx"] = coord["dp"] * cfg.ep + coord["ep"]
    base = ranks[coord["dpx"] == 0]
    groups["dpx"] = (base[:, None] + (np.arange(cfg.dp)[:, None] * stride["dp"]
                                      + np.arange(cfg.ep)[None, :] * stride["ep"]).ravel()[None, :])
    row_of_base = np.full(world, -1, dtype=np.int64)
    row_of_base[base] = np.arange(len(base))
    group_of["dpx"] = row_of_base[ranks - coord["dp"] * stride["dp"] - coord["ep"] * stride["ep"]]
    cross = {a: (host[groups[a]] != host[groups[a][:, :1]]).any(axis=1) for a in groups}
    return Topology(world, coord, groups, group_of, host, gpu, addresses, addr_int, cross, nic, slot)
