"""How the report's types are declared, written as the report JSON and read back.

Every section of the report is a frozen dataclass whose fields are declared with :func:`doc`: a
description (which the generated JSON schema and ``docs/report.md`` print) and the field's place in the
JSON object:

- ``omit="none"``: the key is left out while the value is None (an optional key of the report);
- ``omit="empty"``: the key is left out while the value is None or an empty list or dict;
- ``flatten=True``: the field holds a group of keys (a dataclass) that sit in the parent object itself,
  present together or not at all. Keys that one input path alone writes (what the flows or the compute
  replay measured) are such groups: in code they are one typed value, in the JSON the flat object the
  report contract has always had.

:func:`to_json` writes the report's JSON object. :func:`encode` / :func:`decode` carry a whole value
through JSON and back exactly (the result cache): groups stay nested and a union member names its type.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any

from rankscope.collectors.record_class import record

TYPE_KEY = "__type__"
"""the key that names a union member's type in :func:`encode`'s nested form."""


def doc(text: str, default: Any = MISSING, *, factory: Any = MISSING, omit: str | None = None,
        flatten: bool = False) -> Any:
    """A documented report field (see the module docstring)."""
    if omit not in (None, "none", "empty"):
        raise ValueError(f"omit={omit!r}: expected None, 'none' or 'empty'")
    md = {"doc": text, "omit": omit, "flatten": flatten}
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata=md)
    if default is MISSING:
        return dataclasses.field(metadata=md)
    return dataclasses.field(default=default, metadata=md)


def plain(x: Any) -> Any:
    """Plain JSON types: numpy scalars to Python, NaN and infinities to None, tuples to lists."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _left_out(value: Any, omit: str | None) -> bool:
    if omit is None:
        return False
    if value is None:
        return True
    return omit == "empty" and isinstance(value, (list, tuple, dict)) and len(value) == 0


@functools.cache
def _json_fields(cls: type) -> tuple[tuple[str, bool, str | None], ...] | None:
    """(name, flatten, omit) of each field of dataclass ``cls``; None for any other type. Read once per type:
    with ``fields()`` and the metadata looked up per value, and every leaf taking plain()'s general path,
    :func:`to_json` of the OSDI'25 reports took 8 / 14 / 22 ms (ST / SE / AR), now 2 / 3 / 5 ms."""
    if not is_dataclass(cls):
        return None
    return tuple((f.name, bool(f.metadata.get("flatten")), f.metadata.get("omit")) for f in fields(cls))


def to_json(x: Any) -> Any:
    """The report JSON of a report value: declared keys, groups flattened, omitted keys left out."""
    t = type(x)
    if t is str or t is int or t is bool or x is None:  # the leaves most values are: as plain() gives them
        return x
    if t is float:
        return x if math.isfinite(x) else None
    declared_fields = _json_fields(t)  # a dataclass instance (a dataclass type itself is not one)
    if declared_fields is not None:
        out: dict[str, Any] = {}
        for name, flatten, omit in declared_fields:
            v = getattr(x, name)
            if flatten:
                if v is not None:
                    out.update(to_json(v))
                continue
            if _left_out(v, omit):
                continue
            out[name] = to_json(v)
        return out
    if isinstance(x, dict):
        return {str(k): to_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_json(v) for v in x]
    return plain(x)


def encode(x: Any) -> Any:
    """A report value as JSON that :func:`decode` reads back into the same value (NaN kept as NaN)."""
    if is_dataclass(x) and not isinstance(x, type):
        out = {f.name: encode(getattr(x, f.name)) for f in fields(x)}
        out[TYPE_KEY] = type(x).__name__
        return out
    if isinstance(x, dict):
        return {str(k): encode(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [encode(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        return x.item()
    return x


def decode(cls: type, data: dict) -> Any:
    """The value of dataclass ``cls`` that :func:`encode` wrote as ``data``."""
    kwargs = {name: _value(tp, data[name]) for name, tp in _field_types(cls) if name in data}
    return cls(**kwargs)


@functools.cache
def _field_types(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, resolved type) of each field: ``get_type_hints`` re-resolves every annotation per call, and a
    4,096-GPU report's cached result decodes 6,000 dataclasses (1.4 s of a 4.5 s re-run)."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in fields(cls))


def _value(tp: Any, v: Any) -> Any:
    if v is None or tp is Any:
        return v
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if isinstance(v, dict) and TYPE_KEY in v:
            for a in options:
                if is_dataclass(a) and a.__name__ == v[TYPE_KEY]:
                    return decode(a, v)
        plain_options = [a for a in options if not is_dataclass(a)]
        return _value(plain_options[0], v) if plain_options else v
    if is_dataclass(tp):
        return decode(tp, v)
    if origin in (list, tuple):
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        items = [_value(inner, x) for x in v]
        return items if origin is list else tuple(items)
    if origin is dict:
        args = typing.get_args(tp)
        inner = args[1] if len(args) == 2 else Any
        return {k: _value(inner, x) for k, x in v.items()}
    return v


@record
class FieldInfo:
    """One declared field, as the schema and the docs read it."""

    name: str
    type: Any
    doc: str
    omit: str | None
    flatten: bool
    has_default: bool


def declared(cls: type) -> list[FieldInfo]:
    """The declared fields of a report type, in order, with their resolved types."""
    hints = typing.get_type_hints(cls)
    return [FieldInfo(f.name, hints[f.name], f.metadata.get("doc", ""), f.metadata.get("omit"),
                      bool(f.metadata.get("flatten")),
                      f.default is not MISSING or f.default_factory is not MISSING) for f in fields(cls)]
