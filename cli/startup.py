"""Loading a command's libraries without the cyclic garbage collector walking them again and again.

Importing polars, numpy, pyarrow and rankscope's analysis allocates a few hundred thousand objects that live
as long as the process. While they load, the collector runs its young generations over and over, and every
later full collection (the analysis allocates enough to trigger them) walks all of them once more, though
none is ever garbage. Loading them with the collector paused and then freezing them (``gc.freeze``: kept out
of every later collection) took 0.10-0.18 s CPU off ``analyze --ingest`` on the OSDI'25 traces (ST 0.60 ->
0.49 s, AR 1.13 -> 0.95 s, median of 5; peak memory unchanged). The collector runs as usual afterwards for
everything the command allocates.

The rest fits the process to its work before the libraries load: numpy's BLAS without idle threads, one
allocator arena for small inputs, and big blocks handed back to the system when freed.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import types


def import_frozen(*modules: str) -> None:
    """Import ``modules`` with the collector paused, then freeze every object that exists so far.

    Does nothing when they are all loaded already: a process that calls the CLI in-process again and again
    (the tests) freezes once, not whatever it holds at each call."""
    if all(name in sys.modules for name in modules):
        return
    metadata_on_first_use()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def metadata_on_first_use() -> None:
    """Let ``import importlib.metadata`` bind a module that loads when first read, not at the import.

    polars imports ``importlib.metadata`` when it loads (its Iceberg reader asks a package's version, only when
    one scans an Iceberg table), and that pulls in ``email``, ``zipfile`` and ``csv``: 26-31 ms CPU in a fresh
    interpreter, 15-30 ms of ``analyze --ingest`` on the OSDI'25 ST trace (paired medians of 15 and 21 runs),
    whose 0.5 s are mostly start-up. No command of rankscope reads it, so it is mostly never loaded; whatever
    reads an attribute of it loads it then, whole. Nothing when it is loaded already.

    Not ``importlib.util.LazyLoader``: on Python 3.11 every ``import`` statement of a module found in
    ``sys.modules`` reads its ``__spec__`` (is it still initialising?), which loads a lazy module at once."""
    name = "importlib.metadata"
    if name in sys.modules:
        return
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None:
        return
    placeholder = _OnFirstUse(name)
    placeholder.__spec__ = spec
    sys.modules[name] = placeholder
    # as a real import would: `import importlib.metadata` reads it as the package's attribute
    importlib.metadata = placeholder


class _OnFirstUse(types.ModuleType):
    """A module that imports itself on the first read of an attribute other than its name and spec, then
    holds the real module's namespace (so a name bound to it before keeps working)."""

    def __getattribute__(self, attr: str):
        if attr in ("__spec__", "__name__", "__class__", "__dict__"):
            return super().__getattribute__(attr)
        name = super().__getattribute__("__name__")
        # the real import replaces the placeholder in sys.modules, then the placeholder takes its namespace
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)
        ns = super().__getattribute__("__dict__")
        ns.update(real.__dict__)
        self.__class__ = types.ModuleType
        return getattr(real, attr)


def blas_without_threads() -> None:
    """Ask numpy's OpenBLAS for no worker threads, unless the user set a count; only before numpy loads.

    OpenBLAS starts its workers when numpy loads and they spin for work that never comes here: the
    command's linear algebra is a few least-squares fits over short vectors, below the sizes OpenBLAS
    splits across threads. The spinning cost ~0.05 s CPU of ``analyze --ingest`` on the OSDI'25 AR
    trace (0.96 -> 0.90 s, median of 5), a second core that polars could have used."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


MMAP_THRESHOLD_BYTES = 8 << 20
"""Blocks from this size up are mapped on their own by glibc's malloc and handed back when freed, for small
inputs (:func:`big_blocks_returned`): a per-op float64 array from ~1 M ops up."""
MMAP_THRESHOLD_BIG_INPUT_BYTES = 32 << 20
"""The same for inputs over :data:`SMALL_INPUT_BYTES`: glibc's own ceiling for its dynamic threshold."""


def big_blocks_returned(inputs) -> None:
    """Fix glibc malloc's mmap threshold, unless the user tuned malloc: :data:`MMAP_THRESHOLD_BYTES` when the
    files ``inputs`` are small, else :data:`MMAP_THRESHOLD_BIG_INPUT_BYTES`.

    glibc raises the threshold to the size of each mapped block that is freed (up to 32 MiB), and its trim
    threshold to twice that, so after the first big numpy temporary every later one up to that size comes
    from the heap, and freed heap blocks stay in the process: beneath a live block they cannot be trimmed,
    and polars, which allocates from its own jemalloc, cannot reuse them. A what-if builds and drops many
    such arrays (15 MB per float64 at 1.9 M ops): ~215 MiB of freed heap stayed resident through the
    straggler and critical-path sections of AR tiled 16x (a ``malloc_trim`` afterwards gave it back).

    The threshold trades memory for page faults: a block mapped afresh is zeroed by the kernel on first
    touch (numpy asks for huge pages from 4 MiB up), where a reused heap block is not. ``analyze --ingest``
    on AR tiled 16x (4 interleaved runs each, with :func:`lean_allocators`): dynamic 986 MiB mean peak,
    4.61 s; 32 MiB 891 MiB, 4.34 s; 16 MiB 904 MiB, 4.54 s; 8 MiB 856-889 MiB, 4.49-4.63 s; 4 MiB 859 MiB,
    4.86 s. On the OSDI'25 AR trace, whose arrays are mostly below any of these, 0.90 s either way. But
    16,384 simulated GPUs allocate many blocks of 8-32 MiB: at 8 MiB their analysis took 229-243 s against
    157 s; at 32 MiB it took 147 s and peaked at 7.04 GiB against 7.81 (the fixed trim threshold gives the
    heap's top back sooner). Not glibc (no ``mallopt``): nothing to do."""
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                                     "MALLOC_MMAP_MAX_")):
        return
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    small = input_bytes(inputs) <= SMALL_INPUT_BYTES
    m_mmap_threshold = -3  # malloc.h
    threshold = MMAP_THRESHOLD_BYTES if small else MMAP_THRESHOLD_BIG_INPUT_BYTES
    mallopt(ctypes.c_int(m_mmap_threshold), ctypes.c_int(threshold))


SMALL_INPUT_BYTES = 16 << 20
"""Inputs (files on disk) under this size get :func:`lean_allocators`: their whole analysis works on a few tens
of MiB of rows, so what the allocators keep in reserve, not the rows, decides the peak."""


def input_bytes(paths, stop_above: int = SMALL_INPUT_BYTES) -> int:
    """Bytes of the files under ``paths`` (files or directories), counted until the sum passes ``stop_above``
    (a store of a million parts is not walked to the end to learn that it is big)."""
    total = 0
    for p in map(str, paths):
        files = [p] if os.path.isfile(p) else (os.path.join(root, n) for root, _, names in os.walk(p) for n in names)
        for f in files:
            try:
                total += os.stat(f).st_size
            except OSError:
                continue  # vanished or unreadable: the command itself will say so
            if total > stop_above:
                return total
    return total


def lean_allocators(inputs) -> None:
    """One jemalloc arena for polars instead of one per thread (4 per core), and freed pages handed back
    without a lazy stage, when the files ``inputs`` (the command's store and trace paths) are small; only
    before polars loads, and never over the user's own ``_RJEM_MALLOC_CONF`` (what a parent process' polars
    wrote there is not the user's: :func:`_users_jemalloc_conf`).

    The pages one thread of polars' pool frees stay in that thread's arena while the next operation
    allocates in another's, so each arena grows to the largest working set it ever saw: one arena lets
    them be reused (polars appends this to its own decay setting). Peak RSS of ``analyze --ingest`` on the
    OSDI'25 traces: ST 167 -> 165, AR 262 -> 248, SE 255 -> 241 MiB (median of 5), at no CPU cost measured,
    also on AR tiled 8x along DP (940k ops, 2 cores: 3.80 -> 3.74 s CPU, 910 -> 873 MiB). For small
    inputs only (:data:`SMALL_INPUT_BYTES`): with many cores, one arena would serialise polars' threads
    whenever they allocate large buffers (not measured here: 2 cores). A fixed glibc mmap threshold
    (``mallopt``) took another 8 MiB off AR and SE but cost ~0.05 s CPU there and 19% at 8x: not used then;
    see :func:`big_blocks_returned` for the one used now.

    Pages polars frees go back to the system at once after their decay (``muzzy_decay_ms:0``), for small
    inputs too: polars' own setting (500 ms dirty, then 1 s "muzzy") first marks them ``MADV_FREE``, which
    leaves them counted in the process' resident memory until the kernel needs them, so a 5 s analysis
    carries most of what polars freed in its last 1.5 s. Peak of ``analyze --ingest`` on AR tiled 16x
    926-975 -> 889-933 MiB (3 runs each), wall time within the runs' noise. 16,384 simulated GPUs (a big
    input, left to polars' setting): the same peak, and 229 against 243 s without it."""
    if "polars" not in sys.modules and _users_jemalloc_conf() is None and input_bytes(inputs) <= SMALL_INPUT_BYTES:
        os.environ["_RJEM_MALLOC_CONF"] = "narenas:1,muzzy_decay_ms:0"


POLARS_JEMALLOC_CONF = "dirty_decay_ms:500,muzzy_decay_ms:1000"
"""What polars writes into ``_RJEM_MALLOC_CONF`` as it loads, before whatever the variable held (and
``thp:always,metadata_thp:always`` after it under ``POLARS_THP=1``)."""


def _users_jemalloc_conf() -> str | None:
    """The user's own ``_RJEM_MALLOC_CONF``, or None: unset, or only what a parent process' polars wrote.

    A Python program that imported polars hands the variable polars set to every command it starts (the
    benchmarks did: their runs of ``analyze --ingest`` on AR tiled 16x had polars' setting, 871-927 MiB,
    against 804-865 with this one). That is polars' default, not a choice, and polars writes it again
    in this process."""
    conf = os.environ.get("_RJEM_MALLOC_CONF")
    if not conf:
        return None
    rest = conf
    while rest.startswith(POLARS_JEMALLOC_CONF):
        rest = rest[len(POLARS_JEMALLOC_CONF):]
        rest = rest.removeprefix(",thp:always,metadata_thp:always").removeprefix(",")
    return rest or None
