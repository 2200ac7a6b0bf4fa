"""Stream a Chrome-trace JSON's ``traceEvents`` array in bounded chunks of parsed events.

Why not one ``orjson.loads`` of the file: that holds the raw bytes and a dict
for every event at once (about 8x the file's size), so a trace set's peak
memory grows with its largest file. Here the file is read (and gunzipped) in
blocks; the event array is cut at event boundaries into chunks of about
``chunk_bytes`` and each chunk is parsed by orjson on its own, so at most one
chunk of raw bytes and its dicts are alive while the caller keeps only what it
needs (a few columns, and the args of the events an importer reads).

A cut is accepted only when orjson parses ``[`` + prefix + ``]``: a cut inside
a string leaves an unbalanced quote and a cut inside a nested object leaves an
unclosed brace, so a successful parse proves the prefix is whole elements.

Anything this reader does not expect (no ``traceEvents`` array, invalid JSON,
a truncated file, a key after the array that it cannot parse) raises
:class:`Irregular`; the caller then reads the file the old whole-file way, so
odd files keep their exact old treatment (repair of truncated files included).
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

import orjson

from rankscope.collectors.errors import InputFormatError
from rankscope.collectors.importers.compression import compression_of
from rankscope.collectors.importers.contract import LIMITS

CHUNK_BYTES = 256 << 10
"""Raw JSON bytes parsed at a time (the dicts of one chunk take about 5x this)."""
_BLOCK = 1 << 20
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_MAX_CUT_TRIES = 64
_WS = b" \t\r\n"


class Irregular(Exception):  # noqa: N818 - a signal to take the whole-file path, not an error
    """The file is not the plain shape streamed here; read it whole instead."""


def byte_blocks(path: Path) -> Iterator[bytes]:
    """The file's bytes (gunzipped when gzip) in blocks, within the ingest limits.

    Raises InputFormatError for a file over the limits or a corrupt gzip stream
    (as the whole-file reader does), Irregular for a gzip stream that ends early.
    """
    lim = LIMITS.get()
    size = os.path.getsize(path)
    if lim.max_bytes is not None and size > lim.max_bytes:
        raise InputFormatError(path, None, f"at most {lim.max_bytes:,} bytes (--max-bytes)", got=f"{size:,} bytes")
    with open(path, "rb") as f:
        first = f.read(_BLOCK)
        if first[:2] != b"\x1f\x8b" and compression_of(first[:8]) is not None:
            raise Irregular("bz2, xz or zip: read whole (contract.read_limited)")
        if first[:2] != b"\x1f\x8b":
            block = first
            while block:
                yield block
                block = f.read(_BLOCK)
            return
        cap = lim.expanded_cap(size)
        out = 0
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pending = first
        while True:
            if not pending:
                pending = f.read(_BLOCK)
                if not pending:
                    break
            try:
                data = d.decompress(pending, _BLOCK)
            except zlib.error as e:
                raise InputFormatError(path, None, "a readable gzip stream", got=str(e)) from e
            pending = d.unconsumed_tail
            out += len(data)
            if out > cap:
                raise InputFormatError(path, None, f"a gzip file that expands to at most {cap:,} bytes "
                                       f"({lim.max_ratio:g}x its size; raise with --max-bytes)",
                                       got=f"more than {cap:,} bytes from {size:,} compressed")
            if data:
                yield data
            if d.eof:
                rest = d.unused_data + pending + f.read()
                if rest[:2] == b"\x1f\x8b":
                    raise Irregular("multi-member gzip")
                return
        raise Irregular("gzip stream ended early")


def _cut(buf: bytearray, end: int) -> tuple[list, int] | None:
    """Parse the longest run of whole elements of ``buf[:end]`` that ends at an element boundary.

    Returns (elements, offset after the cut and its comma), or None when no boundary was found.
    """
    pos = end
    for _ in range(_MAX_CUT_TRIES):
        pos = buf.rfind(b"}", 0, pos)
        if pos < 0:
            return None
        j = pos + 1
        n = len(buf)
        while j < n and buf[j] in _WS:
            j += 1
        k = j + 1
        while k < n and buf[k] in _WS:
            k += 1
        # the next element must open an object too: skips the '}' of nested objects cheaply
        if j < n and buf[j] == 0x2C and k < n and buf[k] == 0x7B:  # ',' then '{'
            try:
                return orjson.loads(b"[" + buf[:pos + 1] + b"]"), j + 1
            except orjson.JSONDecodeError:
                pass
    return None


def stream_events(path: Path, chunk_bytes: int | None = None) -> Iterator[list | dict]:
    """Yield lists of parsed events (in file order), then, last, the document without its events.

    The last item is the top-level object with ``traceEvents`` set to an empty list.
    Raises Irregular where the file is not of the plain shape (see the module docstring).
    """
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    blocks = byte_blocks(path)
    buf = bytearray()
    for block in blocks:
        buf += block
        m = _KEY.search(buf)
        if m:
            break
        if len(buf) > 64 * chunk_bytes:
            raise Irregular("no traceEvents array near the start")
    else:
        raise Irregular("no traceEvents array")
    if buf.find(b'"traceEvents"', 0, m.start()) >= 0:
        raise Irregular("traceEvents named more than once")
    head = bytes(buf[:m.end() - 1])
    buf = buf[m.end():]
    done = False
    want = chunk_bytes
    while not done:
        while len(buf) < want:
            block = next(blocks, None)
            if block is None:
                done = True
                break
            buf += block
        if done:
            break
        got = _cut(buf, min(len(buf), want))  # blocks are bigger than a chunk: cut within the first one
        if got is None:
            if len(buf) > 16 * chunk_bytes:
                raise Irregular("no event boundary in 16 chunks")
            want = len(buf) + chunk_bytes  # one element bigger than a chunk: read on
            continue
        events, off = got
        buf = buf[off:]  # a copy: del buf[:off] keeps the freed front allocated
        want = chunk_bytes
        yield events
    # at the end: all but the last element as usual, so that only it and the keys after the array are left
    got = _cut(buf, len(buf))
    if got is not None:
        events, off = got
        buf = buf[off:]  # a copy: del buf[:off] keeps the freed front allocated
        yield events
    yield from _finish(head, buf)


def _finish(head: bytes, buf: bytearray) -> Iterator[list | dict]:
    """The last element(s) and the document: the array's closing ``]`` is the one before which the
    rest parses as whole elements and after which it parses as the document's remaining keys
    (``]`` inside strings of the keys after the array, a log list, are tried and fail)."""
    pos = len(buf)
    while True:
        pos = buf.rfind(b"]", 0, pos)
        if pos < 0:
            raise Irregular("no end of the traceEvents array (truncated or invalid)")
        tail = bytes(buf[pos + 1:])
        try:
            doc = orjson.loads(head + b"[]" + tail)
        except orjson.JSONDecodeError:
            continue
        body = bytes(buf[:pos]).strip(_WS)
        try:
            events = orjson.loads(b"[" + body + b"]") if body else []
        except orjson.JSONDecodeError:
            continue
        if b'"traceEvents"' in tail:
            raise Irregular("traceEvents named more than once")
        if type(doc) is not dict or doc.get("traceEvents") != []:
            raise Irregular("not an object with a traceEvents list")
        yield events
        yield doc
        return
