"""A corpus of de-idealised fabrics for accuracy benchmarks: random jobs with every realism option.

Each fabric holds 1-3 jobs (8..``max_world`` GPUs each) and draws its own
exporter layout (pods), timestamp resolution, exporter clock offsets and
background; each job draws its degrees (with a share of pure-PP and pure-DP
jobs), schedule, rank order, ring/tree (binary or double) all-reduce,
transport (RoCE with or without ACK/CTS flows, or TCP for jobs up to 256
GPUs), ranks per address, rail jitter, sampling and exporter timeouts,
whether its host addresses follow its ranks (see SCATTERED_SHARE) and, over
TCP, whether the capture sees its connections close (CLOSE_LAGS_S).

Every random choice comes from ``numpy.random.SeedSequence(seed)``: fabric i
uses the i-th spawned child, its jobs' seeds are drawn from it, and the fabric
stream is keyed by those job seeds (simulator.fabric_seed), so two corpus
seeds share no stream and a fabric does not depend on its position.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rankscope.collectors.record_class import record
from rankscope.datasets.sim.job_config import Fault, SimConfig
from rankscope.datasets.sim.realism import Realism

TCP_MAX_WORLD = 256
"""gloo/socket jobs above this size are not something one meets."""
SCATTERED_SHARE = 0.5
"""share of jobs whose host addresses do not follow their ranks (Realism.host_order="scattered").
Whether addresses follow ranks is a property of the deployment (Kubernetes pod IPs: no; a Slurm
cluster whose IP plan follows the sorted node list: usually yes), not of the traffic, and nothing
tells us the mix; an even share says so, and leaves enough jobs of each kind in a 100-200 job corpus
to measure both. Drawn from its own stream keyed by the job's seed, so the corpus's other draws
(and so its jobs) are the same as before the option existed."""
SCATTER_CHOICE_STREAM = 43
"""key of the stream that picks which jobs scatter (sim.topology.HOST_ORDER_STREAM permutes their hosts)."""
CLOSE_LAGS_S = (0.0, 0.05, 0.5, 2.0)
"""TCP jobs: how long after their last data their processes exit and close their connections
(Realism.close_lag_s); 0: the capture ends while the job runs (an SRE analysing a live job). Drawn from
its own stream (CLOSE_LAG_STREAM) keyed by the job's seed, so the corpus's other draws stay as they were."""
CLOSE_LAG_STREAM = 47
CHECKPOINT_SHARE = 0.5
"""share of the TCP jobs that close their connections whose processes first save a checkpoint: their close
lag gets CHECKPOINT_SAVE_S more (Megatron saves at the end of training when told where). How long a save
takes depends on the model and the storage, and nothing tells us the mix: an even share, and saves of half
a minute and two minutes, longer than most exporters' idle timeouts (so the FIN comes in a record of its
own) or not. Drawn from CHECKPOINT_STREAM keyed by the job's seed, so every other draw stays as it was."""
CHECKPOINT_SAVE_S = (30.0, 120.0)
CHECKPOINT_STREAM = 71


@record
class CorpusFabric:
    index: int
    configs: tuple[SimConfig, ...]
    realism: Realism
    """fabric-wide options (timestamps, pods, exporter offsets, background)."""


def _degrees(rng: np.random.Generator, max_world: int) -> tuple[int, int, int]:
    kind = rng.random()
    while True:
        if kind < 0.15:  # pure pipeline: one stage per host, no DP, no TP
            dp, pp, tp = 1, int(rng.choice([8, 16])), 1
        elif kind < 0.3:  # pure data parallel, one rank per host or TP hosts
            dp, pp, tp = int(rng.choice([8, 16, 32, 64, 128])), 1, int(rng.choice([1, 1, 2, 8]))
        else:
            tp = int(rng.choice([1, 2, 4, 8]))
            pp = int(rng.choice([1, 2, 4, 8, 16]))
            dp = int(rng.choice([1, 2, 4, 8, 16, 32, 64]))
        if 8 <= dp * pp * tp <= max_world and dp * pp >= 2:
            return dp, pp, tp
        if kind < 0.3:
            kind = rng.random()


def _job(rng: np.random.Generator, name: str, max_world: int, fabric: Realism) -> SimConfig:
    cfg = _job_draws(rng, name, max_world, fabric)
    scattered = np.random.default_rng([cfg.seed, SCATTER_CHOICE_STREAM]).random() < SCATTERED_SHARE
    lag = float(np.random.default_rng([cfg.seed, CLOSE_LAG_STREAM]).choice(CLOSE_LAGS_S))
    save = np.random.default_rng([cfg.seed, CHECKPOINT_STREAM])
    if lag > 0 and save.random() < CHECKPOINT_SHARE:
        lag += float(save.choice(CHECKPOINT_SAVE_S))
    return dataclasses.replace(cfg, realism=dataclasses.replace(
        cfg.realism, host_order="scattered" if scattered else "rank",
        close_lag_s=lag if cfg.realism.transport == "tcp" else 0.0))


def _job_draws(rng: np.random.Generator, name: str, max_world: int, fabric: Realism) -> SimConfig:
    dp, pp, tp = _degrees(rng, max_world)
    world = dp * pp * tp
    schedule = str(rng.choice(["gpipe", "1f1b", "interleaved"])) if pp > 1 else "1f1b"
    mb = int(rng.choice([4, 8])) if pp > 1 else 2
    if schedule == "interleaved":
        mb = max(mb, pp) // pp * pp
    tcp = world <= TCP_MAX_WORLD and rng.random() < 0.3
    share = int(rng.choice([d for d in (1, 2, 4, 8) if tp % d == 0]))
    if tcp and rng.random() < 0.5:
        share = tp  # a gloo host often has one address for all its ranks
    algorithm = str(rng.choice(["ring", "tree"]))
    realism = Realism(
        transport="tcp" if tcp else "roce", reverse=bool(rng.random() < 0.8), ack_every=int(rng.choice([1, 8, 64])),
        timestamp_ns=fabric.timestamp_ns, hosts_per_pod=fabric.hosts_per_pod,
        exporter_offset_ms=fabric.exporter_offset_ms, rail_jitter_us=float(rng.choice([0.0, 20.0, 200.0])),
        ranks_per_address=share, double_tree=algorithm == "tree" and bool(rng.random() < 0.5),
        wild_background=fabric.wild_background, kineto_records=bool(rng.random() < 0.5),
        mtu=int(rng.choice([1448, 8948])) if tcp else 0, tcp_mesh=tcp and bool(rng.random() < 0.5), dst_qp=not tcp and bool(rng.random() < 0.3))
    faults = ()
    if rng.random() < 0.3:
        faults = (Fault("clock-skew", {"max_ms": 3.0, "exporter_max_ms": 0.0}),)
    return SimConfig(
        job=name, dp=dp, pp=pp, tp=tp, steps=int(rng.integers(4, 8)), microbatches=mb, schedule=schedule,
        rank_order=str(rng.choice(["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"])), gpus_per_host=tp,
        seed=int(rng.integers(1 << 62)), dp_sync=str(rng.choice(["allreduce", "zero1", "zero3"])),
        algorithm=algorithm, qps=1 if tcp else int(rng.integers(1, 5)),
        sampling=int(rng.choice([1, 10, 100, 1000])), active_timeout_s=float(rng.choice([0.1, 1.0, 10.0, 60.0])),
        idle_timeout_s=float(rng.choice([0.1, 1.0, 15.0, 60.0])), layers=32, faults=faults, realism=realism)


def corpus_fabrics(seed: int, n_jobs: int, max_world: int = 4096, *, min_world: int = 8):
    """Yield CorpusFabric until at least ``n_jobs`` jobs were produced."""
    root = np.random.SeedSequence(seed)
    made, i = 0, 0
    while made < n_jobs:
        rng = np.random.default_rng(root.spawn(1)[0])
        fabric = Realism(timestamp_ns=int(rng.choice([1, 1_000, 1_000_000, 1_000_000])),
                         hosts_per_pod=int(rng.choice([0, 4, 16, 32])),
                         exporter_offset_ms=float(rng.choice([0.0, 0.5, 2.0, 5.0])),
                         wild_background=bool(rng.random() < 0.8))
        n = int(min(rng.integers(1, 4), n_jobs - made))
        cfgs = tuple(_job(rng, f"job{i}-{k}", max(max_world, min_world), fabric) for k in range(n))
        yield CorpusFabric(i, cfgs, fabric)
        made += n
        i += 1
