"""Configuration of a simulated training job: degrees, model size, network, faults.

Everything a simulation depends on is in :class:`SimConfig` (plus the seed), so
the same config always yields the same trace. Values are checked in
``__post_init__`` and a bad one raises ConfigError naming it and the range.
"""

from __future__ import annotations

from dataclasses import field

from rankscope.collectors.errors import ConfigError
from rankscope.collectors.record_class import record
from rankscope.datasets.sim.realism import Realism

AXES = ("tp", "cp", "ep", "dp", "pp")
"""The parallel axes; a rank order lists all five, fastest-varying first."""

MEGATRON_ORDER = "tp-cp-ep-dp-pp"

SCHEDULES = ("gpipe", "1f1b", "interleaved")
DP_SYNCS = ("allreduce", "zero1", "zero2", "zero3", "fsdp")

# cli kind -> (verdict name written to truth.json, default parameters).
# A default of None is filled from the job (see SimConfig._fault_defaults).
FAULT_KINDS: dict[str, tuple[str, dict]] = {
    "slow-worker": ("worker", {"rank": None, "factor": 1.5}),
    "stage-imbalance": ("stage_imbalance", {"stage": None, "factor": 2.0}),
    "seq-skew": ("sequence_imbalance", {"sigma": 0.35, "dp_rank": -1, "factor": 1.0, "min_len": 128}),
    "slow-link": ("communication", {"rank": None, "factor": 4.0}),
    "gc": ("worker", {"rank": None, "pause_ms": 150.0, "every": 2, "microbatch": 0}),
    "misaligned-gemm": ("misaligned_gemm", {"kernel": "fc1", "size": None, "factor": 1.8, "rank": -1,
                                            "from_step": 0}),
    "hang": ("hang", {"rank": None, "step": None, "index": 0}),
    "clock-skew": ("clock_skew", {"max_ms": 5.0, "host": -1, "offset_ms": 0.0, "exporter_max_ms": 0.0}),
    # network faults of the traffic view (sim.network.faults): truth names the report's traffic finding
    "dead-link": ("traffic_rerouted", {"rank": None, "via": -1}),
    "misgrouped": ("traffic_unexpected", {"rank": None, "group": -1}),
    "bad-nic": ("communication", {"rank": None, "factor": 2.5}),
}
GEMM_KERNELS = ("qkv", "proj", "fc1", "fc2")
TP_DIM = {"qkv": ("n", 3), "proj": ("k", 1), "fc1": ("n", 4), "fc2": ("k", 4)}
"""Per GEMM of a layer: the dim tensor parallelism splits (column-parallel qkv/fc1 split N, row-parallel
proj/fc2 split K) and its unsplit size in multiples of ``hidden``."""
PREFERRED_SHARE = 0.25
"""A dim that meets the 16-byte minimum but misses the 128-byte line loses this share of the minimum's
slowdown (partial cache lines, not a fallback kernel)."""


@record
class Fault:
    """One injected fault: a cli kind (``slow-worker``, ...) and its parameters."""

    kind: str
    params: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in FAULT_KINDS:
            raise ConfigError(f"unknown fault kind {self.kind!r}; expected one of {sorted(FAULT_KINDS)}")
        defaults = FAULT_KINDS[self.kind][1]
        unknown = set(self.params) - set(defaults)
        if unknown:
            raise ConfigError(f"fault {self.kind}: unknown parameter(s) {sorted(unknown)}; "
                              f"expected some of {sorted(defaults)}")

    @property
    def verdict(self) -> str:
        return FAULT_KINDS[self.kind][0]

    def get(self, key: str):
        v = self.params.get(key)
        return FAULT_KINDS[self.kind][1][key] if v is None else v


def _value(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_fault(text: str) -> Fault:
    """``KIND[:k=v,k=v]`` (the --fault syntax) -> Fault; bad text raises ConfigError."""
    kind, _, args = text.partition(":")
    params = {}
    for item in filter(None, (a.strip() for a in args.split(","))):
        k, eq, v = item.partition("=")
        if not eq or not k.strip() or not v.strip():
            raise ConfigError(f"fault {text!r}: argument {item!r} is not key=value")
        params[k.strip()] = _value(v.strip())
    return Fault(kind.strip(), params)


def _positive(name: str, value, kind=(int,)) -> None:
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
        raise ConfigError(f"{name}={value!r}: expected a positive {'integer' if kind == (int,) else 'number'}")


@record
class SimConfig:
    """One simulated training job.

    World size is tp*cp*ep*dp*pp; ``ep`` is its own axis here (MoE layers do
    an all_to_all over the ep group; the dense gradient sync runs over the dp
    group only), so every group of truth.json is also visible in comm_op.
    """

    job: str = "default"
    dp: int = 2
    pp: int = 1
    tp: int = 1
    ep: int = 1
    cp: int = 1
    steps: int = 3
    microbatches: int = 4
    schedule: str = "1f1b"
    virtual_stages: int = 2
    """model chunks per pipeline rank for the interleaved schedule."""
    rank_order: str = MEGATRON_ORDER
    """axes fastest-varying first (Megatron: tp-cp-ep-dp-pp)."""
    faults: tuple[Fault, ...] = ()
    seed: int = 0
    flows: bool = True
    # model size: sets compute time and message sizes
    hidden: int = 4096
    layers: int = 32
    seq_len: int = 4096
    micro_batch_size: int = 1
    moe_experts_bytes_factor: float = 1.0
    """all_to_all payload = factor * microbatch activation bytes."""
    ep_in_dp: bool = False
    """expert parallelism carved out of data parallelism (Megatron MoE): the data-parallel group is then the
    ep x dp ranks (truth's ``dp`` = ep * dp), each of its EP groups ``ep`` consecutive members. Every layer
    of every microbatch, forward and backward, does a dispatch and a combine all_to_all in the EP group,
    each member's payload drawn per call (routing); dense gradients are all-reduced over the whole
    data-parallel group and the experts' over the ``dp`` axis (the expert-data-parallel group)."""
    dtype: str = "bfloat16"
    gpu_tflops: float = 400.0
    """sustained dense throughput of one GPU (TFLOP/s)."""
    jitter: float = 0.01
    """relative lognormal noise on every compute span."""
    launch_ns: float = 20_000.0
    """CPU launch gap before every op (mean, ns)."""
    # data-parallel gradient sync
    dp_sync: str = "allreduce"
    buckets: int = 4
    """gradient buckets per step (sizes vary around total/buckets)."""
    algorithm: str = "ring"
    # network
    gpus_per_host: int = 8
    nvlink_gbps: float = 3600.0
    """NVLink bandwidth per GPU (Gbit/s), inside a host."""
    nic_gbps: float = 400.0
    """RoCE NIC bandwidth per GPU (Gbit/s), between hosts."""
    qps: int = 4
    """RoCE queue pairs (UDP source ports) per peer connection."""
    link_latency_ns: float = 5_000.0
    host_offset: int = 0
    """index of this job's first host on a shared fabric."""
    host_map: tuple[int, ...] | None = None
    """a given rank-to-host mapping: the job's host slot (0-based, before host_offset) of each run of
    ``gpus_per_host`` consecutive ranks, a permutation of 0..hosts-1 (e.g. a pipeline's stages alternating
    between two pods); None = rank order (or ``realism.host_order``)."""
    pod_uplink_gbps: float | None = None
    """bandwidth per GPU (Gbit/s) of a transfer between hosts of different pods (``realism.hosts_per_pod``):
    the pod uplinks are oversubscribed, so a cross-pod link (a ring with one) runs at this rate; None =
    ``nic_gbps`` (pods cost nothing)."""
    pod_latency_ns: float = 0.0
    """extra latency of every hop between pods (the spine-to-core round trip), added to link_latency_ns."""
    # flow export
    capture: str = "fabric"
    sampling: int = 1
    """1-in-N packet sampling at the exporters (1 = every packet)."""
    active_timeout_s: float = 1.0
    idle_timeout_s: float = 15.0
    mtu: int = 4096
    gemm_records: bool | None = None
    """per-kernel GEMM records; None = only for jobs of at most 64 GPUs."""
    start_ns: int = 1_764_000_000_000_000_000
    realism: Realism = Realism()
    """de-idealisation options (sim.realism); all off by default."""

    def __post_init__(self):
        from rankscope.collectors.errors import UsageError
        from rankscope.collectors.store import check_job_name

        for name in ("job", "capture"):
            try:
                check_job_name(getattr(self, name))
            except UsageError as e:
                raise ConfigError(f"{name}: {e}") from None
        for name in ("dp", "pp", "tp", "ep", "cp", "steps", "microbatches", "virtual_stages", "hidden",
                     "layers", "seq_len", "micro_batch_size", "buckets", "gpus_per_host", "qps", "sampling",
                     "mtu"):
            _positive(name, getattr(self, name))
        for name in ("gpu_tflops", "nvlink_gbps", "nic_gbps", "active_timeout_s", "idle_timeout_s",
                     "moe_experts_bytes_factor"):
            _positive(name, getattr(self, name), (int, float))
        if self.jitter < 0 or self.launch_ns < 0 or self.link_latency_ns < 0 or self.host_offset < 0:
            raise ConfigError("jitter, launch_ns, link_latency_ns and host_offset must be >= 0")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule={self.schedule!r}: expected one of {SCHEDULES}")
        if self.dp_sync not in DP_SYNCS:
            raise ConfigError(f"dp_sync={self.dp_sync!r}: expected one of {DP_SYNCS}")
        if self.algorithm not in ("ring", "tree"):
            raise ConfigError(f"algorithm={self.algorithm!r}: expected ring or tree")
        if sorted(self.rank_order.split("-")) != sorted(AXES):
            raise ConfigError(f"rank_order={self.rank_order!r}: expected the five axes {AXES} joined by '-', "
                              "fastest-varying first, e.g. tp-cp-ep-dp-pp")
        stages = self.pp * (self.virtual_stages if self.schedule == "interleaved" else 1)
        if self.layers % stages:
            raise ConfigError(f"layers={self.layers} must divide evenly into {stages} (virtual) stages")
        if self.schedule == "interleaved" and self.microbatches % self.pp:
            raise ConfigError(f"interleaved schedule: microbatches={self.microbatches} must be a multiple "
                              f"of pp={self.pp}")
        if self.ep_in_dp and (self.ep < 2 or self.dp_sync != "allreduce"):
            raise ConfigError(f"ep_in_dp needs ep >= 2 and dp_sync allreduce, got ep={self.ep}, "
                              f"dp_sync={self.dp_sync!r}")
        if not isinstance(self.realism, Realism):
            raise ConfigError(f"realism must be a Realism, got {type(self.realism).__name__}")
        if self.gpus_per_host % self.realism.ranks_per_address:
            raise ConfigError(f"realism.ranks_per_address={self.realism.ranks_per_address} must divide "
                              f"gpus_per_host={self.gpus_per_host}")
        if not isinstance(self.faults, tuple) or not all(isinstance(f, Fault) for f in self.faults):
            raise ConfigError("faults must be a tuple of Fault")
        for f in self.faults:
            self._check_fault(f)
        self._check_placement()

    def _check_placement(self) -> None:
        """host_map, pod_uplink_gbps and pod_latency_ns (see their field docs)."""
        if self.pod_uplink_gbps is not None:
            _positive("pod_uplink_gbps", self.pod_uplink_gbps, (int, float))
        if isinstance(self.pod_latency_ns, bool) or not isinstance(self.pod_latency_ns, (int, float)) \
                or self.pod_latency_ns < 0:
            raise ConfigError(f"pod_latency_ns={self.pod_latency_ns!r}: expected a number >= 0")
        if self.host_map is not None:
            n = -(-self.world_size // self.gpus_per_host)
            if not isinstance(self.host_map, tuple) or sorted(self.host_map) != list(range(n)):
                raise ConfigError(f"host_map={self.host_map!r}: expected a tuple that permutes the job's "
                                  f"{n} host slots 0..{n - 1}")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp * self.ep * self.cp

    @property
    def chunks(self) -> int:
        return self.virtual_stages if self.schedule == "interleaved" else 1

    @property
    def want_gemms(self) -> bool:
        return self.world_size <= 64 if self.gemm_records is None else bool(self.gemm_records)

    def faults_of(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]

    def fault_params(self, f: Fault) -> dict:
        """The fault's parameters with every default filled in for this job."""
        p = {k: f.get(k) for k in FAULT_KINDS[f.kind][1]}
        w = self.world_size
        if "rank" in p and p["rank"] is None:
            p["rank"] = w - 1 if f.kind == "hang" else min(1, w - 1)
        if f.kind == "stage-imbalance" and p["stage"] is None:
            p["stage"] = self.pp - 1
        if f.kind == "hang" and p["step"] is None:
            p["step"] = self.steps - 1
        if f.kind == "misaligned-gemm":
            p.update(self._misaligned(p))
        return p

    def _misaligned(self, p: dict) -> dict:
        """The misaligned GEMM as the model builds it: the tensor-parallel dim of ``kernel`` is ``size``
        (unsplit; default 2 * tp short of the aligned size, as an FFN of 16,380 instead of 16,384), each rank
        holds size / tp of it, and the slowdown follows from that split: ``factor`` when it misses the
        dtype's 16-byte minimum (cuBLAS falls back to an align1/align2 kernel), a ``PREFERRED_SHARE`` of
        that when it misses only the 128-byte line, none when aligned; FLOPs scale with the size."""
        from rankscope.analysis.kernels.alignment import check_dim

        dim, mult = TP_DIM.get(p["kernel"], ("n", 1))
        aligned = mult * self.hidden // self.tp
        size = p["size"] if p["size"] is not None else self.tp * (aligned - 2)
        split = size // self.tp if isinstance(size, int) and size > 0 else 0
        sev = check_dim(split, self.dtype) if split else None
        slow = {"min": p["factor"], "preferred": 1 + PREFERRED_SHARE * (p["factor"] - 1)}.get(sev, 1.0)
        return {"size": size, "dim": dim, "split": split, "aligned_split": aligned, "severity": sev,
                "time_factor": split / aligned * slow if aligned else 1.0}

    def _check_fault(self, f: Fault) -> None:
        p = self.fault_params(f)
        w = self.world_size

        def need(cond, what):
            if not cond:
                raise ConfigError(f"fault {f.kind} in job {self.job!r}: {what} (params {p})")

        if "rank" in p and p["rank"] != -1:
            need(isinstance(p["rank"], int) and 0 <= p["rank"] < w, f"rank must be in 0..{w - 1}")
        if "factor" in p:
            need(isinstance(p["factor"], (int, float)) and p["factor"] > 0, "factor must be > 0")
        if f.kind in ("slow-worker", "gc", "slow-link", "hang", "dead-link", "misgrouped", "bad-nic"):
            need(p["rank"] != -1, "needs one rank")
        if f.kind == "stage-imbalance":
            need(self.pp > 1, "needs pp > 1")
            need(isinstance(p["stage"], int) and 0 <= p["stage"] < self.pp, f"stage must be in 0..{self.pp - 1}")
        if f.kind == "seq-skew":
            need(p["sigma"] >= 0 and p["min_len"] >= 1, "sigma >= 0 and min_len >= 1")
            need(p["dp_rank"] == -1 or 0 <= p["dp_rank"] < self.dp, f"dp_rank must be -1 or in 0..{self.dp - 1}")
        if f.kind == "gc":
            need(p["pause_ms"] > 0 and isinstance(p["every"], int) and p["every"] >= 1, "pause_ms > 0, every >= 1")
            need(0 <= p["microbatch"] < self.microbatches, "microbatch out of range")
        if f.kind == "misaligned-gemm":
            need(p["kernel"] in GEMM_KERNELS, f"kernel must be one of {GEMM_KERNELS}")
            need(isinstance(p["size"], int) and p["size"] > 0 and p["size"] % self.tp == 0,
                 f"size must be a positive int that divides across tp={self.tp} ranks")
            need(p["severity"] is not None, f"size {p['size']} split {self.tp} ways = {p['split']} is aligned "
                                            f"for {self.dtype}: nothing is misaligned")
        if f.kind == "hang":
            need(self.dp > 1, "needs dp > 1 (the rank never joins a data-parallel collective)")
            need(0 <= p["step"] < self.steps, f"step must be in 0..{self.steps - 1}")
            need(0 <= p["index"] < self.buckets, f"index must be in 0..{self.buckets - 1} (a gradient bucket)")
        if f.kind == "clock-skew":
            need(p["max_ms"] >= 0 and p["exporter_max_ms"] >= 0, "max_ms and exporter_max_ms must be >= 0")
        # dead-link and misgrouped need the job's topology: checked when it is built (simulator.simulate)
