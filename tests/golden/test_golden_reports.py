"""Golden reports: the report JSON of fixed inputs, rebuilt through the CLI and compared field by field.

A difference fails with the field, the value and the expected value. A deliberate change of behaviour
regenerates the files (``python tests/golden/regenerate.py CASE``) in a commit of its own that says why.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import CASES, GOLDEN, VOLATILE, available, build_reports  # noqa: E402
from compare import diff  # noqa: E402

from tests.conftest import missing_shared  # noqa: E402


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_report_matches_golden(case, tmp_path):
    why = available(case)
    if why:
        if case.shared:
            missing_shared(why)
        pytest.fail(f"{case.name}: {why}")
    expected_dir = GOLDEN / case.name
    assert expected_dir.is_dir(), f"no golden reports for {case.name}: run tests/golden/regenerate.py {case.name}"
    got = build_reports(case, tmp_path)
    want = {p.name: p.read_text() for p in sorted(expected_dir.glob("*.json"))}
    assert sorted(got) == sorted(want), f"report files {sorted(got)}, expected {sorted(want)}"
    problems = []
    for name in sorted(want):
        problems += [f"{name}: {d}" for d in diff(json.loads(want[name]), json.loads(got[name]), ignore=VOLATILE)]
    assert not problems, f"{len(problems)} difference(s) from the golden reports:\n" + "\n".join(problems[:60])


def test_comparison_fails_on_a_changed_field():
    a = {"stragglers": {"slowdown": 1.5, "verdict": "worker", "seconds": 0.1}, "x": [1, 2]}
    assert diff(a, a) == []
    assert diff(a, {**a, "stragglers": {**a["stragglers"], "slowdown": 1.5 + 1e-6}})
    assert diff(a, {**a, "x": [1, 3]}) == ["x[1]: 3, expected 2"]
    assert diff(a, {"stragglers": a["stragglers"]}) == ["x: missing (expected [1, 2])"]
    assert diff(a, {**a, "stragglers": {**a["stragglers"], "seconds": 9.0}}, ignore=VOLATILE) == []
    assert diff({"a": None}, {"a": 0.0}) == ["a: 0.0, expected None"]
