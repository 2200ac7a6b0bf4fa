"""Progress bars that cost nothing when not shown.

tqdm takes ~0.05 s of CPU to import (its version look-up reads package metadata): a tenth of a whole
``analyze --ingest`` on a small trace. A bar is shown only on a terminal, so tqdm is imported only then.
"""

from __future__ import annotations

import sys


class _NoBar:
    def __init__(self, iterable=None):
        self._it = iterable

    def __iter__(self):
        return iter(self._it)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n: int = 1) -> None:
        pass

    def clear(self) -> None:
        pass


def bar(iterable=None, *, hidden: bool = False, **kw):
    """``tqdm(iterable, **kw)`` on a terminal (stderr) unless ``hidden``; otherwise a bar that does nothing."""
    if hidden or not sys.stderr.isatty():
        return _NoBar(iterable)
    from tqdm import tqdm

    return tqdm(iterable, leave=False, **kw)
