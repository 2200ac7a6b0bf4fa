"""Network faults of the traffic view, as the wire and the switches see them.

- ``dead-link``: the link from one NIC to its leaf is down. The NIC is dual-homed (a second port cabled
  to another rail's leaf of its pod, as dual-ToR fabrics do), so its traffic keeps flowing at full rate,
  but its packets enter the fabric at that other leaf: its sent flows are metered by the other leaf's
  exporter (each leaf exports what enters it from its host ports). Flows *to* the NIC are metered where
  they enter, at their senders' leaves, as before. Timing is unchanged (a spine hop more, microseconds).
  ``via``: the backup port's rail (-1: the next rail of the host).
- ``misgrouped``: one rank is put in the wrong data-parallel group, consistently on every rank (the
  group lists are built wrong, so the job runs): it leaves its own group's ring, which closes around it,
  and joins another DP group of the same pipeline stage (the same parameter shapes, so the all-reduce
  sizes match and nothing hangs), at its own DP position in that group's ring. Each ring link then
  carries 2(k-1)/k of the gradient buffer for its ring of k. Timing is the intended grouping's (the two
  rings of one stage run together in any case). ``group``: the row of ``dp_groups`` it joins (-1: the
  next DP group of its stage).
- ``bad-nic``: a NIC whose rate is 1/``factor`` of the others', both directions (a lane down, a bad
  cable or optics). Physically this is what ``slow-link`` already models: every transfer through the
  NIC takes ``factor`` times as long, and every collective the NIC takes part in is paced by it (a ring
  moves at its slowest link). ``bad-nic`` is that model keyed by the NIC: every rank behind the address
  (``realism.ranks_per_address``) is slowed, where ``slow-link`` slows the one rank.
"""

from __future__ import annotations

import numpy as np


def _rails(cfg) -> int:
    return cfg.gpus_per_host // cfg.realism.ranks_per_address


def backup_rail(cfg, topo, p: dict) -> int:
    """The rail whose leaf takes a dead link's traffic."""
    rail = int(topo.rail[p["rank"]])
    return (rail + 1) % _rails(cfg) if p["via"] == -1 else int(p["via"])


def same_stage_rows(topo, row: int) -> list[int]:
    """The DP group rows of ``row``'s pipeline stage, in row order."""
    stage = topo.coord["pp"][topo.groups["dp"][:, 0]]
    return [int(x) for x in np.flatnonzero(stage == stage[row])]


def joined_row(topo, p: dict) -> int:
    """The DP group row a misgrouped rank joins."""
    own = int(topo.group_of["dp"][p["rank"]])
    if p["group"] != -1:
        return int(p["group"])
    rows = same_stage_rows(topo, own)
    return rows[(rows.index(own) + 1) % len(rows)]


def check_network_fault(cfg, kind: str, p: dict) -> tuple[bool, str]:
    """(ok, what is wrong) for a dead-link or misgrouped fault in this job."""
    from rankscope.datasets.sim.topology import build_topology

    if kind == "dead-link":
        n = _rails(cfg)
        if n < 2:
            return False, "needs a host with two or more NICs (rails) for the backup port"
        via = p["via"]
        if via != -1 and not (isinstance(via, int) and 0 <= via < n):
            return False, f"via must be -1 or a rail in 0..{n - 1}"
        if via != -1 and via == int(build_topology(cfg).rail[p["rank"]]):
            return False, "via must be another rail than the NIC's own"
        return True, ""
    if cfg.dp < 2 or cfg.ep_in_dp:
        return False, "needs dp >= 2 (and no ep_in_dp): a data-parallel ring to leave"
    topo = build_topology(cfg)
    own = int(topo.group_of["dp"][p["rank"]])
    rows = same_stage_rows(topo, own)
    if len(rows) < 2:
        return False, "needs another DP group in the rank's pipeline stage (tp, cp or ep > 1)"
    g = p["group"]
    if g != -1 and (g not in rows or g == own):
        return False, f"group must be -1 or another DP group row of the rank's stage: {[r for r in rows if r != own]}"
    return True, ""


def dp_rings(cfg, topo) -> dict[int, list[int]]:
    """DP group row -> the ranks of its actual ring, for the rows a misgrouped fault changes."""
    rings = {int(r): topo.groups["dp"][r].tolist() for r in range(topo.groups["dp"].shape[0])}
    changed: set[int] = set()
    for f in cfg.faults_of("misgrouped"):
        p = cfg.fault_params(f)
        r = int(p["rank"])
        own, to = int(topo.group_of["dp"][r]), joined_row(topo, p)
        if r in rings[own]:
            rings[own].remove(r)
        pos = int(topo.coord["dp"][r])
        rings[to].insert(min(pos, len(rings[to])), r)
        changed |= {own, to}
    return {k: rings[k] for k in sorted(changed)}


def ring_pairs(ring: list) -> list[tuple]:
    n = len(ring)
    if n < 2:
        return []
    return [(ring[i], ring[(i + 1) % n]) for i in range(n)] if n > 2 else [(ring[0], ring[1]), (ring[1], ring[0])]


def network_fault_truth(cfg, topo, kind: str, p: dict) -> dict:
    """What truth.json records of a network fault beyond its parameters (addresses, exporters, rings)."""
    from rankscope.datasets.sim.realism import exporter_name

    r = int(p.get("rank", -1))
    out: dict = {}
    if kind in ("dead-link", "bad-nic", "misgrouped"):
        out["address"] = topo.addresses[r]
        out["ranks_on_address"] = [int(x) for x in np.flatnonzero(topo.addr_int == topo.addr_int[r])]
    if kind == "dead-link":
        hpp, h = cfg.realism.hosts_per_pod, int(topo.host[r])
        via = backup_rail(cfg, topo, p)
        out.update(rail=int(topo.rail[r]), via_rail=via, exporter=exporter_name(int(topo.rail[r]), h, hpp),
                   rerouted_to=exporter_name(via, h, hpp))
    if kind == "misgrouped":
        a = topo.addresses
        own, to = int(topo.group_of["dp"][r]), joined_row(topo, p)
        rings = dp_rings(cfg, topo)
        intended = {x for row in (own, to) for x in ring_pairs(topo.groups["dp"][row].tolist())}
        actual = {x for row in (own, to) for x in ring_pairs(rings[row])}
        out.update(own_group=own, joined_group=to, rings={str(k): [a[x] for x in v] for k, v in rings.items()},
                   unexpected_pairs=sorted([a[s], a[d]] for s, d in actual - intended
                                           if topo.host[s] != topo.host[d]),
                   missing_pairs=sorted([a[s], a[d]] for s, d in intended - actual
                                        if topo.host[s] != topo.host[d]))
    return out
