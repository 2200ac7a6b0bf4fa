"""Importer of the OSDI'25 what-if traces (``trace-<X>.parquet`` + ``meta-<X>.yaml``).

The format of "Understanding Stragglers in Large Model Training Using What-if
Analysis" (OSDI 2025): one row per operation on one worker with the columns
``dp_rank, stage, rank, step, optype, start_ts, duration, seq_id, mc, gmc, mb_id``
(``start_ts``/``duration`` float seconds, relative to the start of the trace).
``meta-<X>.yaml`` beside the trace gives the layout (dp/pp/tp/dsp sizes); it is
read here and never ingested on its own (``companion``).

Compute optypes become ``compute_op`` rows, communication optypes ``comm_op``
rows; both keep the source's own op type (``optype``), its per-stage sequence
number (``seq``) and the data-parallel rank (``dp_rank``), which the what-if
dependency model needs. Times are stored from 0 (relative, marked so).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers.contract import ImportBatch, ImportOptions

REQUIRED = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc", "mb_id")

BATCH_ROWS = 262_144
"""rows per batch of a trace read in batches (larger traces): the ingest's memory follows the batch."""
MAX_SECONDS = 1e9
"""Relative times beyond this (31 years) cannot be real and would overflow int64 nanoseconds."""
_SOURCE_COLUMNS = tuple(c for c in REQUIRED if c != "mc")
"""The trace's columns a record is made of (``mc`` is only checked)."""
_TYPES = {"dp_rank": pl.Int32, "stage": pl.Int32, "rank": pl.Int32, "step": pl.Int64, "seq_id": pl.Int64,
          "mc": pl.Int64, "mb_id": pl.Int32, "start_ts": pl.Float64, "duration": pl.Float64, "optype": pl.String}


_BITS = {pl.Int8: 8, pl.Int16: 16, pl.Int32: 32, pl.Int64: 64, pl.UInt8: 8, pl.UInt16: 16, pl.UInt32: 32,
         pl.UInt64: 64, pl.Float32: 32, pl.Float64: 64}


def _widens(src: pl.DataType, dst: pl.DataType) -> bool:
    """Every value of ``src`` converts to ``dst`` exactly (the authors' traces store int8..int32, float32 and
    dictionary-encoded strings): the same type, a wider integer or float, or categories to strings."""
    if src == dst or (src == pl.Categorical and dst == pl.String):
        return True
    a, b = _BITS.get(src), _BITS.get(dst)
    if a is None or b is None:
        return False
    if src.is_float() or dst.is_float():
        return src.is_float() and dst.is_float() and a <= b
    if src.is_signed_integer():
        return dst.is_signed_integer() and a <= b
    return a < b or (a == b and dst.is_unsigned_integer())


def _typed(df: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray]:
    """Required columns in their working types, and a mask of rows where a value did not convert
    (text in a number column, 2**64 in a rank): those rows are rejected, not fatal."""
    wrong = np.zeros(df.height, dtype=bool)
    cols = []
    for c, t in _TYPES.items():
        src = df[c]
        if c == "optype" and isinstance(src.dtype, (pl.Categorical, pl.Enum)):
            # kept as categories until the rows are split: as text, the whole trace's op types were the
            # largest column the read held, and each split copied them again (AR tiled 16x: the ingest's
            # peak in ``analyze --ingest`` 867 -> 772 MiB)
            cols.append(src)
            continue
        if _widens(src.dtype, t):
            cols.append(src.cast(t, strict=False))  # nothing a cast can lose: not checked (a tenth of the read of these traces)
            continue
        try:
            cast = src.cast(t, strict=False)
        except Exception:  # noqa: BLE001 - polars raises several types for impossible casts
            cast = pl.Series(c, [None] * df.height, dtype=t)
        wrong |= (src.is_not_null() & cast.is_null()).to_numpy()
        cols.append(cast.alias(c))
    return df.with_columns(cols), wrong


def _read_whole(path: Path, pf) -> pl.DataFrame:
    """The required columns of a whole trace; a clear error when its body cannot be decoded."""
    try:
        # in one chunk (the read gives one per row group): a filter keeps its input's chunks, and every later
        # step that needs a column whole (a sort, to_numpy) would copy it again
        return pl.from_arrow(pf.read(columns=list(REQUIRED))).rechunk()
    except Exception as e:  # noqa: BLE001 - pyarrow/polars raise several types for corrupt files
        raise InputFormatError(path, "footer", "a readable Parquet file", got=str(e)[:200]) from e


def _read_batches(path: Path, pf) -> Iterator[pl.DataFrame]:
    """The required columns of a trace, :data:`BATCH_ROWS` rows at a time; a clear error naming the row
    where a page cannot be decoded (the ingest then stores nothing of the file)."""
    it = pf.iter_batches(batch_size=BATCH_ROWS, columns=list(REQUIRED))
    offset = 0
    while True:
        try:
            b = next(it, None)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for corrupt pages
            raise InputFormatError(path, f"row {offset}", "a readable Parquet page", got=str(e)[:200]) from e
        if b is None:
            return
        df = pl.from_arrow(b)
        offset += df.height
        yield df


def _origin_and_peers(parts) -> tuple[float, pl.DataFrame]:
    """(time origin, (dp_rank, stage) -> peer rank) over the kept rows of a trace given in ``parts`` (frames
    with start_ts, dp_rank, stage, rank, in file order): the origin is the earliest start or 0, whichever is
    earlier; a (dp rank, stage) takes the first rank the trace lists for it."""
    lo, firsts = 0.0, []
    for p in parts:
        if p.height:
            lo = min(lo, float(p["start_ts"].min()))
            firsts.append(p.group_by("dp_rank", "stage", maintain_order=True).agg(pl.col("rank").first()))
    if not firsts:
        return lo, pl.DataFrame(schema={"dp_rank": pl.Int32, "stage": pl.Int32, "peer": pl.Int32})
    where = pl.concat(firsts).group_by("dp_rank", "stage", maintain_order=True).agg(pl.col("rank").first())
    return lo, where.rename({"rank": "peer"})


COMPUTE_OPTYPES = {
    "forward-compute": "forward",
    "backward-compute": "backward",
    "optimizer": "optimizer",
    "gc": "gc",
}
"""OSDI compute optype -> compute_op category."""

COMM_OPTYPES = {
    "forward-send": ("send", "pp"),
    "backward-send": ("send", "pp"),
    "forward-recv": ("recv", "pp"),
    "backward-recv": ("recv", "pp"),
    "params-all-gather": ("all_gather", "dp"),
    "grads-reduce-scatter": ("reduce_scatter", "dp"),
    "separate-grads-all-reduce": ("all_reduce", "dp"),
    "embedding-grads-all-reduce": ("all_reduce", "pp"),
    "layernorm-grads-all-reduce": ("all_reduce", "tp"),
    "optimizer-clip-main-grad": ("all_reduce", "dp"),
}
"""OSDI communication optype -> (comm_op op, stream)."""

LAYOUT_KEYS = ("trial_name", "run_id", "dp_size", "dsp_size", "pp_size", "tp_size", "vpp_size", "world_size")

_TRACE = re.compile(r"^trace-(?P<name>.+)\.parquet$")
_META = re.compile(r"^meta-(?P<name>.+)\.ya?ml$")


def meta_path(trace: Path) -> Path | None:
    """The ``meta-<X>.yaml`` (or ``.yml``) beside ``trace-<X>.parquet``, if present."""
    m = _TRACE.match(trace.name)
    if not m:
        return None
    for ext in (".yaml", ".yml"):
        p = trace.with_name(f"meta-{m['name']}{ext}")
        if p.is_file():
            return p
    return None


_FLAT_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*): +(?:(0|[1-9][0-9]*)|([A-Za-z_][A-Za-z0-9_.-]*)) *")
"""A ``key: value`` line whose value YAML reads as a decimal integer or else as a plain string."""
_YAML_WORDS = frozenset(("yes", "no", "true", "false", "on", "off", "null"))
"""Words (in any case) YAML 1.1 may read as a boolean or null, as a key or a value."""


def flat_mapping(text: str) -> dict | None:
    """``text`` as YAML reads it when every line is a :data:`_FLAT_LINE` naming no :data:`_YAML_WORDS`, as the
    OSDI'25 meta files are; None for anything else (comments, quotes, nesting, blank lines, other scalars).

    Importing yaml alone was ~15 ms CPU of ``analyze --ingest`` on those traces; yaml reads whatever this
    leaves."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    out = {}
    for line in lines:
        m = _FLAT_LINE.fullmatch(line)
        if m is None:
            return None
        key, number, word = m.groups()
        if key.lower() in _YAML_WORDS or (word is not None and word.lower() in _YAML_WORDS):
            return None
        out[key] = int(number) if number is not None else word
    return out or None


def read_layout(path: Path) -> dict:
    """The layout of a ``meta-<X>.yaml``; InputFormatError when it is not a mapping of sizes."""
    try:
        text = path.read_text()
    except OSError as e:
        raise InputFormatError(path, None, "a YAML mapping of layout sizes", got=str(e)[:200]) from e
    data = flat_mapping(text)
    if data is None:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InputFormatError(path, None, "a YAML mapping of layout sizes", got=str(e)[:200]) from e
    if not isinstance(data, dict):
        raise InputFormatError(path, None, "a YAML mapping of layout sizes", got=type(data).__name__)
    out = {}
    for k in LAYOUT_KEYS:
        v = data.get(k)
        if k.endswith("_size") and v is not None and (not isinstance(v, int) or v < 1):
            raise InputFormatError(path, k, "a positive integer", got=v)
        out[k] = v
    return out


class _WhatifParquet:
    name = "whatif_parquet"
    source = "whatif_parquet"

    def companion(self, path: Path) -> bool:
        """``meta-<X>.yaml`` is read with its trace, never as a file of its own."""
        m = _META.match(path.name)
        return bool(m) and path.with_name(f"trace-{m['name']}.parquet").is_file()

    def sniff(self, path: Path, head: bytes) -> bool:
        if head[:4] != b"PAR1" or path.suffix != ".parquet":
            return False
        try:
            names = set(pq.read_schema(path).names)
        except Exception:  # noqa: BLE001 - an unreadable footer is simply not this format
            return False
        return set(REQUIRED) <= names

    def read(self, path: Path, opts: ImportOptions) -> ImportBatch | Iterator[ImportBatch]:
        """The trace as one batch, or, past :data:`BATCH_ROWS` rows, as batches of about that many rows
        (the ingest then holds one batch at a time: a 1.9 M-row trace peaked at 0.9 GiB read whole)."""
        try:
            # Arrow's reader, not polars': the store writes its parts with Arrow, so this is code the
            # process runs anyway; polars' own reader paged in ~6 MiB more of its library (peak RSS)
            pf = pq.ParquetFile(path)
            names = pf.schema_arrow.names
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for corrupt files
            raise InputFormatError(path, "footer", "a readable Parquet file", got=str(e)[:200]) from e
        missing = [c for c in REQUIRED if c not in names]
        if missing:
            raise InputFormatError(path, "header", f"columns {', '.join(REQUIRED)}", got=f"missing {missing}")
        meta = meta_path(path)
        layout = read_layout(meta) if meta is not None else {}
        m = _TRACE.match(path.name)
        # Without --job each trace is its own job, named as its meta file names it (else trace-<X>).
        job = opts.job or layout.get("trial_name") or (m["name"] if m else None)
        # in batches only where that bounds the memory: a caller that keeps every row gains nothing from it
        # and would pay the second pass (1.7 s of analyze --ingest on AR tiled 16x)
        if pf.metadata.num_rows <= BATCH_ROWS or opts.rows_kept:
            df = _read_whole(path, pf)
            rows, bad = self._checked(path, df, 0)
            t0, where = _origin_and_peers([rows])
            return self._batch(path, rows, bad, layout, meta, job, t0, where)
        return self._streamed(path, pf, layout, meta, job)

    def _streamed(self, path: Path, pf, layout: dict, meta: Path | None, job: str | None) -> Iterator[ImportBatch]:
        """Two passes over the row batches: the trace's time origin and the (dp rank, stage) -> rank map
        of its p2p peers (both over the kept rows of the whole trace, as a whole read computes them),
        then each batch decoded with them."""

        def batches():
            offset = 0
            for df in _read_batches(path, pf):
                yield self._checked(path, df, offset)
                offset += df.height

        t0, where = _origin_and_peers(rows.select("start_ts", "dp_rank", "stage", "rank") for rows, _ in batches())
        for rows, bad in batches():
            yield self._batch(path, rows, bad, layout, meta, job, t0, where)

    def _checked(self, path: Path, df: pl.DataFrame, offset: int) -> tuple[pl.DataFrame, dict[str, tuple[int, str]]]:
        """(the rows that are kept, in their working types; per reason, (count, message) of those rejected).
        ``offset``: the file row of the frame's first row (messages name file rows)."""
        df, wrong = _typed(df)
        df = df.with_row_index("_row", offset=offset)
        masks = {"whatif_parquet: value of the wrong type or out of range": wrong, **self._bad_rows(df)}
        bad = {}
        for reason, mask in masks.items():
            n = int(mask.sum())
            if n:
                first = int(df["_row"].filter(pl.Series(mask))[0])
                bad[reason] = (n, f"{path} row {first}: {reason}")
        keep = np.ones(df.height, dtype=bool)
        for mask in masks.values():
            keep &= ~mask
        if not keep.all():  # the common case keeps every row: no copy (a tenth of a small trace's read)
            df = df.filter(pl.Series(keep))
        return df, bad

    def _batch(self, path: Path, df: pl.DataFrame, bad: dict, layout: dict, meta: Path | None, job: str | None,
               t0: float, where: pl.DataFrame) -> ImportBatch:
        batch = ImportBatch(relative_time=True)
        batch.notes["layout"] = layout
        batch.notes["meta"] = str(meta) if meta is not None else None
        for reason, (n, message) in bad.items():
            batch.reject(reason, message, count=n)
        if df.height == 0:
            return batch
        # float seconds -> int ns; the trace is relative already, shifted so it starts at 0 at the latest.
        times = (((pl.col("start_ts") - t0) * 1e9).round().cast(pl.Int64).alias("start_ns"),
                 ((pl.col("start_ts") + pl.col("duration") - t0) * 1e9).round().cast(pl.Int64).alias("end_ns"),
                 pl.when(pl.col("mb_id") >= 0).then(pl.col("mb_id")).cast(pl.Int32).alias("microbatch"),
                 pl.col("dp_rank").cast(pl.Int32), pl.col("stage").cast(pl.Int32),
                 pl.col("rank").cast(pl.Int32), pl.col("seq_id").cast(pl.Int64).alias("seq"))
        job_col = [pl.lit(job, dtype=pl.String).alias("job")] if job else []
        batch.add("compute_op", self._compute(self._rows(df, COMPUTE_OPTYPES, times)).with_columns(job_col))
        batch.add("comm_op", self._comm(self._rows(df, COMM_OPTYPES, times), where).with_columns(job_col))
        return batch

    @staticmethod
    def _rows(df: pl.DataFrame, optypes, times) -> pl.DataFrame:
        """The rows of ``df`` whose op type is one of ``optypes``, with the columns ``times`` computes, the op
        type as text. Only the columns read are filtered, and the times computed for those rows alone: a
        filter copies every column it carries, and the times of the whole trace were a third frame beside
        its two halves (AR tiled 16x: the ingest's peak in ``analyze --ingest`` 772 -> 695 MiB)."""
        return df.select(*_SOURCE_COLUMNS).filter(pl.col("optype").is_in(list(optypes))).with_columns(
            *times, pl.col("optype").cast(pl.String))

    @staticmethod
    def _bad_rows(df: pl.DataFrame) -> dict[str, np.ndarray]:
        known = list(COMPUTE_OPTYPES) + list(COMM_OPTYPES)
        rules = {
            "whatif_parquet: unknown optype": ~pl.col("optype").is_in(known),
            "whatif_parquet: null field": pl.any_horizontal([pl.col(c).is_null() for c in REQUIRED]),
            "whatif_parquet: negative duration": pl.col("duration") < 0,
            "whatif_parquet: non-finite time": ~(pl.col("start_ts").is_finite() & pl.col("duration").is_finite()),
            "whatif_parquet: time beyond 1e9 s": (pl.col("start_ts").abs() > MAX_SECONDS)
            | (pl.col("duration").abs() > MAX_SECONDS),
            "whatif_parquet: negative rank": (pl.col("rank") < 0) | (pl.col("dp_rank") < 0) | (pl.col("stage") < 0),
        }
        res = df.select([e.fill_null(True).alias(k) for k, e in rules.items()])
        return {k: res[k].to_numpy() for k in res.columns}

    @staticmethod
    def _compute(c: pl.DataFrame) -> pl.DataFrame:
        """compute_op columns of the compute rows ``c`` (:meth:`_rows`)."""
        return c.select(
            "rank", pl.col("optype").alias("name"),
            pl.col("optype").replace_strict(COMPUTE_OPTYPES, return_dtype=pl.String).alias("category"),
            "start_ns", "end_ns", "step", "microbatch", "stage", "dp_rank", "optype", "seq")

    @staticmethod
    def _comm(c: pl.DataFrame, where: pl.DataFrame) -> pl.DataFrame:
        """comm_op columns of the communication rows ``c`` (:meth:`_rows`). ``where``: the trace's
        (dp_rank, stage) -> rank layout (:func:`_origin_and_peers`)."""
        ops = {k: v[0] for k, v in COMM_OPTYPES.items()}
        streams = {k: v[1] for k, v in COMM_OPTYPES.items()}
        # p2p peer: the same dp rank on the neighbouring stage
        delta = (pl.when(pl.col("optype").is_in(["forward-send", "backward-recv"])).then(1)
                 .when(pl.col("optype").is_in(["backward-send", "forward-recv"])).then(-1))
        # looked up by one packed key (dp rank and stage are non-negative Int32 here): a join gathered every
        # column of the 1.1 M collectives of AR tiled 16x for the one it adds (read: 0.80 -> 0.67 s CPU)
        peer = {(d << 32) + s: r for d, s, r in where.select("dp_rank", "stage", "peer").iter_rows()}
        key = pl.col("dp_rank").cast(pl.Int64) * (1 << 32) + (pl.col("stage") + delta).cast(pl.Int32)
        return c.select(
            "rank", pl.col("optype").replace_strict(ops, return_dtype=pl.String).alias("op"),
            key.replace_strict(peer, default=None, return_dtype=pl.Int32).alias("peer"),
            "start_ns", "end_ns", "seq", "step", "microbatch", "stage",
            pl.col("optype").replace_strict(streams, return_dtype=pl.String).alias("stream"),
            "dp_rank", "optype", pl.lit("completed").alias("state"))


WHATIF_PARQUET = _WhatifParquet()
