"""``rankscope simulate``: write a simulated job's trace store and its ground truth."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import click

from rankscope.cli.paths import output_dir, writing
from rankscope.collectors.errors import ConfigError, UsageError

# flag name -> SimConfig field; every flag defaults to None so a config file's values win unless given.
_FIELDS = {
    "job": "job", "dp": "dp", "pp": "pp", "tp": "tp", "ep": "ep", "cp": "cp", "steps": "steps",
    "microbatches": "microbatches", "schedule": "schedule", "virtual_stages": "virtual_stages",
    "rank_order": "rank_order", "seed": "seed", "sampling": "sampling", "active_timeout_s": "active_timeout_s",
    "idle_timeout_s": "idle_timeout_s", "dp_sync": "dp_sync", "buckets": "buckets", "algorithm": "algorithm",
    "hidden": "hidden", "layers": "layers", "seq_len": "seq_len", "micro_batch_size": "micro_batch_size",
    "nic_gbps": "nic_gbps", "qps": "qps", "gpus_per_host": "gpus_per_host", "gemm_records": "gemm_records",
    "flows": "flows", "realism": "realism", "host_map": "host_map", "pod_uplink_gbps": "pod_uplink_gbps",
    "pod_latency_ns": "pod_latency_ns",
}


def _host_map(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--host-map {text!r}: expected comma-separated host slots, e.g. 0,1,4,5,2,3,6,7") from None


def _load_config(path: Path) -> dict:
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - yaml and toml raise their own error types
        raise UsageError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'YAML'}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list) or not data["jobs"]:
        raise UsageError(f"{path}: expected a mapping with a non-empty 'jobs' list (and optional capture, "
                         "background, seed)")
    return data


def _faults(items, where: str):
    from rankscope.datasets.simulator import Fault, parse_fault

    out = []
    for it in items or ():
        if isinstance(it, str):
            out.append(parse_fault(it))
        elif isinstance(it, dict) and "kind" in it:
            out.append(Fault(it["kind"], dict(it.get("params") or {})))
        else:
            raise ConfigError(f"{where}: fault {it!r} is neither 'KIND:k=v,...' nor {{kind:, params:}}")
    return tuple(out)


def _config(values: dict, where: str):
    from rankscope.datasets.sim.realism import realism_from
    from rankscope.datasets.simulator import SimConfig

    values = dict(values)
    values["faults"] = _faults(values.pop("faults", ()), where)
    if values.get("realism") is not None:
        values["realism"] = realism_from(values["realism"])
    if isinstance(values.get("host_map"), list):  # a config file's list
        values["host_map"] = tuple(values["host_map"])
    try:
        return SimConfig(**values)
    except TypeError as e:
        raise ConfigError(f"{where}: {e} (see `rankscope simulate --help` for the options)") from None


@click.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="store directory to write")
@click.option("--job", default=None, help="job name (default: default)")
@click.option("--dp", type=int, default=None, help="data-parallel degree")
@click.option("--pp", type=int, default=None, help="pipeline-parallel degree")
@click.option("--tp", type=int, default=None, help="tensor-parallel degree")
@click.option("--ep", type=int, default=None, help="expert-parallel degree (MoE all_to_all)")
@click.option("--cp", type=int, default=None, help="context-parallel degree")
@click.option("--steps", type=int, default=None, help="training steps to simulate (default 3)")
@click.option("--microbatches", type=int, default=None, help="microbatches per step")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved"]), default=None,
              help="pipeline schedule (default 1f1b)")
@click.option("--virtual-stages", type=int, default=None, help="model chunks per rank (interleaved)")
@click.option("--rank-order", default=None, help="axes fastest first, e.g. tp-cp-ep-dp-pp (Megatron)")
@click.option("--fault", "faults", multiple=True, metavar="KIND[:k=v,...]",
              help="slow-worker, stage-imbalance, seq-skew, slow-link, gc, misaligned-gemm, hang, clock-skew, "
                   "bad-nic, dead-link, misgrouped")
@click.option("--seed", type=int, default=None, help="random seed of jitter, placement and faults (default 0)")
@click.option("--dp-sync", type=click.Choice(["allreduce", "zero1", "zero2", "zero3", "fsdp"]), default=None,
              help="gradient sync: all-reduce, or ZeRO/FSDP reduce-scatter + all-gather (default allreduce)")
@click.option("--buckets", type=int, default=None, help="gradient buckets per step")
@click.option("--algorithm", type=click.Choice(["ring", "tree"]), default=None,
              help="collective algorithm (default ring)")
@click.option("--hidden", type=int, default=None, help="model hidden size (default 4096)")
@click.option("--layers", type=int, default=None, help="transformer layers, split over the stages (default 32)")
@click.option("--seq-len", type=int, default=None, help="tokens per sequence (default 4096)")
@click.option("--micro-batch-size", type=int, default=None, help="sequences per microbatch (default 1)")
@click.option("--nic-gbps", type=float, default=None, help="RoCE bandwidth per GPU NIC")
@click.option("--qps", type=int, default=None, help="queue pairs (source ports) per peer")
@click.option("--gpus-per-host", type=int, default=None,
              help="GPUs per host; traffic inside a host never reaches a switch (default 8)")
@click.option("--sampling", type=int, default=None, help="1-in-N packet sampling at the exporters")
@click.option("--active-timeout-s", type=float, default=None,
              help="exporter active timeout: a long flow is cut into records this long (default 1)")
@click.option("--idle-timeout-s", type=float, default=None,
              help="exporter idle timeout: a flow silent this long is exported (default 15)")
@click.option("--gemm-records/--no-gemm-records", default=None, help="per-kernel GEMM records (default: <=64 GPUs)")
@click.option("--flows/--no-flows", default=None, help="emit switch flow records (default on)")
@click.option("--realism", default=None, metavar="K=V[,K=V...]",
              help="de-idealise the fabric (datasets/sim/realism.py), e.g. transport=tcp,timestamp_ns=1000000,"
                   "hosts_per_pod=4,exporter_offset_ms=2,reverse=true,ranks_per_address=2,wild_background=true")
@click.option("--host-map", default=None, callback=lambda _c, _p, v: _host_map(v), metavar="H0,H1,...",
              help="host slot of each run of --gpus-per-host consecutive ranks (a permutation): a deliberate "
                   "placement, e.g. a pipeline spread over two pods")
@click.option("--pod-uplink-gbps", type=float, default=None,
              help="bandwidth between pods (realism hosts_per_pod sets the pods; default: --nic-gbps)")
@click.option("--pod-latency-ns", type=float, default=None, help="extra latency of a transfer between pods")
@click.option("--capture", default="fabric", show_default=True, help="job name of the flow records")
@click.option("--background/--no-background", default=None,
              help="storage/checkpoint/rendezvous traffic on the fabric (default: on with --config)")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="YAML/TOML file with a 'jobs' list for several jobs on one fabric; flags act as defaults")
def simulate(out_dir, faults, capture, background, config_file, **flags):
    """Simulate a training job (or several on one fabric) with ground truth.

    Writes the trace store into OUT and OUT/truth.json (fault kinds use the
    report's verdict names).

    \b
    Example:
      rankscope simulate --out sim --dp 4 --pp 2 --steps 5 --fault slow-worker:rank=5,factor=1.5
      rankscope simulate --out fab --config jobs.yaml
      rankscope simulate --out bad --dp 4 --pp 4 --gpus-per-host 2 --realism hosts_per_pod=4 --host-map 0,1,4,5,2,3,6,7
    """
    from rankscope.datasets.simulator import simulate as run_one
    from rankscope.datasets.simulator import simulate_fabric, write_store

    out = output_dir(out_dir, "--out")
    if (out / "truth.json").exists():
        raise UsageError(f"{out} already holds a simulation (truth.json); choose a new directory")
    given = {_FIELDS[k]: v for k, v in flags.items() if v is not None}
    if faults:
        given["faults"] = list(faults)
    given["capture"] = capture
    if config_file:
        data = _load_config(Path(config_file))
        cfgs = []
        for i, job in enumerate(data["jobs"]):
            if not isinstance(job, dict):
                raise UsageError(f"{config_file}: jobs[{i}] is not a mapping")
            cfgs.append(_config({**given, **job, "capture": data.get("capture", capture)},
                                f"{config_file}: jobs[{i}]"))
        bg = data.get("background", True) if background is None else background
        from rankscope.datasets.sim.realism import realism_from

        fab = data.get("realism")
        res = simulate_fabric(cfgs, background=bool(bg), capture=data.get("capture", capture),
                              seed=int(data.get("seed", 0)), realism=None if fab is None else realism_from(fab))
        jobs = res.jobs
    else:
        cfg = _config(given, "flags")
        res = run_one(cfg) if not background else simulate_fabric([cfg], background=True, capture=capture,
                                                                  seed=cfg.seed)
        jobs = [res] if not background else res.jobs
    with writing(out, "--out"):
        write_store(res, out)
    for r in jobs:
        t = r.truth
        st = t["step_times_ns"]
        mean = f"{sum(st) / len(st) / 1e6:,.1f} ms" if st else "none completed"
        faults_s = ", ".join(f"{f['injected']}->{f['kind']}" for f in t["faults"]) or "none"
        click.echo(f"job {r.config.job}: {t['world_size']} ranks {json.dumps(t['degrees'])}, "
                   f"{t['completed_steps']}/{t['steps']} steps, mean step {mean}, faults: {faults_s}")
    for kind, table in res.tables.items():
        click.echo(f"  {kind:<14}{table.num_rows:>12,} rows")
    click.echo(f"wrote {out} and {out / 'truth.json'}")
