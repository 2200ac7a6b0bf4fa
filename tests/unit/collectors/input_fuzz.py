"""A structure-aware fuzzer over every non-flow input format (the flow decoders have their own).

Seeds are small valid files of each format, built by the unit tests' own builders. Each fuzzed
file is one seed with mutations that keep enough structure to get past format detection and
reach the decoders: values replaced by huge numbers (2**64, 1e308), text where numbers belong,
containers where scalars belong, deep nesting, deleted keys, quoted newlines, extra fields, and
plain byte damage (bit flips, truncation, huge length fields, repeated chunks).

The oracle is the ingest engine's own report: an error other than a RankscopeError reaching the
file boundary counts as a traceback (``FileResult.unexpected``); every other outcome (records
stored, records rejected by reason, one clear per-file error) is fine. Used by
``test_input_fuzz.py`` (fixed seed, ~60 s) and ``benchmarks/bench_input_fuzz.py`` (>= 10,000 files).
"""

from __future__ import annotations

import copy
import gzip
import json
import pickle
import random
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from rankscope.collectors.importers.contract import Limits
from rankscope.collectors.ingest.files import ingest_file
from rankscope.collectors.store import Store

HUGE = [2**64, 2**63, -(2**63) - 1, 10**30, 1e308, -1e308, 1.7976931348623157e308, 2**53 + 1, -1, 0]
WRONG = ["x", "", "12abc", "1e999", "NaN", [], {}, [1, [2]], {"a": 1}, None, True, "\n"]


def _deep(n: int) -> str:
    """A marker that :func:`dumps` expands to n nested lists (json.dumps itself would recurse)."""
    return f"__DEEP_{n}__"


def dumps(obj) -> str:
    text = json.dumps(obj)
    for n in (50, 900, 1100, 5000):
        text = text.replace(f'"__DEEP_{n}__"', "[" * n + "1" + "]" * n)
    return text


def _nodes(obj, path=()):
    """Every (container, key) pair in a JSON-like object, iteratively."""
    out, stack = [], [obj]
    while stack:
        o = stack.pop()
        items = o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()
        for k, v in items:
            out.append((o, k))
            if isinstance(v, (dict, list)):
                stack.append(v)
    return out


def mutate_obj(obj, rng: random.Random, n: int = 3):
    obj = copy.deepcopy(obj)
    nodes = _nodes(obj)
    for _ in range(n):
        if not nodes:
            break
        parent, key = rng.choice(nodes)
        r = rng.random()
        try:
            if r < 0.35:
                parent[key] = rng.choice(HUGE)
            elif r < 0.65:
                parent[key] = copy.deepcopy(rng.choice(WRONG))
            elif r < 0.75:
                parent[key] = _deep(rng.choice([50, 900, 1100, 5000]))
            elif r < 0.85 and isinstance(parent, dict):
                del parent[key]
            elif r < 0.92:
                parent[key] = "A" * rng.choice([1, 1000, 200_000])
            else:
                parent[key] = str(parent[key])
        except (KeyError, IndexError, TypeError):
            continue
    return obj


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    r = rng.random()
    if not b:
        return b"\x00"
    if r < 0.3:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif r < 0.55:
        b = b[: rng.randrange(len(b))]
    elif r < 0.75:
        i = rng.randrange(len(b))
        b[i:i + 4] = rng.choice([b"\xff\xff\xff\xff", b"\xf0\x00\x00\x00", b"\x7f\xff\xff\xff", b"\x00\x00\x00\x00"])
    elif r < 0.9:
        i, j = sorted(rng.randrange(len(b)) for _ in range(2))
        b[j:j] = b[i:j] * rng.randint(1, 20)
    else:
        i = rng.randrange(len(b))
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return bytes(b)


# ------------------------------------------------------------------ seeds per format
def _kineto():
    from tests.unit.collectors.test_kineto_import import gloo_trace

    return gloo_trace()


def _fr():
    from tests.unit.collectors.test_flight_recorder import nccl_dump

    return nccl_dump()


def _profiler_text():
    from tests.unit.collectors.test_nccl_plugins import profiler_lines

    return "\n".join(profiler_lines())


def _inspector_objs():
    from tests.unit.collectors.test_nccl_plugins import inspector_record

    return [inspector_record(i, verbose=i % 2 == 0) for i in range(4)]


def _json_doc(rng, doc, path: Path, gz=False):
    text = dumps(mutate_obj(doc, rng)).encode() if rng.random() < 0.7 else \
        mutate_bytes(json.dumps(doc).encode(), rng)
    path.write_bytes(gzip.compress(text) if gz else text)


def gen_kineto(rng, d: Path) -> Path:
    p = d / (f"rank{rng.randrange(8)}.pt.trace.json" + ("" if rng.random() < 0.8 else ".gz"))
    _json_doc(rng, _kineto(), p, gz=str(p).endswith(".gz"))
    return p


def gen_fr_json(rng, d: Path) -> Path:
    p = d / "rank3.fr.json"
    _json_doc(rng, _fr(), p)
    return p


def gen_fr_pickle(rng, d: Path) -> Path:
    p = d / "nccl_trace_rank_3"
    r = rng.random()
    if r < 0.5:
        try:
            p.write_bytes(pickle.dumps(mutate_obj(_fr(), rng), protocol=rng.choice([2, 4, 5])))
        except RecursionError:
            p.write_bytes(pickle.dumps(_fr()))
    elif r < 0.8:
        p.write_bytes(mutate_bytes(pickle.dumps(_fr()), rng))
    elif r < 0.9:  # deep nesting built by opcodes, with no Python recursion on our side
        n = rng.choice([1000, 100_000])
        p.write_bytes(b"\x80\x02}q\x00X\x07\x00\x00\x00entries" + b"]" * n + b"e" * (n - 1) + b"s.")
    else:  # one entry referenced many times (a memo bomb)
        e = pickle.dumps(_fr()["entries"][0], protocol=2)[2:-1]
        n = rng.choice([10, 20_000])
        body = b"(" + e + b"q\x01" + b"h\x01" * n + b"l"
        p.write_bytes(b"\x80\x02}(X\x07\x00\x00\x00entries" + body + b"X\x07\x00\x00\x00versionX\x03\x00\x00\x002.4u.")
    return p


def gen_profiler(rng, d: Path) -> Path:
    p = d / f"nccl_profiler_rank{rng.randrange(4)}.json"
    lines = _profiler_text().splitlines()
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        line = lines[i]
        try:
            obj = json.loads(line.rstrip(","))
            obj = mutate_obj(obj, rng, 2)
            if rng.random() < 0.2:
                obj["args"] = "SeqNum=3"
            lines[i] = dumps(obj) + ","
        except (ValueError, RecursionError):
            lines[i] = mutate_bytes(line.encode(), rng).decode("latin-1")
    p.write_text("\n".join(lines))
    return p


def gen_inspector(rng, d: Path) -> Path:
    p = d / f"inspector-{rng.randrange(99)}.log"
    objs = [mutate_obj(o, rng, 2) if rng.random() < 0.6 else o for o in _inspector_objs()]
    text = "\n".join(dumps(o) for o in objs).encode()
    p.write_bytes(text if rng.random() < 0.7 else mutate_bytes(text, rng))
    return p


def gen_nsys(rng, d: Path) -> Path:
    from tests.unit.collectors.test_nsys_sqlite import build

    p = d / "report.sqlite"
    build(p)
    if rng.random() < 0.6:
        con = sqlite3.connect(p)
        table, col = rng.choice([("CUPTI_ACTIVITY_KIND_KERNEL", "start"), ("CUPTI_ACTIVITY_KIND_KERNEL", "end"),
                                 ("CUPTI_ACTIVITY_KIND_KERNEL", "gridX"), ("NVTX_EVENTS", "uint64Value"),
                                 ("NVTX_EVENTS", "start"), ("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"),
                                 ("StringIds", "value"), ("CUPTI_ACTIVITY_KIND_RUNTIME", "correlationId")])
        val = rng.choice([2**63 - 1, -(2**63), 1e308, "text", None, "9" * 40, b"\xff\x00"])
        try:
            con.execute(f"UPDATE {table} SET {col} = ?", (val,))
        except sqlite3.Error:
            pass
        con.commit()
        con.close()
    else:
        p.write_bytes(mutate_bytes(p.read_bytes(), rng))
    return p


def gen_whatif(rng, d: Path) -> Path:
    from tests.unit.collectors.test_whatif_parquet import META, tiny_trace

    p = d / "trace-TINY.parquet"
    df = tiny_trace(p)
    (d / "meta-TINY.yaml").write_text(META if rng.random() < 0.7 else mutate_bytes(META.encode(), rng).decode("latin-1"))
    r = rng.random()
    if r < 0.5:
        col = rng.choice(df.columns)
        val = rng.choice([1e308, -1e308, float("inf"), float("nan"), 2.0**64, "x", None])
        try:
            df = df.with_columns(pl.lit(val).alias(col))
        except Exception:  # noqa: BLE001 - some replacement types do not fit; keep the seed
            pass
        df.write_parquet(p)
    elif r < 0.8:
        p.write_bytes(mutate_bytes(p.read_bytes(), rng))
    return p


def gen_csv(rng, d: Path) -> Path:
    from tests.unit.collectors.test_ingest import write_comm_csv

    p = d / ("comm_op.csv" if rng.random() < 0.8 else "comm_op.csv.gz")
    plain = d / "seed.csv"
    write_comm_csv(plain, 20)
    rows = plain.read_text().splitlines()
    plain.unlink()
    for _ in range(rng.randint(1, 5)):
        i = rng.randrange(1, len(rows))
        cells = rows[i].split(",")
        j = rng.randrange(len(cells))
        cells[j] = str(rng.choice([2**64, 10**30, 1e308, -1e308, "text", '"a\nb"', '"x,y"', "", "1.5", "[1,2"]))
        if rng.random() < 0.2:
            cells.append("extra")
        rows[i] = ",".join(cells)
    data = "\n".join(rows).encode()
    if rng.random() < 0.2:
        data = mutate_bytes(data, rng)
    p.write_bytes(gzip.compress(data) if p.name.endswith(".gz") else data)
    return p


def gen_store_parquet(rng, d: Path) -> Path:
    p = d / "step_mark-x.parquet"
    df = pl.DataFrame({"rank": [0, 1, 2], "step": [1, 2, 3], "start_ns": [10, 20, 30], "end_ns": [15, 25, 35]})
    col = rng.choice(df.columns)
    val = rng.choice([1e308, 2.0**64, "x", None, -1])
    df.with_columns(pl.lit(val).alias(col)).write_parquet(p)
    if rng.random() < 0.4:
        p.write_bytes(mutate_bytes(p.read_bytes(), rng))
    return p


GENERATORS = {
    "kineto": gen_kineto, "flight_recorder_json": gen_fr_json, "flight_recorder_pickle": gen_fr_pickle,
    "nccl_profiler": gen_profiler, "nccl_inspector": gen_inspector, "nsys_sqlite": gen_nsys,
    "whatif_parquet": gen_whatif, "csv": gen_csv, "store-parquet": gen_store_parquet,
}


@dataclass
class FuzzCounts:
    files: Counter = field(default_factory=Counter)
    """files per seed format."""
    outcomes: Counter = field(default_factory=Counter)
    """(format, status) -> files."""
    records: int = 0
    rejected: int = 0
    tracebacks: list = field(default_factory=list)
    """(format, path, error) of every file whose error was not a RankscopeError."""

    def line(self) -> str:
        st = Counter()
        for (_, s), n in self.outcomes.items():
            st[s] += n
        return (f"{sum(self.files.values()):,} files: {dict(st)}; {self.records:,} records stored, "
                f"{self.rejected:,} rejected; tracebacks {len(self.tracebacks)}")


def run(seed: int, budget_s: float | None = None, max_files: int | None = None, work: Path | None = None,
        keep: Path | None = None) -> FuzzCounts:
    """Fuzz round-robin over the formats until the time or file budget runs out."""
    import shutil
    import tempfile

    rng = random.Random(seed)
    counts = FuzzCounts()
    base = Path(work or tempfile.mkdtemp(prefix="rsfuzz-"))
    t_end = None if budget_s is None else time.monotonic() + budget_s
    names = list(GENERATORS)
    i = 0
    lim = Limits(max_bytes=64 << 20)
    while (t_end is None or time.monotonic() < t_end) and (max_files is None or i < max_files):
        fmt = names[i % len(names)]
        d = base / f"f{i}"
        d.mkdir(parents=True)
        path = GENERATORS[fmt](random.Random(rng.getrandbits(64)), d)
        res = ingest_file(Store(d / "st"), path, lim=lim)
        counts.files[fmt] += 1
        counts.outcomes[(fmt, res.status)] += 1
        counts.records += sum(res.records.values())
        counts.rejected += sum(res.rejects.values())
        if res.unexpected:
            counts.tracebacks.append((fmt, str(path), res.error))
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, keep / f"{i}-{path.name}")
        shutil.rmtree(d, ignore_errors=True)
        i += 1
    if work is None:
        shutil.rmtree(base, ignore_errors=True)
    return counts
