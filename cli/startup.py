"""Loading a command's libraries without the cyclic garbage collector walking them again and again.

Importing polars, numpy, pyarrow and rankscope's analysis allocates a few hundred thousand objects that live
as long as the process. While they load, the collector runs its young generations over and over, and every
later full collection (the analysis allocates enough to trigger them) walks all of them once more, though
none is ever garbage. Loading them with the collector paused and then freezing them (``gc.freeze``: kept out
of every later collection) took 0.10-0.18 s CPU off ``analyze --ingest`` on the OSDI'25 traces (ST 0.60 ->
0.49 s, AR 1.13 -> 0.95 s, median of 5; peak memory unchanged). The collector runs as usual afterwards for
everything the command allocates.
"""

from __future__ import annotations

import gc
import importlib
import sys


def import_frozen(*modules: str) -> None:
    """Import ``modules`` with the collector paused, then freeze every object that exists so far.

    Does nothing when they are all loaded already: a process that calls the CLI in-process again and again
    (the tests) freezes once, not whatever it holds at each call."""
    if all(name in sys.modules for name in modules):
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
