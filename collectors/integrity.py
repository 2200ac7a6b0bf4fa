"""Damage to a trace store, found and named: part checks against the manifest, manifest field types.

Each ingest part's size and sha256 go into its source's manifest entry (``parts``); a read checks the
parts it lists (sizes and the Parquet magic always, the sha256 too unless the parts are many GB), and
``rankscope check`` checks everything. Pure functions over paths and decoded JSON: the store calls them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

VERIFY_ENV = "RANKSCOPE_VERIFY"
"""``full`` (hash every part read), ``size`` (sizes and Parquet magic only) or ``auto`` (the default:
full while the parts one read lists total at most :data:`FULL_HASH_MAX_BYTES`)."""
FULL_HASH_MAX_BYTES = 256 << 20
"""Above this many part bytes in one read, ``auto`` checks sizes only: hashing 10 GB on every read of a
large store costs more than the read. ``rankscope check`` always hashes."""
MAGIC = b"PAR1"

FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "key": (str,), "source": (str,), "format": (str,), "job": (str,), "sha256": (str, type(None)),
    "records": (dict,), "rejects": (dict,), "samples": (dict,), "relative_time": (bool,), "notes": (dict,),
    "ingested_at": (int, float), "parts": (dict,)}
"""The manifest entry's fields and the JSON types each may hold."""
_REQUIRED = ("key", "source", "format", "job")
_TYPE_WORDS = {str: "text", dict: "an object", bool: "true/false", int: "a number", float: "a number",
               type(None): "null", list: "a list"}


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def part_record(path: Path) -> dict:
    """What the manifest keeps about one part: its sha256 and its size in bytes."""
    return {"sha256": file_sha256(path), "bytes": path.stat().st_size}


def sidecar(part: Path) -> Path:
    """Where a live writer's part keeps its ``{sha256, bytes}`` (readers list only ``*.parquet``)."""
    return part.with_name(part.name + ".sha256")


def sidecar_record(part: Path) -> dict | None:
    """The record beside a live writer's part; None when there is none (parts written before sidecars)."""
    try:
        rec = json.loads(sidecar(part).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def verify_mode(total_bytes: int) -> str:
    """``full`` or ``size`` for a read of parts totalling ``total_bytes`` (see :data:`VERIFY_ENV`)."""
    mode = os.environ.get(VERIFY_ENV, "auto").strip().lower()
    if mode in ("full", "size"):
        return mode
    return "full" if total_bytes <= FULL_HASH_MAX_BYTES else "size"


def part_damage(path: Path, expected: dict | None, full: bool) -> str | None:
    """Why a part cannot be trusted, in words; None when it passes.

    Every part: readable, long enough, ``PAR1`` at both ends. With a manifest record: the recorded size, and
    with ``full`` the recorded sha256 (a flipped byte anywhere)."""
    try:
        size = path.stat().st_size
        if expected is not None and isinstance(expected.get("bytes"), int) and size != expected["bytes"]:
            return f"it holds {size:,} bytes where its manifest entry recorded {expected['bytes']:,}"
        if size < 12:
            return f"it holds {size} bytes, fewer than any Parquet file"
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(-4, os.SEEK_END)
            tail = f.read(4)
        if head != MAGIC or tail != MAGIC:
            return "it is not a Parquet file (no PAR1 at its start and end)"
        if full and expected is not None and isinstance(expected.get("sha256"), str) \
                and file_sha256(path) != expected["sha256"]:
            return "its content differs from the sha256 its manifest entry recorded"
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    return None


def manifest_problem(data: object) -> str | None:
    """What is wrong with a decoded manifest entry, naming the field; None when every field fits."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {_TYPE_WORDS.get(type(data), type(data).__name__)}"
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        return f"field(s) {', '.join(missing)} missing"
    unknown = sorted(set(data) - set(FIELD_TYPES))
    if unknown:
        return f"unknown field(s) {', '.join(unknown)}"
    for k, v in data.items():
        ok = FIELD_TYPES[k]
        if not isinstance(v, ok) or (isinstance(v, bool) and bool not in ok):
            return f"field {k!r} is {_TYPE_WORDS.get(type(v), type(v).__name__)}, expected {_TYPE_WORDS[ok[0]]}"
    for k in ("records", "rejects"):
        bad = [n for n, v in data.get(k, {}).items() if not isinstance(v, int) or isinstance(v, bool)]
        if bad:
            return f"field {k!r} holds a count that is not a whole number (at {bad[0]!r})"
    return None
