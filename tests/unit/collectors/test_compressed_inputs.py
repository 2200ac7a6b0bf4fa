"""Inputs: xz, bz2 and zip read with the standard library within the gzip bomb's cap; zstd and compression
inside compression refused by name (no raw bytes); a FIFO refused before anything opens it (issue 41)."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rankscope.collectors.ingest.files import ingest
from rankscope.collectors.store import Store

KINETO = Path(__file__).parents[2] / "data" / "gloo_dp2pp2tp2" / "kineto" / "rank0.json.gz"


def _plain() -> bytes:
    return gzip.decompress(KINETO.read_bytes())


def _zip(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)


@pytest.mark.parametrize("kind", ["xz", "bz2", "zip"])
def test_xz_bz2_and_zip_read_like_gzip(tmp_path, kind):
    src = tmp_path / f"rank0.json.{kind}"
    if kind == "zip":
        _zip(src, {"rank0.json": _plain()})
    else:
        src.write_bytes({"xz": lzma.compress, "bz2": bz2.compress}[kind](_plain()))
    s = ingest(Store(tmp_path / "st"), [src])
    assert s.count("ingested") == 1, s.files[0].error
    assert s.records["comm_op"] == 66 and s.records["compute_op"] == 183


@pytest.mark.parametrize("kind", ["xz", "bz2", "zip"])
def test_a_bomb_in_any_compression_is_bounded(tmp_path, kind):
    zeros = bytes(80 << 20)  # 80 MiB of zeros: a few KB compressed, over the 64 MiB floor of the cap
    src = tmp_path / f"bomb.json.{kind}"
    if kind == "zip":
        _zip(src, {"bomb.json": zeros})
    else:
        src.write_bytes({"xz": lzma.compress, "bz2": bz2.compress}[kind](zeros))
    del zeros
    r = ingest(Store(tmp_path / "st"), [src], fmt="kineto").files[0]
    assert r.status == "failed" and "expands to at most" in r.error, r.error


def test_gzip_inside_gzip_is_named_not_printed(tmp_path):
    src = tmp_path / "rank0.json.gz.gz"
    src.write_bytes(gzip.compress(KINETO.read_bytes()))
    r = ingest(Store(tmp_path / "st"), [src]).files[0]
    assert r.status == "failed" and "gzip inside gzip" in r.error
    assert "\\x" not in r.error and "\x1f" not in r.error
    r = ingest(Store(tmp_path / "st"), [src], fmt="kineto").files[0]
    assert r.status == "failed" and "gzip inside gzip" in r.error and "\\x" not in r.error


def test_zstd_is_refused_with_what_is_supported(tmp_path):
    src = tmp_path / "rank0.json.zst"
    src.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(32))
    r = ingest(Store(tmp_path / "st"), [src]).files[0]
    assert r.status == "failed" and "zstd" in r.error and "gzip, bz2, xz or zip" in r.error


def test_a_zip_of_several_files_is_refused(tmp_path):
    src = tmp_path / "two.zip"
    _zip(src, {"a.json": b"{}", "b.json": b"{}"})
    r = ingest(Store(tmp_path / "st"), [src], fmt="kineto").files[0]
    assert r.status == "failed" and "exactly one file" in r.error


def test_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    code = ("import sys; from rankscope.collectors.ingest.files import ingest; from rankscope.collectors.store "
            "import Store; r = ingest(Store(sys.argv[2]), [sys.argv[1]]).files[0]; print(r.status, '|', r.error)")
    out = subprocess.run([sys.executable, "-c", code, str(fifo), str(tmp_path / "st")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("failed |") and "expected a regular file, got a FIFO" in out.stdout
