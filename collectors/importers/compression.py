"""Compressed inputs: gzip (read in contract.read_limited), bz2, xz and single-file zip, read with the standard
library within the same expansion cap as gzip; zstd and compression inside compression are refused by name.

A file is recognised by its magic bytes, never by its suffix. Python 3.11 has no zstd module and
``zstandard`` is not a dependency, so a zstd file gets a message listing what is read.
"""

from __future__ import annotations

import bz2
import lzma
import zipfile
from pathlib import Path

from rankscope.collectors.errors import InputFormatError

MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz", b"PK\x03\x04": "zip",
         b"\x28\xb5\x2f\xfd": "zstd"}
SUPPORTED = "gzip, bz2, xz or zip (one file)"
_BLOCK = 1 << 20


def compression_of(head: bytes) -> str | None:
    """The compression whose magic ``head`` starts with, or None."""
    return next((name for magic, name in MAGIC.items() if head.startswith(magic)), None)


def refuse_unsupported(path: Path, head: bytes) -> None:
    """InputFormatError for a compression this build cannot read (zstd), listing what it can."""
    if compression_of(head) == "zstd":
        raise InputFormatError(path, None, f"a file compressed with {SUPPORTED}, or none",
                               got="zstd (Python 3.11 has no zstd reader; run `zstd -d` on it first)")


def refuse_nested(path: Path, outer: str, data: bytes) -> None:
    """InputFormatError when decompressed bytes are compressed again: named, never printed."""
    inner = compression_of(data[:8])
    if inner is not None:
        raise InputFormatError(path, None, f"one layer of compression ({SUPPORTED})",
                               got=f"{inner} inside {outer}; decompress the outer layer first")


def _stream(path: Path, dec, raw: bytes, cap: int, what: str) -> bytes:
    out, pending = bytearray(), raw
    try:
        while not dec.eof:
            chunk = dec.decompress(pending, _BLOCK)
            pending = b""
            out += chunk
            if len(out) > cap:
                raise InputFormatError(path, None, f"a {what} file that expands to at most {cap:,} bytes "
                                       "(raise with --max-bytes)", got=f"more from {len(raw):,} compressed")
            if not chunk and dec.needs_input:
                break  # the stream ended early: what was decoded is kept, like a cut gzip
    except (OSError, lzma.LZMAError, EOFError, ValueError) as e:
        raise InputFormatError(path, None, f"a readable {what} stream", got=str(e)[:200]) from e
    return bytes(out)


def _unzip(path: Path, cap: int) -> bytes:
    try:
        with zipfile.ZipFile(path) as z:
            names = [i for i in z.infolist() if not i.is_dir()]
            if len(names) != 1:
                raise InputFormatError(path, None, "a zip holding exactly one file",
                                       got=f"{len(names)} files; unzip it and ingest the folder")
            out = bytearray()
            with z.open(names[0]) as f:
                while block := f.read(_BLOCK):
                    out += block
                    if len(out) > cap:
                        raise InputFormatError(path, None, f"a zip member that expands to at most {cap:,} bytes "
                                               "(raise with --max-bytes)", got=f"more in {names[0].filename}")
            return bytes(out)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as e:
        raise InputFormatError(path, None, "a readable zip file", got=str(e)[:200]) from e


def decompress(path: Path, raw: bytes, cap: int) -> bytes | None:
    """The bytes of a bz2, xz or zip file within ``cap``; None when ``raw`` is none of them."""
    kind = compression_of(raw[:8])
    refuse_unsupported(path, raw[:8])
    if kind == "bz2":
        data = _stream(path, bz2.BZ2Decompressor(), raw, cap, "bz2")
    elif kind == "xz":
        data = _stream(path, lzma.LZMADecompressor(), raw, cap, "xz")
    elif kind == "zip":
        data = _unzip(path, cap)
    else:
        return None
    refuse_nested(path, kind, data)
    return data


def head_of(raw: bytes, n: int) -> bytes:
    """The first ``n`` decompressed bytes of a bz2 or xz head (a zip's first member); ``raw`` otherwise."""
    kind = compression_of(raw[:8])
    try:
        if kind == "bz2":
            return bz2.BZ2Decompressor().decompress(raw, n)
        if kind == "xz":
            return lzma.LZMADecompressor().decompress(raw, n)
    except (OSError, lzma.LZMAError, EOFError, ValueError):
        return raw
    return raw
