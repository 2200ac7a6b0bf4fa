"""Ingest files into a store with Ray tasks: each file's decode and part writes run in a task of its own.

The driver does what a serial ingest does around the decode (collectors.ingest.files: which files, in which
order) and commits each file in that order as its task returns (collectors.ingest.staged: the parts move
into the store and the manifest entry is written under the store's writer lock), so the store ends up with
the rows, manifest entries, rejects and messages of ``rankscope ingest`` on the same files. A flow file whose
exporters already have template state in the store (written by an earlier file) cannot be decoded ahead of
those files: its task's work is dropped and a second task ingests it the serial way, once the files before
it are committed. Tasks run on the cluster of runner.on_ray (:func:`ray_session`), measured by its
:class:`RayMapper`; the store must be on a path every node sees.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from rankscope.analysis.runner.on_ray import RayMapper, ray_session
from rankscope.collectors.importers import contract
from rankscope.collectors.ingest import files, staged
from rankscope.collectors.record_class import record
from rankscope.collectors.store import Store


@record
class FileTask:
    """One file of the ingest, as a task's first argument (``name`` labels its peak in RayMapper.peaks)."""

    name: str
    file: str
    index: int


def _stage(task: FileTask, store_root: str, fmt: str, opts: contract.ImportOptions, lim: contract.Limits,
           area: str) -> staged.Staged:
    return staged.stage_file(store_root, task.file, fmt, opts, lim, os.path.join(area, str(task.index)))


def _ingest_serially(task: FileTask, store_root: str, fmt: str, opts: contract.ImportOptions,
                     lim: contract.Limits) -> files.FileResult:
    return files.ingest_file(Store(store_root), Path(task.file), fmt, opts, lim)


@record(frozen=False)
class RayIngest:
    """What :func:`ingest_with_ray` did: the serial ingest's summary, and which files went which way."""

    summary: files.IngestSummary
    in_order: list[str]
    """files ingested the serial way, one after another (template state of their exporters was in the store)"""


def ingest_with_ray(store_root: str, paths, fmt: str = "auto", opts: contract.ImportOptions | None = None,
                    lim: contract.Limits | None = None, address: str | None = None, num_cpus: int | None = None,
                    mapper: RayMapper | None = None,
                    progress: Callable[[Iterable], Iterable] | None = None) -> RayIngest:
    """``collectors.ingest.files.ingest`` with one Ray task per file (see the module).

    ``address`` names an existing cluster; without it (and without an open :func:`ray_session`) a local one
    on 127.0.0.1 is started for the call. ``mapper``: its ``max_calls`` and ``peaks`` serve these tasks.
    ``progress`` wraps the files' commits (one item per file, in order), as the serial ingest's wraps its files."""
    opts = opts or contract.ImportOptions()
    lim = lim or contract.Limits()
    summary, todo = files.files_to_ingest(paths, fmt, opts)
    store = Store(store_root)
    m = mapper or RayMapper()
    in_order: list[str] = []
    with ray_session(address, num_cpus), staged.staging_area(store) as area:
        tasks = [FileTask(p.name, str(p), i) for i, p in enumerate(todo)]
        args = [(t, str(store.root), fmt, opts, lim, str(area)) for t in tasks]
        done = zip(tasks, m(_stage, args), strict=True)
        for task, st in (progress(done, total=len(tasks)) if progress else done):
            res = staged.commit_staged(store, st, opts)
            if res is None:
                # every file before it is committed now: the serial ingest sees the state it would have
                [res] = list(m(_ingest_serially, [(task, str(store.root), fmt, opts, lim)]))
                in_order.append(task.file)
            summary.files.append(res)
    return RayIngest(summary, in_order)
