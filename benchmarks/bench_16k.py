"""A larger simulated fabric (issue 40): 16,384 GPUs simulated, then analysed embedded and on a 2-node Ray cluster.

1. ``rankscope simulate`` of TP8 x PP16 x DP128 with flows (BENCH_16K_STEPS steps, BENCH_16K_MICROBATCHES
   microbatches), whole process; the store goes under bench-out/ and is reused while its parameters match.
2. ``rankscope analyze --store S --out-dir R`` with RANKSCOPE_NO_CACHE=1, the embedded engine, whole process
   (targets: < 5 min, < 8 GiB peak RSS).
3. The same analysis with the Ray engine on a local cluster of two raylets on this machine (``ray start --head
   --num-cpus 1`` and a second ``ray start --address ... --num-cpus 1``), driven by a small script that plans with
   :func:`plan_with_ray`, analyses with :func:`analyse_with_ray` with one fresh worker per task (``max_calls=1``,
   so a task's peak RSS is its own) and writes each report as the CLI does (``Diagnosis.to_json``).
4. The reports of 2 and 3 compared key by key, timing fields left out.

Peak RSS of a whole process: ``ru_maxrss`` of the command, forked by the small launcher (spawn_measured.py).
A Ray task's peak: its worker's ``ru_maxrss`` when the task returned (runner.on_ray._measured).

    python benchmarks/bench_16k.py                               # TP8 PP16 DP128, 16 microbatches, 6 steps
    BENCH_16K_DP=8 BENCH_16K_STEPS=3 python benchmarks/bench_16k.py   # a small shape for a quick check
    BENCH_16K_SKIP=ray python benchmarks/bench_16k.py            # skip a stage: simulate, embedded or ray

Env: BENCH_16K_TP/PP/DP (8/16/128), BENCH_16K_MICROBATCHES (16), BENCH_16K_STEPS (6), BENCH_16K_OUT (store and
reports; default bench-out/16k), BENCH_16K_SKIP (comma list), BENCH_16K_TIMEOUT_S (per command, 3600),
BENCH_16K_RAY_PORT (6391). Figures depend on the machine's load: say so when you quote them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from whole_process import BENCH_OUT, RANKSCOPE, compile_bytecode, load_note, run_once  # noqa: E402

TP, PP, DP = (int(os.environ.get(f"BENCH_16K_{k}", d)) for k, d in (("TP", 8), ("PP", 16), ("DP", 128)))
MICROBATCHES = int(os.environ.get("BENCH_16K_MICROBATCHES", 16))
STEPS = int(os.environ.get("BENCH_16K_STEPS", 6))
OUT = Path(os.environ.get("BENCH_16K_OUT", BENCH_OUT / "16k"))
SKIP = set(filter(None, os.environ.get("BENCH_16K_SKIP", "").split(",")))
TIMEOUT_S = float(os.environ.get("BENCH_16K_TIMEOUT_S", 3600))
RAY_PORT = int(os.environ.get("BENCH_16K_RAY_PORT", 6391))
TARGET_WALL_S, TARGET_RSS_GIB = 300.0, 8.0
TIMING_KEYS = {"seconds", "elapsed_s", "wall_s", "generated_at", "created", "analysis_s", "duration_s", "timing", "version"}
"""report fields that say when or how long, not what: left out of the comparison."""

RAY_DRIVER = r'''
import json, os, resource, sys, time
from pathlib import Path
import ray
from rankscope.analysis.diagnose import DiagnoseConfig
from rankscope.analysis.runner import RayMapper, analyse_with_ray, plan_with_ray
store, out, address, peaks_file = sys.argv[1:5]
ray.init(address=address, log_to_driver=False)
config = DiagnoseConfig()
mapper = RayMapper(max_calls=1)  # a fresh worker per task: its peak RSS is the task's own
t = time.perf_counter()
plan = plan_with_ray(store, mapper=mapper)
for planned, d, _tables in analyse_with_ray(store, plan, config, mapper=mapper):
    Path(out, f"{planned.name}.json").write_text(d.to_json())
nodes = sorted({n["NodeID"][:8] for n in ray.nodes() if n["Alive"]})
Path(peaks_file).write_text(json.dumps({"peaks": mapper.peaks, "wall_s": time.perf_counter() - t, "nodes": nodes,
    "driver_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
'''


def _gib(mib: float) -> str:
    return f"{mib / 1024:.2f}"


def simulate(store: Path) -> tuple[float, float] | None:
    stamp = store / ".bench_16k"
    want = json.dumps([TP, PP, DP, MICROBATCHES, STEPS])
    if stamp.exists() and stamp.read_text() == want:
        print(f"simulate: reusing {store} ({want})")
        return None
    shutil.rmtree(store, ignore_errors=True)
    cmd = [*RANKSCOPE, "simulate", "--out", str(store), "--tp", str(TP), "--pp", str(PP), "--dp", str(DP),
           "--microbatches", str(MICROBATCHES), "--steps", str(STEPS)]
    wall, rss, rc, tail, _ = run_once(cmd, timeout_s=TIMEOUT_S)
    if rc != 0:
        raise SystemExit(f"simulate failed (exit {rc}): {tail}")
    stamp.write_text(want)
    return wall, rss


def embedded(store: Path, out: Path) -> tuple[float, float, float]:
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "RANKSCOPE_NO_CACHE": "1"}
    wall, rss, rc, tail, cpu = run_once([*RANKSCOPE, "analyze", "--store", str(store), "--out-dir", str(out)],
                                        env=env, timeout_s=TIMEOUT_S)
    if rc != 0:
        raise SystemExit(f"embedded analyze failed (exit {rc}): {tail}")
    return wall, rss, cpu


def _ray(*args: str, env: dict) -> None:
    ray_bin = Path(sys.executable).with_name("ray")
    r = subprocess.run([str(ray_bin), *args], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"ray {' '.join(args)} failed: {(r.stderr or r.stdout)[-800:]}")


def ray_cluster_run(store: Path, out: Path) -> dict:
    """Start a 2-raylet local cluster, run the driver as a whole process, stop the cluster."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tmp = Path(tempfile.mkdtemp(prefix="r16k-ray-"))
    # token auth: Ray 2.60 here refuses a second node's connection without it (~/.ray/auth_token)
    env = {**os.environ, "RANKSCOPE_NO_CACHE": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}
    address = f"127.0.0.1:{RAY_PORT}"
    common = ["--num-cpus", "1", "--object-store-memory", str(512 << 20), "--disable-usage-stats", "--temp-dir", str(tmp)]
    try:
        _ray("start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(RAY_PORT), "--include-dashboard",
             "false", *common, env=env)
        _ray("start", "--address", address, "--node-ip-address", "127.0.0.1", "--node-manager-port",
             str(RAY_PORT + 11), "--object-manager-port", str(RAY_PORT + 12), "--min-worker-port",
             str(RAY_PORT + 100), "--max-worker-port", str(RAY_PORT + 199), *common, env=env)
        peaks_file = tmp / "peaks.json"
        wall, rss, rc, tail, cpu = run_once([sys.executable, "-c", RAY_DRIVER, str(store), str(out), address,
                                             str(peaks_file)], env=env, timeout_s=TIMEOUT_S)
        if rc != 0:
            raise SystemExit(f"ray analyze failed (exit {rc}): {tail}")
        res = json.loads(peaks_file.read_text())
        return {**res, "wall": wall, "driver_rss_mib": rss}
    finally:
        _stop(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def _stop(tmp: Path) -> None:
    """Stop this cluster's processes only, by pid: those whose command line names its temp dir, and their
    descendants (``ray stop`` would stop every Ray cluster of the machine, other sessions' too)."""
    import signal

    def children(pid: int) -> list[int]:
        out = []
        for t in Path(f"/proc/{pid}/task").glob("*"):
            try:
                out += [int(c) for c in (t / "children").read_text().split()]
            except (OSError, ValueError):
                pass
        return out

    ours = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if str(tmp).encode() in (d / "cmdline").read_bytes():
                    ours.append(int(d.name))
            except OSError:
                pass
    todo, seen = list(ours), set()
    while todo:
        pid = todo.pop()
        if pid not in seen and pid != os.getpid():
            seen.add(pid)
            todo += children(pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in seen:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        time.sleep(2)


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in TIMING_KEYS}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def _diff(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += _diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:80]} != {str(b)[:80]}"]


def compare(a: Path, b: Path) -> list[str]:
    names = sorted({p.name for p in a.glob("*.json")} | {p.name for p in b.glob("*.json")})
    out = []
    for n in names:
        if not (a / n).exists() or not (b / n).exists():
            out.append(f"{n}: written by one engine only")
            continue
        out += [f"{n}{d}" for d in _diff(_strip(json.loads((a / n).read_text())), _strip(json.loads((b / n).read_text())))]
    return out


def main() -> int:
    compile_bytecode()
    OUT.mkdir(parents=True, exist_ok=True)
    store, rep_e, rep_r = OUT / "store", OUT / "reports-embedded", OUT / "reports-ray"
    shape = f"TP{TP} PP{PP} DP{DP} ({TP * PP * DP:,} GPUs), {MICROBATCHES} microbatches, {STEPS} steps"
    print(f"bench_16k: {shape}; {load_note()}", flush=True)
    rows, ok = [], True
    sim = simulate(store) if "simulate" not in SKIP or not store.exists() else None
    if sim:
        rows.append(("simulate (whole process)", f"{sim[0]:.1f}", _gib(sim[1]), "", ""))
    if "embedded" not in SKIP:
        wall, rss, cpu = embedded(store, rep_e)
        met = wall < TARGET_WALL_S and rss / 1024 < TARGET_RSS_GIB
        ok &= met
        rows.append(("analyze embedded (whole process)", f"{wall:.1f}", _gib(rss),
                     f"< {TARGET_WALL_S:.0f} s, < {TARGET_RSS_GIB:.0f} GiB", "met" if met else "MISSED"))
        rows.append(("  its CPU, user+sys", f"{cpu:.1f}", "", "", ""))
    ray_res = None
    if "ray" not in SKIP:
        ray_res = ray_cluster_run(store, rep_r)
        rows.append(("analyze ray, 2 raylets (driver process)", f"{ray_res['wall']:.1f}", _gib(ray_res["driver_rss_mib"]),
                     "same report as embedded", ""))
        for fn, label, peak, pid in ray_res["peaks"]:
            rows.append((f"  task {fn} {label[:30]}", "", _gib(peak / 2**20), f"pid {pid}", ""))
    print(f"{'figure':48} {'wall s':>8} {'peak GiB':>9}  {'target':28} result")
    for r in rows:
        print(f"{r[0]:48} {r[1]:>8} {r[2]:>9}  {r[3]:28} {r[4]}")
    if ray_res is not None and any(rep_e.glob("*.json")):
        diffs = compare(rep_e, rep_r)
        earlier = " (embedded reports from an earlier run)" if "embedded" in SKIP else ""
        print(f"reports embedded vs ray (timing fields left out): {'identical' if not diffs else f'{len(diffs)} differences'}"
              f" over {len(list(rep_e.glob('*.json')))} report(s){earlier}; ray nodes alive: {len(ray_res['nodes'])}")
        for d in diffs[:20]:
            print(f"    {d}")
        ok &= not diffs
    print(f"whole processes, one run each; peak = ru_maxrss of the process (a Ray task: its fresh worker's); {load_note()}")
    return 0 if ok else 1


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"bench_16k: {time.perf_counter() - t0:.0f} s in all")
    sys.exit(rc)
