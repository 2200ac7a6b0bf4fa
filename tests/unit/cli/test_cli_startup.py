"""cli/startup.py: sizing the inputs, the allocator choice for small ones, big blocks handed back."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from rankscope.cli.startup import SMALL_INPUT_BYTES, input_bytes


def _run(code: str, **env: str) -> dict:
    """``code`` in a fresh interpreter (polars not loaded yet); it prints one JSON line."""
    full = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"} | env
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=full)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_input_bytes_counts_files_and_directories(tmp_path):
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "a.bin").write_bytes(b"x" * 10)
    (tmp_path / "d" / "e" / "b.bin").write_bytes(b"x" * 5)
    (tmp_path / "f.bin").write_bytes(b"x" * 7)
    assert input_bytes([tmp_path / "d", tmp_path / "f.bin"]) == 22
    assert input_bytes([tmp_path / "missing"]) == 0


def test_input_bytes_stops_once_over_the_limit(tmp_path):
    for i in range(5):
        (tmp_path / f"{i}.bin").write_bytes(b"x" * 10)
    assert 10 < input_bytes([tmp_path], stop_above=15) < 50


def _arena_conf(inputs: list[str], **env: str) -> dict:
    code = ("import json, os\nfrom rankscope.cli.startup import lean_allocators\n"
            f"lean_allocators({inputs!r})\nprint(json.dumps({{'conf': os.environ.get('_RJEM_MALLOC_CONF')}}))")
    return _run(code, **env)


def test_one_arena_for_small_inputs_only(tmp_path):
    small, big = tmp_path / "small.parquet", tmp_path / "big.parquet"
    small.write_bytes(b"x" * 100)
    with big.open("wb") as f:  # sparse: its size, not its blocks, is what counts
        f.truncate(SMALL_INPUT_BYTES + 1)
    assert _arena_conf([str(small)]) == {"conf": "narenas:1,muzzy_decay_ms:0"}
    assert _arena_conf([str(small), str(big)]) == {"conf": None}


def test_the_users_allocator_setting_wins(tmp_path):
    (tmp_path / "t.parquet").write_bytes(b"x")
    assert _arena_conf([str(tmp_path)], _RJEM_MALLOC_CONF="narenas:3") == {"conf": "narenas:3"}


def test_what_a_parents_polars_wrote_is_not_the_users_setting(tmp_path):
    """A Python program that imported polars starts rankscope with polars' own setting in the variable (the
    benchmarks did): the small input still gets one arena. What the user added after polars' part stays."""
    (tmp_path / "t.parquet").write_bytes(b"x")
    parents = _run("import json, os, polars\nprint(json.dumps({'conf': os.environ['_RJEM_MALLOC_CONF']}))")["conf"]
    assert parents.startswith("dirty_decay_ms:")  # polars' own, as polars writes it
    ours = {"conf": "narenas:1,muzzy_decay_ms:0"}
    assert _arena_conf([str(tmp_path)], _RJEM_MALLOC_CONF=parents) == ours
    assert _arena_conf([str(tmp_path)], _RJEM_MALLOC_CONF=parents + ",thp:always,metadata_thp:always") == ours
    users = parents + ",narenas:3"
    assert _arena_conf([str(tmp_path)], _RJEM_MALLOC_CONF=users) == {"conf": users}


def test_no_arena_setting_once_polars_is_loaded(tmp_path):
    # polars writes its own setting (decay times) into the variable as it loads, with the user's appended
    code = ("import json, os, polars\nfrom rankscope.cli.startup import lean_allocators\n"
            f"lean_allocators([{str(tmp_path)!r}])\nprint(json.dumps({{'conf': os.environ.get('_RJEM_MALLOC_CONF')}}))")
    assert "narenas" not in (_run(code)["conf"] or "")


_FREED_HEAP = """
import json
import numpy as np
from rankscope.cli.startup import MMAP_THRESHOLD_BYTES as THRESHOLD, big_blocks_returned
assert THRESHOLD + (4 << 20) < 24 << 20  # below the freed block that raises the dynamic threshold
if {fixed}:
    big_blocks_returned({inputs!r})
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
a = np.ones(24 << 20, np.uint8)
del a  # a mapped block freed: glibc's dynamic threshold rises to its size
before = rss()
blocks = [np.ones(THRESHOLD + (4 << 20), np.uint8) for _ in range(10)]
guard = np.ones(1 << 20, np.uint8)  # above them on the heap (no free chunk below fits it): no trim beneath
del blocks
print(json.dumps({{"kept": rss() - before}}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc's mmap threshold")
def test_freed_big_blocks_leave_the_process():
    """Ten arrays just above the threshold, freed: with the fixed threshold they were mapped apart and are
    gone; with glibc's dynamic one (the control) they came from the heap and stay resident."""
    assert _run(_FREED_HEAP.format(fixed=True, inputs=[]))["kept"] < 20 << 20
    assert _run(_FREED_HEAP.format(fixed=False, inputs=[]))["kept"] > 80 << 20


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc's mmap threshold")
def test_the_users_malloc_tuning_wins():
    code = _FREED_HEAP.format(fixed=True, inputs=[])
    assert _run(code, MALLOC_MMAP_THRESHOLD_=str(64 << 20))["kept"] > 80 << 20


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc's mmap threshold")
def test_big_inputs_keep_blocks_below_glibcs_ceiling_on_the_heap(tmp_path):
    """Over SMALL_INPUT_BYTES of input, the threshold is glibc's own 32 MiB ceiling: blocks just above the small
    inputs' threshold come from the heap again (re-mapping them cost 16,384 GPUs' analysis 80 s)."""
    big = tmp_path / "big.parquet"
    with big.open("wb") as f:
        f.truncate(SMALL_INPUT_BYTES + 1)
    assert _run(_FREED_HEAP.format(fixed=True, inputs=[str(big)]))["kept"] > 80 << 20


def test_polars_loads_without_importlib_metadata_which_loads_whole_on_first_use():
    code = (
        "import json, sys\nfrom rankscope.cli.startup import import_frozen\nimport_frozen('polars')\n"
        "before = sorted(m for m in ('email', 'email.message', 'zipfile', 'csv') if m in sys.modules)\n"
        "import importlib.metadata as md\nfrom importlib.metadata import version\n"  # binds, then reads
        "v = version('polars')\nimport polars\n"
        "print(json.dumps({'before': before, 'same': v == polars.__version__, 'reads': md.version('polars') == v,"
        " 'real': type(sys.modules['importlib.metadata']).__name__, 'email': 'email.message' in sys.modules}))")
    got = _run(code)
    # polars imports importlib.metadata as it loads, which pulls in email, zipfile and csv: none is loaded
    assert got["before"] == []
    # the first read loads the real module, and a name bound to the placeholder before works as the module
    assert got == {"before": [], "same": True, "reads": True, "real": "module", "email": True}


def test_metadata_already_loaded_is_left_as_it_is():
    code = ("import json, sys, importlib.metadata\nfirst = sys.modules['importlib.metadata']\n"
            "from rankscope.cli.startup import metadata_on_first_use\nmetadata_on_first_use()\n"
            "print(json.dumps({'same': sys.modules['importlib.metadata'] is first}))")
    assert _run(code) == {"same": True}
