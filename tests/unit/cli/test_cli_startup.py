"""cli/startup.py: sizing the inputs, the allocator choice for small ones, releasing code pages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
    assert _arena_conf([str(small)]) == {"conf": "narenas:1"}
    assert _arena_conf([str(small), str(big)]) == {"conf": None}


def test_the_users_allocator_setting_wins(tmp_path):
    (tmp_path / "t.parquet").write_bytes(b"x")
    assert _arena_conf([str(tmp_path)], _RJEM_MALLOC_CONF="narenas:3") == {"conf": "narenas:3"}


def test_no_arena_setting_once_polars_is_loaded(tmp_path):
    # polars writes its own setting (decay times) into the variable as it loads, with the user's appended
    code = ("import json, os, polars\nfrom rankscope.cli.startup import lean_allocators\n"
            f"lean_allocators([{str(tmp_path)!r}])\nprint(json.dumps({{'conf': os.environ.get('_RJEM_MALLOC_CONF')}}))")
    assert "narenas" not in (_run(code)["conf"] or "")
