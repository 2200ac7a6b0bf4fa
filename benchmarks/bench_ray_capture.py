"""One big flow capture on Ray (issue 40): job recognition split into tasks per partition, then a task per job.

The capture: a simulated shared fabric (two training jobs, storage, checkpoint and rendezvous
background) copied onto BENCH_RAY_COPIES address ranges (each copy its own jobs and servers) and tiled
over time until it holds BENCH_RAY_RECORDS records, written as BENCH_RAY_FILES part files of one store
under bench-out/ (never the repository), each file a window of time, as exporters roll their files.
Generated once per size and reused.

Then, on a local Ray cluster of BENCH_RAY_CPUS CPUs: recognition split into tasks (one per partition,
a second round for the rails when some may be copies, and BENCH_RAY_BUCKETS reduce tasks, by default one
per 4M records, that count the payload bursts per pair so that the driver holds counts, not bursts), and
one task per recognised job reading only its own records. A task's peak RSS is its worker's while it ran
(runner.on_ray._measured resets the peak at each task's start on Linux): what the worker still held from
earlier tasks counts, their peaks do not; with BENCH_RAY_FRESH=1 a fresh worker per task (~2 s of
start-up each, which the wall then includes) holds nothing else. Each peak is printed twice: as measured,
and less the object store pages its worker had mapped when the task started ("own"): Linux counts the
node's one object store (shared memory, sized by Ray) in the RSS of every process that touched its pages,
~1.5 GiB per worker and driver at 100 M records. BENCH_RAY_PARTITION_ROWS sizes the partitions (default
runner.capture_split.PARTITION_ROWS). Printed: total records, wall (recognition, analysis, both), records
per second per core, every task's peak RSS and the driver's. The target, every task under 2 GiB, is read on a
task's own memory (its peak less the object store pages its worker had mapped when it started), as Ray's memory
management guide measures a worker's heap: RSS less shared memory, since the object store's pages are counted
in every process that touched them. The exit status is 1 when a task's own memory passes 2 GiB.

Up to BENCH_RAY_CHECK_MAX records (default 3M) the embedded engine's recognition of the whole capture
runs too, after Ray, and must find the same jobs (it reads the whole capture into this process).

With BENCH_RAY_FROM_FILES=1 the capture is first what exporters write: BENCH_RAY_FILES RFC 5655 IPFIX files
(datasets/ipfix_writer.py: numpy-packed records, two templates, each file its templates first), written once
per size under bench-out/ray_capture/ipfix-*. Each exporter is an observation domain; with fewer exporters
than files, each exporter's time is cut into windows, one file each (as collectors rotate files), and with
more, a file holds several exporters. A fresh store is then filled by `ingest --engine ray`'s code (one Ray
task per file decodes it and writes its parts; the driver commits them in order) before recognition and
analysis read it. Printed besides: the decode alone of one file in this process (records/s/core), the
ingest's wall and records/s/core, and every ingest task's peak. Exporter names are then ``file/<domain>``.

    BENCH_RAY_RECORDS=2000000 python benchmarks/bench_ray_capture.py        # the default size
    BENCH_RAY_RECORDS=100000000 BENCH_RAY_COPIES=32 python benchmarks/bench_ray_capture.py  # issue size
"""

from __future__ import annotations

import os

# as `rankscope analyze` asks (cli/startup.py): OpenBLAS workers only spin here, and Ray's workers inherit it
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import resource
import shutil
import sys
import time
from pathlib import Path

import polars as pl

from rankscope.analysis.diagnose import DiagnoseConfig
from rankscope.analysis.fabric.config import FlowConfig
from rankscope.analysis.fabric.recognise import recognise_jobs
from rankscope.analysis.runner import PlannedJob, RayMapper, analyse_with_ray, ray_session
from rankscope.analysis.runner.capture_split import PARTITION_ROWS, capture_partitions, recognise_split
from rankscope.analysis.runner.ingest_on_ray import ingest_with_ray
from rankscope.analysis.runner.on_ray import object_store_bytes
from rankscope.collectors.flows.flow_importers import IPFIX_FILE
from rankscope.collectors.importers.contract import ImportOptions
from rankscope.collectors.schema import conform
from rankscope.collectors.store import Store
from rankscope.datasets import ipfix_writer
from rankscope.datasets.simulator import SimConfig, simulate_fabric

RECORDS = int(os.environ.get("BENCH_RAY_RECORDS", 2_000_000))
FILES = int(os.environ.get("BENCH_RAY_FILES", 64))
COPIES = int(os.environ.get("BENCH_RAY_COPIES", 4))
CPUS = int(os.environ.get("BENCH_RAY_CPUS", os.cpu_count() or 1))
FRESH = os.environ.get("BENCH_RAY_FRESH", "0") == "1"
BUCKETS = int(os.environ.get("BENCH_RAY_BUCKETS", 0)) or None
PARTITION = int(os.environ.get("BENCH_RAY_PARTITION_ROWS", 0)) or PARTITION_ROWS
CHECK_MAX = int(os.environ.get("BENCH_RAY_CHECK_MAX", 3_000_000))
FROM_FILES = os.environ.get("BENCH_RAY_FROM_FILES", "0") == "1"
OUT = Path(os.environ.get("BENCH_RAY_OUT", Path(__file__).resolve().parents[1] / "bench-out" / "ray_capture"))
TARGET_TASK_BYTES = 2 << 30


def base_capture() -> pl.DataFrame:
    """COPIES fabrics' captures, each on its own address range (first octet 10, 11, ...: own jobs, own servers),
    seed and start time: copies of one timing would be read as rails of one job, rightly."""
    copies = []
    for c in range(COPIES):
        cfgs = [SimConfig(job="a", dp=8, pp=4, gpus_per_host=8, steps=6, seed=1 + 10 * c, gemm_records=False),
                SimConfig(job="b", dp=4, pp=2, tp=2, gpus_per_host=2, steps=6, seed=2 + 10 * c,
                          rank_order="tp-cp-ep-pp-dp", gemm_records=False)]
        flow = pl.from_arrow(simulate_fabric(cfgs, background=True).flow)
        octet = pl.lit(f"{10 + c}.")
        copies.append(flow.with_columns(
            *[(octet + pl.col(col).str.strip_prefix("10.")).alias(col) for col in ("src_addr", "dst_addr", "exporter")],
            *[(pl.col(col) + c * 123_456_789).alias(col) for col in ("start_ns", "end_ns")]))
    return pl.concat(copies)


def generate(store_dir: Path) -> tuple[Store, float]:
    """The store of RECORDS records in FILES parts (reused when it is there already)."""
    t = time.perf_counter()
    store = Store(store_dir)
    if store_dir.exists() and len(store.parts("flow", "fabric")) == FILES:
        return store, 0.0
    shutil.rmtree(store_dir, ignore_errors=True)
    base = base_capture()
    period = int(base["end_ns"].max() - base["start_ns"].min()) + 1_000_000_000
    # the base tiled over time without end, cut into FILES runs of rows: file f holds rows
    # [f * RECORDS // FILES, (f + 1) * RECORDS // FILES) of it, a window of time as an exporter's file is
    for f in range(FILES):
        lo, hi = f * RECORDS // FILES, (f + 1) * RECORDS // FILES
        ks = pl.DataFrame({"_k": list(range(lo // base.height, (hi - 1) // base.height + 1))}, schema={"_k": pl.Int64})
        part = ks.join(base, how="cross").with_columns(
            (pl.col(c) + pl.col("_k") * period).alias(c) for c in ("start_ns", "end_ns")).drop("_k")
        part = part.slice(lo - (lo // base.height) * base.height, hi - lo)
        store.write("flow", conform(part.select(base.columns), "flow"), job="fabric")
    return store, time.perf_counter() - t


def file_plan(exporters: int, files: int) -> list[list[tuple[int, int, int]]]:
    """Per file: (exporter index, window, windows of that exporter) of each exporter's records it holds."""
    if exporters >= files:
        return [[(e, 0, 1) for e in range(f, exporters, files)] for f in range(files)]
    windows = [len(range(e, files, exporters)) for e in range(exporters)]
    return [[(f % exporters, f // exporters, windows[f % exporters])] for f in range(files)]


def generate_files(out: Path) -> tuple[list[Path], float]:
    """The capture of generate() (base tiled over time, cut at RECORDS) as FILES exporters' IPFIX files."""
    paths = [out / f"exporter-{f:03d}.ipfix" for f in range(FILES)]
    done = out / "records.txt"
    if done.exists() and done.read_text().strip() == str(RECORDS) and all(p.exists() for p in paths):
        return paths, 0.0
    t = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    base = base_capture().with_row_index("_i")
    period = int(base["end_ns"].max() - base["start_ns"].min()) + 1_000_000_000
    tiles = -(-RECORDS // base.height)
    last = RECORDS - (tiles - 1) * base.height  # rows of the last tile: the first ones of the base
    exporters = sorted(base["exporter"].unique().to_list())
    written = 0
    for path, holds in zip(paths, file_plan(len(exporters), FILES), strict=True):
        domains = []
        for e, j, w in holds:
            ks = pl.DataFrame({"_k": range(j * tiles // w, (j + 1) * tiles // w)}, schema={"_k": pl.Int64})
            rows = ks.join(base.filter(pl.col("exporter") == exporters[e]), how="cross").filter(
                (pl.col("_k") < tiles - 1) | (pl.col("_i") < last))
            domains.append((e + 1, rows.with_columns((pl.col(c) + pl.col("_k") * period).alias(c)
                                                     for c in ("start_ns", "end_ns"))))
        written += ipfix_writer.write_file(path, domains)
    assert written == RECORDS, (written, RECORDS)
    done.write_text(str(RECORDS))
    return paths, time.perf_counter() - t


def decode_rate(paths: list[Path], at_least: int = 1_000_000) -> tuple[int, int, float]:
    """(files, records, CPU seconds) of the decode alone in this process (the importer's batches, no store) of
    the first files that hold ``at_least`` records, after one untimed pass over the first (lazy imports, caches)."""
    sum(1 for _ in IPFIX_FILE.read(paths[0], ImportOptions()))
    t, n, files = time.process_time(), 0, 0
    for path in paths:
        n += sum(tb.num_rows for b in IPFIX_FILE.read(path, ImportOptions()) for ts in b.tables.values() for tb in ts)
        files += 1
        if n >= at_least:
            break
    return files, n, time.process_time() - t


def ingest_files(store_dir: Path) -> tuple[Store, RayMapper]:
    """The IPFIX files ingested into a fresh store by Ray tasks (needs an open ray_session)."""
    paths, gen_s = generate_files(OUT / f"ipfix-{RECORDS}-{FILES}x{COPIES}")
    size = sum(p.stat().st_size for p in paths)
    print(f"files: {len(paths)} IPFIX files, {size / 2**20:,.0f} MiB, " +
          (f"written in {gen_s:.1f} s ({RECORDS / gen_s:,.0f} records/s)" if gen_s else "reused"), flush=True)
    k, n, cpu = decode_rate(paths)
    print(f"decode alone ({k} files, this process, numpy column-wise path, no store): {n:,} records in {cpu:.2f} s "
          f"CPU, {n / cpu:,.0f} records/s/core", flush=True)
    shutil.rmtree(store_dir, ignore_errors=True)
    mapper = RayMapper(max_calls=1 if FRESH else 0)
    t = time.perf_counter()
    done = ingest_with_ray(str(store_dir), paths, mapper=mapper)
    wall = time.perf_counter() - t
    s = done.summary
    print(f"ingest: {s.records.get('flow', 0):,} records from {s.count('ingested')} files ({s.count('failed')} failed, "
          f"{len(done.in_order)} in order) in {wall:.1f} s wall, {s.records.get('flow', 0) / wall / CPUS:,.0f} "
          f"records/s/core on {CPUS} CPUs", flush=True)
    print_peaks(mapper)
    return Store(store_dir), mapper


def print_peaks(mapper: RayMapper) -> list[int]:
    """Every task's peak as measured and less its worker's object store pages ("own"), then per function;
    the "own" figures."""
    own = [peak - shared for (*_, peak, _), shared in zip(mapper.peaks, mapper.shared)]
    for (fn, label, peak, pid), mine in zip(mapper.peaks, own):
        print(f"  {fn:18s} {label:48s} {peak / 2**20:8.0f}  own {mine / 2**20:6.0f}  pid {pid}")
    for fn in dict.fromkeys(f for f, _, _, _ in mapper.peaks):
        mib = sorted(p / 2**20 for f, _, p, _ in mapper.peaks if f == fn)
        mine = sorted(o / 2**20 for (f, *_), o in zip(mapper.peaks, own) if f == fn)
        print(f"  {fn}: {len(mib)} tasks, peak RSS median {mib[len(mib) // 2]:.0f} MiB, largest {mib[-1]:.0f} MiB; "
              f"less object store pages median {mine[len(mine) // 2]:.0f}, largest {mine[-1]:.0f} MiB")
    return own


def main() -> int:
    with ray_session(num_cpus=CPUS):
        return run()


def run() -> int:
    t_ingest, ingest_mapper = 0.0, None
    if FROM_FILES:
        t_ingest = time.perf_counter()
        store, ingest_mapper = ingest_files(OUT / f"store-from-files-{RECORDS}-{FILES}x{COPIES}")
        t_ingest = time.perf_counter() - t_ingest
    else:
        store, gen_s = generate(OUT / f"store-{RECORDS}-{FILES}x{COPIES}")
    parts = capture_partitions(store, "fabric", PARTITION)
    records = sum(p.num_rows for p in parts)
    print(f"capture: {records:,} records in {len(parts)} partitions ({FILES} files, {COPIES} address copies); "
          + ("ingested from IPFIX files" if FROM_FILES else f"generated in {gen_s:.1f} s" if gen_s else "reused"),
          flush=True)
    config = DiagnoseConfig(flow=FlowConfig())
    mapper = RayMapper(max_calls=1 if FRESH else 0)
    t0 = time.perf_counter()
    found = recognise_split(parts, "fabric", config.flow, mapper, num_buckets=BUCKETS)
    t1 = time.perf_counter()
    plan = [PlannedJob(j.name, "capture", "fabric", tuple(j.endpoints), quality=found.quality) for j in found.jobs]
    verdicts = [(p.name, d.stragglers.verdict) for p, d, _ in
                analyse_with_ray(str(store.root), plan, config, mapper=mapper)]
    t2 = time.perf_counter()
    object_store_mib = object_store_bytes() / 2**20  # before the session ends and unmaps the store
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    wall = t2 - t0
    print(f"jobs: {len(found.jobs)} ({', '.join(f'{n} {v}' for n, v in verdicts)})")
    print(f"wall: recognition {t1 - t0:.1f} s, per-job analysis {t2 - t1:.1f} s, total {wall:.1f} s on {CPUS} CPUs"
          + (f"; before them the ingest {t_ingest:.1f} s (with writing the files when new)" if FROM_FILES else ""))
    rounds = ", ".join(f"{fn} {n} tasks {w:.1f} s" for fn, n, w in mapper.rounds)
    print(f"recognition: {rounds}, the driver's merge and recognition {t1 - t0 - sum(w for *_, w in mapper.rounds):.1f} s")
    print(f"records/s/core: {records / wall / CPUS:,.0f} (recognition alone {records / (t1 - t0) / CPUS:,.0f})")
    print("task peak RSS (MiB)" + (", one fresh worker each:" if FRESH else ", the worker's while the task ran:"))
    own = print_peaks(mapper)
    peaks = [p for m in (mapper, ingest_mapper) if m for _, _, p, _ in m.peaks]
    if ingest_mapper:
        own += [peak - shared for (*_, peak, _), shared in zip(ingest_mapper.peaks, ingest_mapper.shared)]
    over = sum(p > TARGET_TASK_BYTES for p in peaks)
    over_own = sum(o > TARGET_TASK_BYTES for o in own)
    print(f"tasks: {len(peaks)}{' with the ingest' if ingest_mapper else ''}, largest peak {max(peaks) / 2**20:.0f} MiB, "
          f"{over} over 2 GiB; less the object store pages the worker had mapped (the target, < 2048), largest "
          f"{max(own) / 2**20:.0f} MiB, {over_own} over; driver peak {driver / 2**20:.0f} MiB, of which object store "
          f"pages {object_store_mib:.0f} MiB at the end")
    if records <= CHECK_MAX:
        t = time.perf_counter()
        whole = recognise_jobs(store.read("flow", "fabric"), "fabric", config.flow)
        same = whole.jobs == found.jobs and whole.quality == found.quality
        print(f"embedded recognition of the whole capture: {time.perf_counter() - t:.1f} s in one process; "
              f"same jobs and quality: {same}")
        if not same:
            return 1
    return 1 if over_own else 0


if __name__ == "__main__":
    sys.exit(main())
