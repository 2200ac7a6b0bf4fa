"""Options of black-box (flow-based) strategy inference and job recognition."""

from __future__ import annotations

from rankscope.collectors.errors import ConfigError
from rankscope.collectors.record_class import record

# Ports set apart before anything else: only the torch rendezvous store, whose clients tie a job's
# endpoints together. Storage, checkpoint and other background traffic is told by its shape on any
# port (fabric.job_evidence), not from a list.
DEFAULT_CONTROL_PORTS = (29500,)


@record
class FlowConfig:
    control_ports: tuple[int, ...] = DEFAULT_CONTROL_PORTS
    """flows to or from these ports are set apart as control/storage traffic (counted, not analysed)."""
    rendezvous_ports: tuple[int, ...] = (29500,)
    """ports of a job's rendezvous store: every rank connects to it, so endpoints that talk to one
    rendezvous server belong to one job (this joins the rails of a rail-optimised job)."""
    edge_min_fraction: float = 0.002
    """a pair is training traffic only if it carries at least this fraction of the bytes of the
    busiest pair of either endpoint (drops full-mesh handshakes, storage and noise)."""
    mode_gap: float = 2.5
    """pairs whose per-pair bytes differ by more than this factor fall into different traffic modes."""
    max_modes: int = 6
    """at most this many byte modes are tried as data-parallel / pipeline labelings."""
    sync_tolerance_ns: int = 200_000
    """finest time bin of the activity series whose cross-correlation joins the rails of one job (the
    bin is at least four timestamp ticks, so millisecond exporters get 4 ms bins)."""
    rail_min_correlation: float = 0.8
    """two disconnected traffic graphs of one size are one job (one per rail / tensor-parallel rank)
    when their binned activity correlates at least this well within the exporters' clock offsets."""
    max_exporter_skew_ns: int = 20_000_000
    """largest clock offset between two exporters that lockstep matching corrects for."""
    tie_margin: float = 0.05
    """two valid labellings whose mean per-link model fits differ by at most this much explain the
    traffic equally well: the strategy is reported ambiguous with the alternatives."""
    max_ack_packet_bytes: int = 128
    """a record whose mean packet is at most this many bytes is an ACK/CTS flow or a connection
    set-up, not payload (RoCE ACKs are ~48-64 bytes, bare TCP segments 52-80; payload packets are
    MTU-sized)."""
    min_job_endpoints: int = 2
    """a connected set of endpoints smaller than this is not a training job."""

    @classmethod
    def with_rendezvous(cls, *ports: int) -> FlowConfig:
        """The defaults, with a job's own rendezvous ports (torchrun --master_port, `rankscope analyze
        --control-port`) beside torchrun's default: their flows are control traffic, and the endpoints
        that talk to one rendezvous server are one job."""
        both = tuple(dict.fromkeys((*DEFAULT_CONTROL_PORTS, *ports)))
        return cls(control_ports=both, rendezvous_ports=both)

    def __post_init__(self):
        if not 0 < self.edge_min_fraction < 1:
            raise ConfigError(f"FlowConfig.edge_min_fraction must be in (0, 1), got {self.edge_min_fraction}")
        if not self.mode_gap > 1:
            raise ConfigError(f"FlowConfig.mode_gap must be > 1, got {self.mode_gap}")
        if not 1 <= self.max_modes <= 10:
            raise ConfigError(f"FlowConfig.max_modes must be in 1..10, got {self.max_modes}")
        if self.max_exporter_skew_ns < 0:
            raise ConfigError(f"FlowConfig.max_exporter_skew_ns must be >= 0, got {self.max_exporter_skew_ns}")
        if self.sync_tolerance_ns < 0:
            raise ConfigError(f"FlowConfig.sync_tolerance_ns must be >= 0, got {self.sync_tolerance_ns}")
        if self.min_job_endpoints < 2:
            raise ConfigError(f"FlowConfig.min_job_endpoints must be >= 2, got {self.min_job_endpoints}")
        for p in (*self.control_ports, *self.rendezvous_ports):
            if not isinstance(p, int) or not 0 <= p <= 65535:
                raise ConfigError(f"FlowConfig.control_ports: {p!r} is not a port number 0..65535")
