"""Shared fixtures: repository paths and the reference traces read in place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RANKSCOPE_SHARED", REPO.parent / "shared"))
REFERENCE = SHARED / "reference"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    if not REFERENCE.is_dir():
        pytest.skip(f"reference traces not found at {REFERENCE}")
    return REFERENCE


@pytest.fixture(scope="session")
def report_schema() -> dict:
    import json

    p = SHARED / "contracts" / "report.schema.json"
    if not p.is_file():
        pytest.skip(f"report schema not found at {p}")
    return json.loads(p.read_text())
