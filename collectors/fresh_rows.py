"""Rows just ingested, held in memory so ``analyze --ingest`` need not read its own Parquet back.

A kind's rows are taken from memory only when they are the whole of what the
store holds for that job: the committed parts of (kind, job) are exactly the
parts this process wrote. Otherwise (an earlier ingest, a live writer, a file
skipped as already stored) that kind is read from the store as usual. Rows are
concatenated in part-path order, the order :meth:`Store.scan` reads them in, so
the frames (and every report built from them) equal a fresh read of the store.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import polars as pl
import pyarrow as pa

from rankscope.collectors.store import Store


class FreshRows:
    def __init__(self, kept: list[tuple[str, str, Path, pa.Table]]):
        self._parts: dict[tuple[str, str], dict[Path, pa.Table]] = defaultdict(dict)
        for kind, job, path, rows in kept:
            self._parts[(kind, job)][Path(path)] = rows

    @classmethod
    def from_summary(cls, summary) -> FreshRows:
        """From an :class:`~rankscope.collectors.ingest.files.IngestSummary` run with ``keep_rows``; the rows move
        here (the summary's references are dropped, so :meth:`frames` can free them)."""
        kept = []
        for f in summary.files:
            kept.extend(f.kept)
            f.kept = []
        return cls(kept)

    def frames(self, store: Store, job: str, kinds: tuple[str, ...]) -> dict[str, pl.DataFrame]:
        """Frames of ``kinds`` for ``job`` that memory holds whole; kinds missing here are read from the store.

        Each job's rows are handed over once (then freed here): a second call reads the store."""
        out = {}
        for kind in kinds:
            held = self._parts.get((kind, job))
            if not held:
                continue
            parts = store.parts(kind, job)
            if sorted(held) != parts:
                continue  # the store holds other rows of this kind too: read them all from it
            tables = [held[p] for p in parts]
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            # columns null in every row are not copied into the frame (load_job broadcasts them): the
            # conversion's copy is then of the filled half of an OSDI'25 trace's columns only
            empty = [n for n, c in zip(table.column_names, table.columns, strict=True) if c.null_count == len(c)]
            if len(empty) == table.num_columns:
                empty = []  # nothing filled (an empty part): converted as it is
            frame = pl.from_arrow(table.drop_columns(empty)).rechunk()
            if empty:
                nulls = pl.from_arrow(table.select(empty).slice(0, 0)).schema
                frame = frame.with_columns(pl.lit(None, dtype=t).alias(c) for c, t in nulls.items()) \
                    .select(table.column_names)
            out[kind] = frame
            del table
            # handed over once: the Arrow copy is not kept beside the frame for the whole analysis
            del self._parts[(kind, job)], tables, held
        return out
