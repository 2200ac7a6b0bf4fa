"""The report's JSON schema comes from its types: it keeps the public contract, every golden report fits it
(no key the types do not declare), and docs/report.md and docs/report.schema.json are the generated ones."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import jsonschema
import pytest

from rankscope.analysis.report.causes import CAUSES
from rankscope.analysis.report.schema import json_schema, markdown
from rankscope.analysis.report.stragglers import Verdict

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "tests" / "golden" / "reports"
DOCS = REPO / "docs"


def _resolve(schema: dict, root: dict) -> dict:
    while "$ref" in schema:
        schema = root["$defs"][schema["$ref"].split("/")[-1]]
    return schema


def _types(schema: dict, root: dict) -> set[str] | None:
    """The JSON types a schema admits (None: any)."""
    schema = _resolve(schema, root)
    if "anyOf" in schema:
        parts = [_types(s, root) for s in schema["anyOf"]]
        return None if any(p is None for p in parts) else set().union(*parts)
    if "enum" in schema:
        return {"string"} if all(isinstance(v, str) for v in schema["enum"]) else None
    t = schema.get("type")
    if t is None:
        return {"object"} if "properties" in schema else None
    return {t} if isinstance(t, str) else set(t)


def _fits(contract: dict, ours: dict, root: dict, path: str) -> list[str]:
    """Where our schema breaks the contract: a missing or no longer required key, a type the contract does
    not allow, an enum value it does not list. A union must keep it in every member."""
    ours = _resolve(ours, root)
    members = [m for m in ours.get("anyOf", []) if _resolve(m, root).get("type") != "null"]
    if members and "properties" in contract:
        return [p for m in members for p in _fits(contract, m, root, path)]
    out = []
    want, got = _types(contract, root), _types(ours, root)
    if want is not None and (got is None or not got <= want | ({"integer"} if "number" in want else set())):
        out.append(f"{path}: type {sorted(got) if got else 'any'}, contract allows {sorted(want)}")
    if "enum" in contract and set(ours.get("enum", [])) - set(contract["enum"]):
        out.append(f"{path}: values {sorted(set(ours.get('enum', [])) - set(contract['enum']))} not in the contract")
    if "enum" in contract and "enum" not in ours:
        out.append(f"{path}: any value, contract allows {contract['enum']}")
    for key in contract.get("required", []):
        if key not in ours.get("required", []):
            out.append(f"{path}.{key}: required by the contract, optional here")
    for key, sub in contract.get("properties", {}).items():
        if key not in ours.get("properties", {}):
            out.append(f"{path}.{key}: missing")
        else:
            out += _fits(sub, ours["properties"][key], root, f"{path}.{key}")
    if "items" in contract and "items" in ours:
        out += _fits(contract["items"], ours["items"], root, f"{path}[]")
    return out


def test_the_generated_schema_keeps_the_contract(report_schema):
    ours = json_schema()
    problems = _fits(report_schema, ours, ours, "report")
    assert not problems, "\n".join(problems)


GOLDENS = sorted(p for p in GOLDEN.glob("*/*.json") if not p.name.startswith("_"))


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_golden_report_fits_the_types(path, report_schema):
    report = json.loads(path.read_text())
    jsonschema.validate(report, json_schema())
    jsonschema.validate(report, report_schema)


def test_a_key_the_types_do_not_declare_is_refused():
    report = json.loads(GOLDENS[0].read_text())
    report["stragglers"]["not_a_field"] = 1
    with pytest.raises(jsonschema.ValidationError, match="not_a_field"):
        jsonschema.validate(report, json_schema())


def test_docs_are_the_generated_ones():
    assert (DOCS / "report.md").read_text() == markdown() + "\n", "docs/report.md is stale: run `make docs`"
    assert json.loads((DOCS / "report.schema.json").read_text()) == json_schema(), \
        "docs/report.schema.json is stale: run `make docs`"


def test_the_verdicts_are_the_causes_registry_and_its_two_outcomes():
    # the report's Verdict type is written out for the schema; the causes registry is what the code decides
    # from: a cause added to one and not the other would be a verdict the schema refuses, or one never given
    assert set(typing.get_args(Verdict)) == {"none", "mixed", *CAUSES}
