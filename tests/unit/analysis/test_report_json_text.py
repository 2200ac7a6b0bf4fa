"""Diagnosis.to_json: the report's text is the standard library's JSON of to_dict, value for value."""

from __future__ import annotations

import json
import math

from rankscope.analysis.report.diagnosis import Diagnosis
from rankscope.analysis.report.stragglers import Stragglers


def _diagnosis() -> Diagnosis:
    # a non-finite float, a name beyond ASCII, and a small float the two encoders spell differently (1e-05 / 0.00001)
    return Diagnosis(job="llama-é", sources=["kineto"],
                     stragglers=Stragglers(slowdown=math.inf, waste_fraction=1e-05, evaluated=False, why="no steps"))


def test_the_text_reads_back_as_to_dict():
    d = _diagnosis()
    text = d.to_json()
    assert json.loads(text) == json.loads(json.dumps(d.to_dict(), allow_nan=False))
    assert json.loads(text)["stragglers"]["slowdown"] is None  # null, as the contract wants, never NaN or Infinity
    assert "llama-é" in text  # UTF-8 as it is, not \\u escapes


def test_indented_for_people_or_one_line():
    d = _diagnosis()
    lines = d.to_json().splitlines()
    assert len(lines) > 10 and lines[1].startswith('  "') and not lines[1].startswith('   ')
    one = d.to_json(indent=False)
    assert "\n" not in one and json.loads(one) == json.loads(d.to_json())


def test_numbers_keep_their_values():
    d = Diagnosis(job="j", stragglers=Stragglers(slowdown=1.0000000000000002, waste_fraction=1e16, evaluated=True))
    got = json.loads(d.to_json())["stragglers"]
    assert (got["slowdown"], got["waste_fraction"]) == (1.0000000000000002, 1e16)
    assert json.loads(_diagnosis().to_json())["stragglers"]["waste_fraction"] == 1e-05
