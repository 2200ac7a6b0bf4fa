"""Checks on the paths a command reads and writes, so every command answers one condition one way.

- A store that must exist and does not: :class:`UsageError` (exit 2), whatever the command.
- An output that cannot be created (a folder under a plain file, no permission, a full disk):
  :class:`OutputPathError` (exit 1) naming the path and the reason, never a traceback.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from rankscope.collectors.errors import RankscopeError, UsageError


class OutputPathError(RankscopeError):
    """An output file or folder could not be created or written (exit 1)."""


def _reason(e: OSError) -> str:
    return f"{type(e).__name__}: {e.strerror or e}"


def existing_store(path: str | os.PathLike, option: str = "--store"):
    """The Store at ``path``; UsageError (exit 2) when it is not an existing directory."""
    from rankscope.collectors.store import Store

    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"{option} {str(p)!r}: expected an existing trace store directory, "
                         f"found {'a file' if p.exists() else 'nothing'} there")
    return Store(p)


def output_dir(path: str | os.PathLike, option: str) -> Path:
    """Create (if needed) the folder ``path`` and check it is writable; OutputPathError otherwise."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(f"{option} {str(p)!r}: cannot create this folder ({_reason(e)})") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise OutputPathError(f"{option} {str(p)!r}: the folder is not writable")
    return p


def output_file(path: str | os.PathLike, option: str) -> Path:
    """Check that the file ``path`` can be written (its folder created); OutputPathError otherwise."""
    p = Path(path)
    if p.is_dir():
        raise OutputPathError(f"{option} {str(p)!r}: is a folder, expected a file name")
    output_dir(p.parent if str(p.parent) else Path("."), option)
    return p


@contextlib.contextmanager
def writing(path: str | os.PathLike, option: str) -> Iterator[Path]:
    """Turn an OSError raised while writing ``path`` into OutputPathError naming it."""
    try:
        yield Path(path)
    except OSError as e:
        raise OutputPathError(f"{option} {str(path)!r}: could not write ({_reason(e)})") from None

def write_atomic(path: str | os.PathLike, data: bytes | str, option: str, gzip_level: int | None = None) -> Path:
    """Write ``data`` to a temporary name beside ``path``, then rename it into place: a full disk or a
    crash leaves the previous file (or none), never a cut-off one. OutputPathError names ``path``."""
    import uuid

    p = Path(path)
    tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex[:12]}.tmp")
    raw = data.encode() if isinstance(data, str) else data
    try:
        if gzip_level is not None:
            import gzip

            with gzip.open(tmp, "wb", compresslevel=gzip_level) as f:
                f.write(raw)
        else:
            tmp.write_bytes(raw)
        os.replace(tmp, p)
    except OSError as e:
        raise OutputPathError(f"{option} {str(p)!r}: could not write ({_reason(e)}); the previous file, if "
                              "any, is unchanged") from None
    finally:
        tmp.unlink(missing_ok=True)
    return p


def pick_job(store, job: str | None, what: str) -> str:
    """The job to read: the one named, else ``default``, else the store's only job."""
    jobs = store.jobs()
    if job is not None:
        if job not in jobs:
            raise UsageError(f"{what}: job {job!r} not in store {store.root}; it holds {jobs}")
        return job
    if "default" in jobs:
        return "default"
    if len(jobs) == 1:
        return jobs[0]
    if not jobs:
        raise RankscopeError(f"{what}: store {store.root} holds no records")
    raise UsageError(f"{what}: store {store.root} holds jobs {jobs}; name one with --job/--baseline-job")
