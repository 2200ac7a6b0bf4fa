"""Options that take the simulator's idealisations away, and the helpers that apply them.

By default every option is off and the simulator stays the idealised fabric
the older tests were written against (one exporter per rail, nanosecond
clocks, RoCE data flows only, one rank per NIC, full layout columns). The
options model what production fabrics and exporters do instead:

- ``transport``: ``roce`` data flows, optionally with the ``reverse`` flows a
  reliable-connected QP produces (coalesced ACKs plus NCCL's clear-to-send
  writes from receiver to sender, which start slightly *before* the data), or
  ``tcp`` (gloo, NCCL's socket transport): one connection per rank pair and
  group, the lower rank listens, both directions open together with a
  SYN/SYN-ACK handshake at job start, and delayed ACKs flow back.
- ``timestamp_ns``: exporter clock resolution (1_000_000 = millisecond IPFIX
  ``flowStartMilliseconds``); times are truncated to it.
- ``hosts_per_pod``: one exporter per (pod, rail) leaf instead of one per rail,
  each with its own clock offset up to ``exporter_offset_ms``.
- ``rail_jitter_us``: rail copies of one collective do not move in lock-step
  (NCCL channels, NIC queues): every transfer starts a random delay late and
  every rail runs a few percent faster or slower.
- ``ranks_per_address``: GPUs that share one NIC (and so one address); TCP
  ports or RoCE destination QPs (``dst_qp``) tell their ranks apart.
- ``double_tree``: NCCL's tree all-reduce runs two complementary binary trees,
  each carrying half the data. The simulator's ``algorithm="tree"`` is that
  double tree in any case (NCCL has no single-tree all-reduce), so the option
  only names it.
- ``wild_background``: storage, checkpoint, replication and monitoring traffic
  on arbitrary ports, from servers that sit on the same rails as the GPUs.
- ``kineto_records``: comm_op/compute_op records without the layout columns
  (process group, sequence number, step, microbatch, stage) and no
  endpoint_map, as a PyTorch profiler trace of a gloo job holds them.
- ``host_order``: ``rank`` numbers a job's hosts (and so their addresses) in
  rank order, the idealisation under which address order is stage order;
  ``scattered`` gives the job's hosts a permutation of its host slots, drawn
  from the job's seed, as Kubernetes pod IPs or an IP plan that does not
  follow the scheduler's rank assignment do.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pyarrow as pa

from rankscope.collectors.errors import ConfigError
from rankscope.collectors.record_class import record

TRANSPORTS = ("roce", "tcp")
HOST_ORDERS = ("rank", "scattered")
PODLESS = 0


@record
class Realism:
    """De-idealisation options of one simulated job (all off by default)."""

    transport: str = "roce"
    """``roce`` (UDP 4791, several QPs per connection) or ``tcp`` (one connection per rank pair)."""
    reverse: bool = False
    """RoCE only: emit the ACK/CTS flows from receiver to sender (TCP always has its ACKs)."""
    ack_every: int = 16
    """RoCE: data packets per coalesced ACK; TCP uses delayed ACKs (one per 2 segments)."""
    timestamp_ns: int = 1
    """exporter timestamp resolution in ns (1_000_000: milliseconds)."""
    hosts_per_pod: int = PODLESS
    """hosts under one leaf per rail; 0 = one exporter per rail for the whole fabric."""
    exporter_offset_ms: float = 0.0
    """each exporter's clock is off by an independent uniform offset within +-this."""
    rail_jitter_us: float = 0.0
    """mean extra start delay of every transfer (exponential) and scale of the per-rail speed spread."""
    ranks_per_address: int = 1
    """GPUs of a host that share one NIC address (must divide gpus_per_host)."""
    double_tree: bool = False
    """tree all-reduce as two complementary binary trees (NCCL), each with half the bytes."""
    wild_background: bool = False
    """fabric noise on arbitrary ports (see sim.network.noise), instead of the known-port background."""
    kineto_records: bool = False
    """white-box records without layout columns, and no endpoint_map."""
    mtu: int = 0
    """payload bytes per packet; 0 = the SimConfig's (TCP usually runs with MSS 8948 or 1448)."""
    connect_lead_s: float = 2.0
    """TCP: the job's connections open this long (+- 50%) before its first data (process-group set-up)."""
    close_lag_s: float = 0.0
    """TCP: the processes exit this long after the job's last data (destroy, checkpoint save), each a few
    ms apart in no set order, and every connection closes (FIN both ways) when the first of its two ends
    exits; 0 = the capture ends before the job does (no teardown seen)."""
    tcp_mesh: bool = False
    """TCP: every pair of a process group connects (gloo's full mesh); most of these carry nothing else."""
    dst_qp: bool = False
    """RoCE: records carry the destination QP number (sFlow raw headers do; IPFIX usually not)."""
    host_order: str = "rank"
    """``rank``: host addresses follow the ranks; ``scattered``: a seeded permutation of the job's hosts."""

    def __post_init__(self):
        if self.transport not in TRANSPORTS:
            raise ConfigError(f"realism.transport={self.transport!r}: expected one of {TRANSPORTS}")
        if self.host_order not in HOST_ORDERS:
            raise ConfigError(f"realism.host_order={self.host_order!r}: expected one of {HOST_ORDERS}")
        for name in ("ack_every", "timestamp_ns", "ranks_per_address"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"realism.{name}={v!r}: expected a positive integer")
        for name in ("hosts_per_pod", "mtu"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"realism.{name}={v!r}: expected an integer >= 0")
        for name in ("exporter_offset_ms", "rail_jitter_us", "connect_lead_s", "close_lag_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"realism.{name}={v!r}: expected a number >= 0")


IDEAL = Realism()


def realism_from(value) -> Realism:
    """A Realism from a mapping (config file) or ``k=v,k=v`` text (the --realism flag)."""
    if isinstance(value, Realism):
        return value
    if isinstance(value, str):
        items = {}
        for item in filter(None, (x.strip() for x in value.split(","))):
            k, eq, v = item.partition("=")
            if not eq:
                raise ConfigError(f"realism {value!r}: {item!r} is not key=value")
            items[k.strip()] = _scalar(v.strip())
        value = items
    if not isinstance(value, dict):
        raise ConfigError(f"realism: expected a mapping or 'key=value,...', got {value!r}")
    known = {f.name for f in fields(Realism)}
    bad = sorted(set(value) - known)
    if bad:
        raise ConfigError(f"realism: unknown option(s) {bad}; expected some of {sorted(known)}")
    return Realism(**value)


def _scalar(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def exporter_name(rail: int, host: int, hosts_per_pod: int) -> str:
    """The leaf that exports a host port's ingress traffic: one per rail, or one per (pod, rail)."""
    if hosts_per_pod <= 0:
        return f"10.255.{rail}.1/0"
    return f"10.254.{host // hosts_per_pod}.{rail + 1}/{rail}"


def exporter_offsets(exporters, max_ms: float, seed) -> dict[str, int]:
    """Independent clock offsets (ns) per exporter, drawn from a stream keyed by the exporter's name
    so that one exporter keeps its offset whichever jobs share it."""
    out = {}
    for e in sorted(set(exporters)):
        key = [int(x) for x in e.replace("/", ".").split(".") if x.isdigit()]
        rng = np.random.default_rng([*np.atleast_1d(seed).tolist(), 37, *key])
        out[e] = int(round(rng.uniform(-max_ms, max_ms) * 1e6))
    return out


def truncate_times(flow: pa.Table, resolution_ns: int) -> pa.Table:
    """Exporter timestamps at ``resolution_ns`` (truncated, as a millisecond clock reads)."""
    if resolution_ns <= 1 or flow.num_rows == 0:
        return flow
    for c in ("start_ns", "end_ns"):
        i = flow.schema.get_field_index(c)
        v = flow.column(c).to_numpy()
        flow = flow.set_column(i, flow.schema.field(i), pa.array(v - np.mod(v, resolution_ns), pa.int64()))
    return flow


LAYOUT_COLUMNS = {
    "comm_op": ("group_id", "group_ranks", "seq", "step", "microbatch", "stage", "stream", "algorithm"),
    "compute_op": ("step", "microbatch", "stage"),
}
"""What a profiler trace of a gloo job does not say: the layout the simulator knows."""


def strip_layout(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """Null the layout columns and drop endpoint_map (the tables keep their schemas)."""
    out = {}
    for kind, t in tables.items():
        if kind == "endpoint_map":
            continue
        for c in LAYOUT_COLUMNS.get(kind, ()):
            if c in t.column_names:
                i = t.schema.get_field_index(c)
                t = t.set_column(i, t.schema.field(i), pa.nulls(t.num_rows, t.schema.field(i).type))
        out[kind] = t
    return out
