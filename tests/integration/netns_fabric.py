"""The network fabric of the namespaced jobs: one namespace per node on a Linux bridge (a leaf), optional
slow NICs, and a second leaf with a dead link for the reroute test; plus the process helpers the runs share.

Split out of :mod:`tests.integration.netns_job`, which runs the jobs on it.
"""

from __future__ import annotations

import secrets
import signal
import socket
import subprocess


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fabric:
    """N namespaces on one flooding bridge; a context manager that always cleans up.

    ``second_bridge=True`` builds two leaves instead (see :func:`run_placed_netns_job`): bridge A
    (``bridge``, every node's link) and bridge B (``bridge_b``), joined by an inter-switch veth link; each
    leaf's meter lives in a namespace of its own (``meter_ns[j]``) that receives a mirror of every frame
    entering the leaf from a host port (tc ``mirred`` on the port's ingress, as a switch's SPAN session
    or ingress flow sampling sees it) on ``meter_ifs[j]``, and exports from its own management address
    ``meter_addrs[j]`` to ``collector_addrs[j]`` (root namespace), so the collector tells the two
    exporters apart. ``reroute=k`` also cables namespace k to bridge B (a second NIC, ``backup_ends[k]``)
    and takes its link to bridge A down: its traffic fails over to leaf B, under the same address.
    """

    def __init__(self, nodes: int, nic_rates: dict[int, str] | None = None, second_bridge: bool = False,
                 reroute: int | None = None):
        tag = secrets.token_hex(2)
        self.nic_rates = dict(nic_rates or {})
        self.bridge = f"rsb{tag}"
        self.namespaces = [f"rs{tag}n{k}" for k in range(nodes)]
        self.host_ends = [f"rs{tag}h{k}" for k in range(nodes)]
        self.ns_ends = [f"rs{tag}e{k}" for k in range(nodes)]
        net = 1 + secrets.randbelow(250)
        self.addresses = [f"10.213.{net}.{k + 1}" for k in range(nodes)]
        if reroute is not None and not 0 <= reroute < nodes:
            raise ValueError(f"reroute={reroute}: not a namespace of 0..{nodes - 1}")
        self.second_bridge = second_bridge or reroute is not None
        self.reroute = reroute
        self.bridge_b = f"rsc{tag}" if self.second_bridge else None
        self.isl = (f"rs{tag}ia", f"rs{tag}ib")
        self.backup_ends: dict[int, tuple[str, str]] = (
            {reroute: (f"rs{tag}g{reroute}", f"rs{tag}f{reroute}")} if reroute is not None else {})
        """namespace -> (host end in bridge B, namespace end) of its second NIC."""
        leaves = 2 if self.second_bridge else 0
        self.meter_ns = [f"rs{tag}m{j}" for j in range(leaves)]
        self.mirror_ends = [f"rs{tag}t{j}" for j in range(leaves)]
        self.meter_ifs = [f"rs{tag}u{j}" for j in range(leaves)]
        self.mgmt_ends = [f"rs{tag}x{j}" for j in range(leaves)]
        self.meter_mgmt_ends = [f"rs{tag}y{j}" for j in range(leaves)]
        mnet = 1 + secrets.randbelow(250)
        self.collector_addrs = [f"10.214.{mnet}.{4 * j + 1}" for j in range(leaves)]
        self.meter_addrs = [f"10.214.{mnet}.{4 * j + 2}" for j in range(leaves)]

    def __enter__(self) -> Fabric:
        try:
            ageing = () if self.second_bridge else ("ageing_time", "0")
            sh("ip", "link", "add", "name", self.bridge, "type", "bridge", *ageing)
            sh("ip", "link", "set", self.bridge, "gso_max_size", "1500", "up")
            for ns, host, inner, addr in zip(self.namespaces, self.host_ends, self.ns_ends, self.addresses):
                sh("ip", "netns", "add", ns)
                sh("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
                sh("ip", "link", "set", inner, "netns", ns)
                sh("ip", "link", "set", host, "master", self.bridge, "gso_max_size", "1500", "up")
                sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
                sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", inner)
                sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "gso_max_size", "1500", "up")
            if self.second_bridge:
                self._second_leaf()
            for k, rate in self.nic_rates.items():
                self.slow_down(k, rate)
        except subprocess.CalledProcessError as e:
            self.__exit__(None, None, None)
            raise RuntimeError(f"fabric set-up failed: {' '.join(e.cmd)}: {e.stderr.strip()}") from e
        return self

    def _second_leaf(self) -> None:
        """Bridge B, the inter-switch link, the reroute and each leaf's mirror port and meter namespace."""
        sh("ip", "link", "add", "name", self.bridge_b, "type", "bridge")
        sh("ip", "link", "set", self.bridge_b, "gso_max_size", "1500", "up")
        sh("ip", "link", "add", self.isl[0], "type", "veth", "peer", "name", self.isl[1])
        for end, br in zip(self.isl, (self.bridge, self.bridge_b)):
            sh("ip", "link", "set", end, "master", br, "gso_max_size", "1500", "up")
        ports: list[list[str]] = [list(self.host_ends), []]
        for k, (host, inner) in self.backup_ends.items():
            ns, addr = self.namespaces[k], self.addresses[k]
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", host, "master", self.bridge_b, "gso_max_size", "1500", "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "gso_max_size", "1500", "up")
            # the link to leaf A dies (its switch port goes down, the NIC loses carrier); routes over a
            # link without carrier are skipped, so the subnet's backup route over the NIC to leaf B
            # carries the traffic, with the node's own address as source
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf.all.ignore_routes_with_linkdown=1")
            sh("ip", "netns", "exec", ns, "ip", "route", "add", f"{addr.rsplit('.', 1)[0]}.0/24", "dev", inner,
                "src", addr, "metric", "100")
            sh("ip", "link", "set", self.host_ends[k], "down")
            ports[1].append(host)
        for j, (mns, mirror, cap, mgmt, mmgmt) in enumerate(zip(self.meter_ns, self.mirror_ends, self.meter_ifs,
                                                                  self.mgmt_ends, self.meter_mgmt_ends)):
            sh("ip", "netns", "add", mns)
            sh("ip", "netns", "exec", mns, "ip", "link", "set", "lo", "up")
            sh("ip", "link", "add", mirror, "type", "veth", "peer", "name", cap)
            sh("ip", "link", "set", cap, "netns", mns)
            sh("ip", "link", "set", mirror, "up")
            sh("ip", "netns", "exec", mns, "ip", "link", "set", cap, "up")
            sh("ip", "link", "add", mgmt, "type", "veth", "peer", "name", mmgmt)
            sh("ip", "link", "set", mmgmt, "netns", mns)
            sh("ip", "addr", "add", f"{self.collector_addrs[j]}/30", "dev", mgmt)
            sh("ip", "link", "set", mgmt, "up")
            sh("ip", "netns", "exec", mns, "ip", "addr", "add", f"{self.meter_addrs[j]}/30", "dev", mmgmt)
            sh("ip", "netns", "exec", mns, "ip", "link", "set", mmgmt, "up")
            for port in ports[j]:
                sh("tc", "qdisc", "add", "dev", port, "ingress")
                sh("tc", "filter", "add", "dev", port, "ingress", "protocol", "all", "u32", "match", "u32", "0",
                    "0", "action", "mirred", "egress", "mirror", "dev", mirror)

    def slow_down(self, k: int, rate: str) -> None:
        """Make namespace k's NIC slow, both ways: its sends (the namespace's end) and what the bridge
        delivers to it (the host end), each a token bucket at ``rate`` (also while the job runs)."""
        tbf = ("root", "tbf", "rate", rate, "burst", "16kb", "latency", "500ms")
        sh("ip", "netns", "exec", self.namespaces[k], "tc", "qdisc", "add", "dev", self.ns_ends[k], *tbf)
        sh("tc", "qdisc", "add", "dev", self.host_ends[k], *tbf)

    def __exit__(self, *exc) -> None:
        for ns, host in zip(self.namespaces, self.host_ends):
            sh("ip", "link", "del", host, check=False)
            sh("ip", "netns", "del", ns, check=False)
        for host, _ in self.backup_ends.values():
            sh("ip", "link", "del", host, check=False)
        for link in (self.isl[0], *self.mirror_ends, *self.mgmt_ends) if self.second_bridge else ():
            sh("ip", "link", "del", link, check=False)
        for mns in self.meter_ns:
            sh("ip", "netns", "del", mns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)
        if self.bridge_b:
            sh("ip", "link", "del", self.bridge_b, check=False)


def stop_process(proc: subprocess.Popen | None, sig=signal.SIGTERM, timeout: float = 20.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
