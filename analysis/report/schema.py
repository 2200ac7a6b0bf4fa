"""The report's JSON schema and its reference page, generated from the report's types.

:func:`json_schema` is what ``rankscope analyze`` writes, derived from the declared fields of
:class:`~rankscope.analysis.report.diagnosis.Diagnosis` and its sections: a field that the JSON may leave
out is not required, a group of keys that one input path writes (``flatten``) adds its keys to the parent,
and every object of the report's own types admits no undeclared key (the evidence dicts stay open).
:func:`markdown` is ``docs/report.md``. Both are checked against the contract and the docs by tests.
"""

from __future__ import annotations

import types
import typing
from dataclasses import is_dataclass
from typing import Any

from rankscope.analysis.report.codec import declared
from rankscope.analysis.report.diagnosis import Diagnosis, WindowEvent

SCHEMA_ID = "https://json-schema.org/draft/2020-12/schema"
PRIMITIVES = {int: "integer", float: "number", str: "string", bool: "boolean"}


def _options(tp: Any) -> list[Any]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return list(typing.get_args(tp))
    return [tp]


def _type_schema(tp: Any, defs: dict) -> dict:
    """The JSON schema of one annotated type (dataclasses go to ``defs``, referenced by name)."""
    if tp is Any:
        return {}
    opts = _options(tp)
    if len(opts) > 1:
        nullable = type(None) in opts
        rest = [o for o in opts if o is not type(None)]
        if all(o in PRIMITIVES for o in rest):
            names = [PRIMITIVES[o] for o in rest] + (["null"] if nullable else [])
            return {"type": names[0] if len(names) == 1 else names}
        parts = [_type_schema(o, defs) for o in rest] + ([{"type": "null"}] if nullable else [])
        return {"anyOf": parts}
    if tp in PRIMITIVES:
        return {"type": PRIMITIVES[tp]}
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin in (list, tuple) or tp in (list, tuple):
        args = typing.get_args(tp)
        return {"type": "array", **({"items": _type_schema(args[0], defs)} if args else {})}
    if origin is dict or tp is dict:
        args = typing.get_args(tp)
        return {"type": "object", **({"additionalProperties": _type_schema(args[1], defs)} if len(args) == 2 else {})}
    if is_dataclass(tp):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}  # placeholder: a type may refer to itself
            defs[tp.__name__] = _object_schema(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    raise TypeError(f"no JSON schema for the report type {tp!r}")


def _fields(cls: type, defs: dict, required: bool = True) -> tuple[dict, list[str]]:
    """(properties, required keys) of a dataclass, flattened groups included."""
    props: dict = {}
    req: list[str] = []
    for f in declared(cls):
        if f.flatten:
            inner = [o for o in _options(f.type) if is_dataclass(o)]
            # a group that is always there (one type, or a union of types) requires the keys every member does
            always = required and type(None) not in _options(f.type)
            common = None
            for group in inner:
                p, r = _fields(group, defs, required=True)
                props.update({k: v for k, v in p.items() if k not in props})
                common = set(r) if common is None else common & set(r)
            req += [k for k in sorted(common or set()) if always and k not in req]
            continue
        props[f.name] = {**_type_schema(f.type, defs), "description": f.doc}
        if required and f.omit is None:
            req.append(f.name)
    return props, req


def _object_schema(cls: type, defs: dict) -> dict:
    props, req = _fields(cls, defs)
    doc = (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    return {"type": "object", "description": doc, "required": req, "properties": props, "additionalProperties": False}


def json_schema() -> dict:
    """The JSON schema of the report ``rankscope analyze`` writes (draft 2020-12)."""
    defs: dict = {}
    top = _object_schema(Diagnosis, defs)
    return {"$schema": SCHEMA_ID, "title": "rankscope diagnosis report", **top, "$defs": defs}


def _type_text(tp: Any) -> str:
    if tp is Any:
        return "any"
    opts = _options(tp)
    if len(opts) > 1:
        return " or ".join(_type_text(o) for o in opts)
    if tp is type(None):
        return "null"
    if tp in PRIMITIVES:
        return PRIMITIVES[tp]
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " / ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin in (list, tuple) or tp in (list, tuple):
        args = typing.get_args(tp)
        return f"list of {_type_text(args[0])}" if args else "list"
    if origin is dict or tp is dict:
        args = typing.get_args(tp)
        return f"object of {_type_text(args[1])}" if len(args) == 2 else "object"
    if is_dataclass(tp):
        return f"[{tp.__name__}](#{tp.__name__.lower()})"
    return getattr(tp, "__name__", str(tp))


def _reachable(cls: type, seen: list[type]) -> list[type]:
    if cls in seen:
        return seen
    seen.append(cls)
    for f in declared(cls):
        for t in _nested(f.type):
            _reachable(t, seen)
    return seen


def _nested(tp: Any) -> list[type]:
    out = []
    for o in _options(tp):
        if is_dataclass(o):
            out.append(o)
        for a in typing.get_args(o):
            out += _nested(a)
    return out


def markdown() -> str:
    """``docs/report.md``: every type of the report, its fields, their types and what they mean."""
    lines = ["# The report", "",
             "What `rankscope analyze --out-dir OUT` writes as `OUT/<job>.json`, generated from the report's "
             "types (`analysis/report/`; regenerate with `make docs`). The contract it keeps is "
             "`../shared/contracts/report.schema.json`; the full schema is `docs/report.schema.json`.", "",
             "A field marked *optional* is left out of the JSON while it has no value. A *group* is a set of "
             "keys that one input path writes together; they sit in the object that holds the group, not in "
             "an object of their own.", ""]
    report = _reachable(Diagnosis, [])
    for cls in report:
        lines += _type_lines(cls)
    lines += ["# The live window", "",
              "What `rankscope watch --events FILE` writes, one object per line, for each window of steps (and each "
              "live hang). Its nested types are the report's, above.", ""]
    for cls in _reachable(WindowEvent, list(report))[len(report):]:
        lines += _type_lines(cls)
    return "\n".join(lines)


def _type_lines(cls: type) -> list[str]:
    doc = (cls.__doc__ or "").strip().replace("\n", " ")
    lines = [f"## {cls.__name__}", "", doc, "", "| key | type | meaning |", "| --- | --- | --- |"]
    for f in declared(cls):
        kind = "group: " if f.flatten else ("optional " if f.omit else "")
        lines.append(f"| `{f.name}` | {kind}{_type_text(f.type)} | {f.doc.replace('|', '/')} |")
    return [*lines, ""]
