"""JobFrames: one job's record kinds loaded from a store, the input of every analysis."""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from rankscope.collectors.record_class import record
from rankscope.collectors.store import Store

if TYPE_CHECKING:
    from rankscope.collectors.fresh_rows import FreshRows

KINDS_FOR_ANALYSIS = ("comm_op", "compute_op", "flow", "step_mark", "batch_meta", "endpoint_map")


@record(frozen=False)
class JobFrames:
    """The record kinds of one job as polars DataFrames (empty frames where absent)."""

    job: str
    comm_op: pl.DataFrame
    compute_op: pl.DataFrame
    flow: pl.DataFrame
    step_mark: pl.DataFrame
    batch_meta: pl.DataFrame
    endpoint_map: pl.DataFrame
    relative_time: bool = False
    """True when some source of the job has relative (not epoch) times."""
    sources: list[str] = field(default_factory=list)
    """distinct ``source`` values of the records (kineto, hook, ipfix, simulator, ...)."""
    rejects: dict[str, int] = field(default_factory=dict)
    """rejected records per reason, from the manifest (for data_quality)."""
    declared: list[dict] = field(default_factory=list)
    """world sizes the sources declare, one ``{format, world_size, source}`` per source file that names one
    (Kineto ``distributedInfo.world_size``, the OSDI'25 meta ``world_size`` with its ``tp_size``)."""
    source_ranks: list[int] = field(default_factory=list)
    """ranks that a source file of the job is one rank's of (its manifest notes' ``rank``), records or not:
    a flight-recorder dump of unfinished calls only is empty for a rank with none, and that rank is not
    absent input, it had nothing open."""
    named_groups: list[dict] = field(default_factory=list)
    """process groups the job named, ``{desc, ranks}`` each once (flight-recorder and Kineto ``pg_config``
    descs: Megatron's TENSOR_MODEL_PARALLEL_GROUP, torch DeviceMesh's mesh_tp, ...)."""
    job_endpoints: tuple[str, ...] = ()
    """a capture's job: the addresses job recognition found to be one job (its rails were merged on the
    whole capture, where the evidence is; the job's own flows may lack it)."""

    @classmethod
    def from_frames(cls, job: str, **frames: pl.DataFrame) -> JobFrames:
        """Build from any subset of kinds (the rest empty), e.g. in tests and the simulator."""
        from rankscope.collectors.schema import empty

        full = {k: frames.get(k, pl.from_arrow(empty(k))) for k in KINDS_FOR_ANALYSIS}
        # a select, not df["source"]: that would write a broadcast column's rows into the frame
        srcs = sorted({s for df in full.values() if "source" in df.columns
                       for s in df.select(pl.col("source").drop_nulls().unique()).to_series().to_list()})
        return cls(job=job, sources=srcs, **full)


def load_job(store: Store, job: str, flow_job: str | None = None, fresh: FreshRows | None = None) -> JobFrames:
    """Read one job's records. ``flow_job`` names the flow capture to attach (default: same job).

    ``fresh``: rows this process just ingested; kinds it holds whole are taken from memory, not re-read."""
    store = store.snapshot()  # one set of commits for every kind and the manifest
    held = fresh.frames(store, job, KINDS_FOR_ANALYSIS) if fresh is not None else {}
    frames = {k: constants_unstored(held[k] if k in held else store.read(k, job)) for k in KINDS_FOR_ANALYSIS}
    if flow_job is not None and flow_job != job:
        frames["flow"] = constants_unstored(store.read("flow", flow_job))
    jf = JobFrames.from_frames(job, **frames)
    man = [m for m in store.manifest() if job in m.job.split(",") or m.job == job]
    jf.relative_time = any(m.relative_time for m in man)
    seen_named: set[tuple] = set()
    own: set[int] = set()
    for m in man:
        for reason, n in m.rejects.items():
            jf.rejects[reason] = jf.rejects.get(reason, 0) + n
        r = m.notes.get("rank")
        if isinstance(r, int) and not isinstance(r, bool):
            own.add(r)
        _add_named(jf, m.notes.get("pg_named"), seen_named)
        d = declared_world(m.format, m.notes)
        if d is not None:
            jf.declared.append({**d, "source": m.source})
    jf.source_ranks = sorted(own)
    return jf


def constants_unstored(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with each column that holds one value in every row (null included) as a broadcast of that
    value, which holds no per-row buffer, and is kept one through selects, filters, joins and sorts.

    A file's records repeat what its format or its source fixes: the job, the source path, a state, and the
    schema's columns the format does not fill (stored as typed nulls). On the OSDI'25 AR trace tiled 16x that
    is 30 of comm_op's and compute_op's 52 columns; the five filled ones (job, source, state) took 45 of their
    179 MB, and every filter and copy of the frames carried them (peak of ``analyze --ingest`` 1,202-1,205 ->
    1,051-1,149 MiB, 4 runs)."""
    if df.height < 2:
        return df
    # null counts first: a broadcast null reads its count without its rows, where df.get_column would write them
    # into the frame (and an all-null column is one value already)
    counts = df.null_count().row(0)
    same = [c for c, n in zip(df.columns, counts, strict=True)
            if n == df.height or (n == 0 and _one_value(df.get_column(c)))]
    if not same:
        return df
    return df.with_columns(pl.col(c).first() for c in same)


def _one_value(s: pl.Series) -> bool:
    """Whether every row of ``s`` (a column without nulls) holds the same value, bit for bit (a float 0.0 beside
    a -0.0, or a NaN, is not one value; a list column is one when every list equals the first, element by
    element)."""
    if isinstance(s.dtype, pl.List):
        # a hash a row first: lists that differ are told apart without a copy of their values (an explode of
        # a big job's member lists would be hundreds of MB); equal hashes are then checked value by value
        h = s.hash()
        if h.min() != h.max():
            return False
        return bool(s.to_frame().select((pl.col(s.name) == pl.col(s.name).first()).all()).item())
    if s.dtype.is_numeric():
        return _same_elements(s.to_numpy())
    if s.dtype in (pl.String, pl.Boolean) or s.dtype.is_temporal():
        return s[0] == s[-1] and bool((s == s[0]).all())
    return False  # other nested or object types: left as they are


def _same_elements(a: np.ndarray) -> bool:
    """Whether every element of ``a`` equals the first, bit for bit (integers, booleans and floats only)."""
    if a.dtype.kind == "f":
        a = a.view(f"u{a.dtype.itemsize}")
    elif a.dtype.kind not in "iub":
        return False
    return bool(a[-1] == a[0]) and bool((a == a[0]).all())


def _add_named(jf: JobFrames, groups: object, seen: set[tuple]) -> None:
    """Append a source's named groups to ``jf.named_groups``, each (desc, ranks) once (every member's dump
    names its groups)."""
    for g in groups if isinstance(groups, list) else ():
        if isinstance(g, dict) and isinstance(g.get("desc"), str) and isinstance(g.get("ranks"), list):
            ranks = sorted(int(r) for r in g["ranks"])
            if (g["desc"], tuple(ranks)) not in seen:
                seen.add((g["desc"], tuple(ranks)))
                jf.named_groups.append({"desc": g["desc"], "ranks": ranks})


def declared_world(fmt: str, notes: dict) -> dict | None:
    """The world size a source file declares, from its manifest notes (None when it declares none)."""
    layout = notes.get("layout") if isinstance(notes.get("layout"), dict) else {}
    ws = notes.get("world_size", layout.get("world_size"))
    if not isinstance(ws, int) or isinstance(ws, bool) or ws < 1:
        return None
    out = {"format": fmt, "world_size": ws}
    if layout:
        out["layout"] = True  # the source declares the job's layout, not only its size (the OSDI'25 meta)
    for key in ("tp_size", "dsp_size"):
        v = layout.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            out[key] = v
    sizes = [layout.get(k) for k in ("dp_size", "dsp_size", "pp_size", "tp_size")]
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes[:1] + sizes[2:]):
        product = sizes[0] * (sizes[1] if isinstance(sizes[1], int) and sizes[1] > 0 else 1) * sizes[2] * sizes[3]
        if product != ws:
            # the file contradicts itself: its world size is a claim its own layout does not back
            out["doubt"] = f"its dp_size x dsp_size x pp_size x tp_size is {product:,}"
    rank = notes.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= ws:
        out["doubt"] = f"the file's own rank {rank:,} is not below it"
    groups = notes.get("pg_ranks")
    if isinstance(groups, list) and groups:
        out["groups"] = groups  # process-group memberships the source declares (Kineto pg_config)
    return out
