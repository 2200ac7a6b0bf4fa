"""Follow a store as live writers (the hook, the collector) add parts: each poll reads only the parts
that appeared since the last one, so the cost of a poll follows what was written, not the store's size.

Part names never change once written (writers rename a finished temp file into place), so a part seen
once is never read again. A part that cannot be read (removed, or cut short by a full disk) is counted
in ``unreadable`` with its reason and skipped; the other parts still load.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from rankscope.collectors.errors import StoreError
from rankscope.collectors.schema import polars_schema
from rankscope.collectors.store import Store


class StoreTail:
    """New rows of some record kinds of one job, poll by poll."""

    def __init__(self, store: Store, job: str, kinds: tuple[str, ...]):
        self.store, self.job, self.kinds = store, job, kinds
        self.seen: dict[str, set[Path]] = {k: set() for k in kinds}
        self.unreadable: dict[str, str] = {}
        """part path -> why it could not be read."""

    def poll(self) -> dict[str, pl.DataFrame]:
        """Rows of each kind written since the last poll (kinds with no new part are left out)."""
        out = {}
        for kind in self.kinds:
            new = [p for p in self.store.parts(kind, self.job, verify=False) if p not in self.seen[kind]]
            self.seen[kind].update(new)
            new = [p for p in new if self._intact(p)]
            if not new:
                continue
            try:
                out[kind] = self._read(kind, new)
            except (OSError, pl.exceptions.PolarsError):
                # one bad part: read them one by one, so the good ones still load
                frames = [f for f in (self._read_one(kind, p) for p in new) if f is not None]
                if frames:
                    out[kind] = pl.concat(frames, how="vertical_relaxed")
        return out

    def _intact(self, path: Path) -> bool:
        # a live watcher goes on past a damaged part (named in ``unreadable``); commands stop on one
        try:
            self.store.checked([path])
            return True
        except StoreError as e:
            self.unreadable[str(path)] = str(e)
            return False

    def _read(self, kind: str, paths: list[Path]) -> pl.DataFrame:
        # the declared schema unifies parts written before a column was appended (as Store.scan does)
        return pl.scan_parquet([str(p) for p in paths], schema=polars_schema(kind), missing_columns="insert",
                               extra_columns="ignore", hive_partitioning=False).collect()

    def _read_one(self, kind: str, path: Path) -> pl.DataFrame | None:
        try:
            return self._read(kind, [path])
        except (OSError, pl.exceptions.PolarsError) as e:
            self.unreadable[str(path)] = f"{type(e).__name__}: {e}"
            return None
