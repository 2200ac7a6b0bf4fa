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
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers.contract import ImportBatch, ImportOptions

REQUIRED = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc", "mb_id")

MAX_SECONDS = 1e9
"""Relative times beyond this (31 years) cannot be real and would overflow int64 nanoseconds."""
_TYPES = {"dp_rank": pl.Int32, "stage": pl.Int32, "rank": pl.Int32, "step": pl.Int64, "seq_id": pl.Int64,
          "mc": pl.Int64, "mb_id": pl.Int32, "start_ts": pl.Float64, "duration": pl.Float64, "optype": pl.String}


def _typed(df: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray]:
    """Required columns in their working types, and a mask of rows where a value did not convert
    (text in a number column, 2**64 in a rank): those rows are rejected, not fatal."""
    wrong = np.zeros(df.height, dtype=bool)
    cols = []
    for c, t in _TYPES.items():
        src = df[c]
        try:
            cast = src.cast(t, strict=False)
        except Exception:  # noqa: BLE001 - polars raises several types for impossible casts
            cast = pl.Series(c, [None] * df.height, dtype=t)
        wrong |= (src.is_not_null() & cast.is_null()).to_numpy()
        cols.append(cast.alias(c))
    return df.with_columns(cols), wrong


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


def read_layout(path: Path) -> dict:
    """The layout of a ``meta-<X>.yaml``; InputFormatError when it is not a mapping of sizes."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
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

    def read(self, path: Path, opts: ImportOptions) -> ImportBatch:
        try:
            # Arrow's reader, not polars': the store writes its parts with Arrow, so this is code the
            # process runs anyway; polars' own reader paged in ~6 MiB more of its library (peak RSS)
            df = pl.from_arrow(pq.ParquetFile(path).read())
        except Exception as e:  # noqa: BLE001 - pyarrow/polars raise several types for corrupt files
            raise InputFormatError(path, "footer", "a readable Parquet file", got=str(e)[:200]) from e
        missing = [c for c in REQUIRED if c not in df.columns]
        if missing:
            raise InputFormatError(path, "header", f"columns {', '.join(REQUIRED)}", got=f"missing {missing}")
        batch = ImportBatch(relative_time=True)
        meta = meta_path(path)
        layout = read_layout(meta) if meta is not None else {}
        batch.notes["layout"] = layout
        batch.notes["meta"] = str(meta) if meta is not None else None
        layout = {k: v for k, v in layout.items() if v is not None}
        df, wrong = _typed(df)
        df = df.with_row_index("_row")
        bad = {"whatif_parquet: value of the wrong type or out of range": wrong, **self._bad_rows(df)}
        for reason, mask in bad.items():
            n = int(mask.sum())
            if n:
                first = int(df["_row"].filter(pl.Series(mask))[0])
                batch.reject(reason, f"{path} row {first}: {reason}", count=n)
        keep = np.ones(df.height, dtype=bool)
        for mask in bad.values():
            keep &= ~mask
        if not keep.all():  # the common case keeps every row: no copy (a tenth of a small trace's read)
            df = df.filter(pl.Series(keep))
        if df.height == 0:
            return batch
        # float seconds -> int ns; the trace is relative already, shifted so it starts at 0 at the latest.
        t0 = min(float(df["start_ts"].min()), 0.0)
        df = df.with_columns(
            ((pl.col("start_ts") - t0) * 1e9).round().cast(pl.Int64).alias("start_ns"),
            ((pl.col("start_ts") + pl.col("duration") - t0) * 1e9).round().cast(pl.Int64).alias("end_ns"),
            pl.when(pl.col("mb_id") >= 0).then(pl.col("mb_id")).cast(pl.Int32).alias("microbatch"),
            pl.col("dp_rank").cast(pl.Int32), pl.col("stage").cast(pl.Int32),
            pl.col("rank").cast(pl.Int32), pl.col("seq_id").cast(pl.Int64).alias("seq"))
        # Without --job each trace is its own job, named as its meta file names it (else trace-<X>).
        m = _TRACE.match(path.name)
        job = opts.job or layout.get("trial_name") or (m["name"] if m else None)
        job_col = [pl.lit(job, dtype=pl.String).alias("job")] if job else []
        batch.add("compute_op", self._compute(df).with_columns(job_col))
        batch.add("comm_op", self._comm(df).with_columns(job_col))
        return batch

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
    def _compute(df: pl.DataFrame) -> pl.DataFrame:
        c = df.filter(pl.col("optype").is_in(list(COMPUTE_OPTYPES)))
        return c.select(
            "rank", pl.col("optype").alias("name"),
            pl.col("optype").replace_strict(COMPUTE_OPTYPES, return_dtype=pl.String).alias("category"),
            "start_ns", "end_ns", "step", "microbatch", "stage", "dp_rank", "optype", "seq")

    @staticmethod
    def _comm(df: pl.DataFrame) -> pl.DataFrame:
        c = df.filter(pl.col("optype").is_in(list(COMM_OPTYPES)))
        ops = {k: v[0] for k, v in COMM_OPTYPES.items()}
        streams = {k: v[1] for k, v in COMM_OPTYPES.items()}
        # p2p peer: the same dp rank on the neighbouring stage, from the (dp_rank, stage) -> rank layout.
        where = df.group_by("dp_rank", "stage").agg(pl.col("rank").first().alias("peer"))
        delta = (pl.when(pl.col("optype").is_in(["forward-send", "backward-recv"])).then(1)
                 .when(pl.col("optype").is_in(["backward-send", "forward-recv"])).then(-1))
        c = c.with_columns((pl.col("stage") + delta).cast(pl.Int32).alias("peer_stage"))
        c = c.join(where.rename({"stage": "peer_stage"}), on=["dp_rank", "peer_stage"], how="left")
        return c.select(
            "rank", pl.col("optype").replace_strict(ops, return_dtype=pl.String).alias("op"),
            pl.col("peer").cast(pl.Int32), "start_ns", "end_ns", "seq", "step", "microbatch", "stage",
            pl.col("optype").replace_strict(streams, return_dtype=pl.String).alias("stream"),
            "dp_rank", "optype", pl.lit("completed").alias("state"))


WHATIF_PARQUET = _WhatifParquet()
