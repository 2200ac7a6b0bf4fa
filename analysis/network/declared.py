"""Expected traffic of a declared job (``rankscope expect --config job.yaml``): degrees, rank order, sizes.

Bytes per directed pair per step, per class, from the collectives' own arithmetic:
- DP ring all-reduce of G gradient bytes: every ring link carries 2(n-1)/n G; ZeRO (reduce-scatter, then
  all-gather of the updated shard) the same; FSDP gathers the parameters twice (forward and backward) and
  reduce-scatters the gradients once: 3(n-1)/n G;
- PP: per microbatch one activation forward and one gradient back per link, A bytes each; an interleaved
  schedule of v chunks runs every link v times and the wrap-around link (last stage to first) v-1 times;
- EP all-to-all: per microbatch, per MoE layer, per pass (forward, backward), a dispatch and a combine, each
  member sending E bytes to each other member; expert gradients ring-reduced over the expert-DP groups
  (dp/ep members): 2(k-1)/k of their bytes per link.
TP is not modelled: Megatron keeps it inside a host (NVLink), where no flow exporter sees it.
"""

from __future__ import annotations

from collections import defaultdict

from rankscope.analysis.network.expected import expected_traffic
from rankscope.analysis.report.strategy import Strategy, WhiteboxDetail
from rankscope.collectors.errors import ConfigError

AXES = ("tp", "cp", "dp", "pp")
"""rank-order axes; EP is carved out of DP (consecutive DP ranks), not an axis of its own."""
DEFAULTS = {"tp": 1, "cp": 1, "dp": 1, "pp": 1, "ep": 1, "microbatches": 1, "virtual_stages": 1,
            "activation_bytes": 0.0, "gradient_bytes": 0.0, "expert_bytes": 0.0, "moe_layers": 0,
            "expert_gradient_bytes": 0.0,
            "data_parallel": "ring", "rank_order": "tp-pp-dp", "endpoints": None}


def _checked(config: dict, where: str) -> dict:
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; expected some of {sorted(DEFAULTS)}")
    c = {**DEFAULTS, **config}
    for k in ("tp", "cp", "dp", "pp", "ep", "microbatches", "virtual_stages"):
        if not isinstance(c[k], int) or c[k] < 1:
            raise ConfigError(f"{where}: {k} = {c[k]!r}; expected a whole number >= 1")
    for k in ("activation_bytes", "gradient_bytes", "expert_bytes", "expert_gradient_bytes", "moe_layers"):
        try:  # YAML 1.1 reads 5.0e7 (no exponent sign) as a string: sizes are numbers written any way
            c[k] = float(c[k])
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: {k} = {c[k]!r}; expected a number of bytes (or layers)") from None
        if c[k] < 0:
            raise ConfigError(f"{where}: {k} = {c[k]!r}; expected >= 0")
    if c["dp"] % c["ep"]:
        raise ConfigError(f"{where}: ep = {c['ep']} does not divide dp = {c['dp']} (EP is carved out of DP)")
    if c["data_parallel"] not in ("ring", "zero", "fsdp"):
        raise ConfigError(f"{where}: data_parallel = {c['data_parallel']!r}; expected ring, zero or fsdp")
    order = c["rank_order"].split("-")
    if sorted(order) != sorted(set(order)) or not set(order) <= set(AXES) or not {"tp", "dp", "pp"} <= set(order):
        raise ConfigError(f"{where}: rank_order = {c['rank_order']!r}; expected axes of {'-'.join(AXES)}, "
                          "fastest first, tp, dp and pp among them")
    c["order"] = order
    return c


def _groups(c: dict, world: int, axis: str) -> list[list[int]]:
    """Ranks that differ only along ``axis``, in that axis' order (rank order: the fastest axis first)."""
    stride, s = {}, 1
    for a in c["order"]:
        stride[a] = s
        s *= c[a]
    seen, out = set(), []
    for r in range(world):
        base = r - ((r // stride[axis]) % c[axis]) * stride[axis]
        if base not in seen:
            seen.add(base)
            out.append([base + i * stride[axis] for i in range(c[axis])])
    return out


def declared_strategy(config: dict, where: str = "job config") -> tuple[Strategy, dict]:
    """The Strategy a declared job implies (members are endpoint names) and its checked config."""
    c = _checked(config, where)
    world = c["tp"] * c["cp"] * c["dp"] * c["pp"]
    names = c["endpoints"] or [str(r) for r in range(world)]
    if len(names) != world:
        raise ConfigError(f"{where}: {len(names)} endpoints for a world of {world} ranks; expected one per rank")

    def named(groups):
        return [[str(names[r]) for r in g] for g in groups]
    dp = _groups(c, world, "dp")
    ep = [g[i:i + c["ep"]] for g in dp for i in range(0, len(g), c["ep"])] if c["ep"] > 1 else None
    s = Strategy(world_size=world, dp=c["dp"], pp=c["pp"], tp=c["tp"], ep=c["ep"] if c["ep"] > 1 else None,
                 dp_groups=named(dp), pp_groups=named(_groups(c, world, "pp")),
                 ep_groups=named(ep) if ep else None, method="declared",
                 whitebox=WhiteboxDetail(interleaved=c["virtual_stages"] > 1, groups_unknown=[], cp_groups=None))
    return s, c


def declared_traffic(config: dict, where: str = "job config") -> list[dict]:
    """One row per directed pair and class: src, dst, class, bytes_per_step (largest first)."""
    s, c = declared_strategy(config, where)
    n, m, v = c["dp"], c["microbatches"], c["virtual_stages"]
    k = n // c["ep"]  # expert-data-parallel group size
    dp_factor = {"ring": 2, "zero": 2, "fsdp": 3}[c["data_parallel"]]
    per_class = {"dp": dp_factor * (n - 1) / n * c["gradient_bytes"] if n > 1 else 0.0,
                 "pp_activation": v * m * c["activation_bytes"], "pp_gradient": v * m * c["activation_bytes"],
                 "pp_wrap": (v - 1) * m * c["activation_bytes"],
                 "ep": m * c["moe_layers"] * 2 * 2 * c["expert_bytes"],
                 "expert_dp": 2 * (k - 1) / k * c["expert_gradient_bytes"] if k > 1 else 0.0}
    rows: dict = defaultdict(float)
    for (a, b), classes in expected_traffic(s).items():
        for k in classes:
            rows[(a, b, k)] += per_class[k]
    out = [{"src": a, "dst": b, "class": k, "bytes_per_step": x} for (a, b, k), x in rows.items()]
    return sorted(out, key=lambda r: (-r["bytes_per_step"], r["src"], r["dst"], r["class"]))
