"""Shared fixtures: repository paths and the reference traces read in place.

Under ``CI=true`` the shared data is part of the product's test surface: a
missing ``../shared`` (or any skip that names a path under it) fails the run
instead of skipping, so a CI job without the data cannot pass silently.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RANKSCOPE_SHARED", REPO.parent / "shared"))
REFERENCE = SHARED / "reference"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing_shared(what: str) -> None:
    """Skip locally, fail under CI: the test cannot run without shared data."""
    msg = f"{what} not found (set RANKSCOPE_SHARED or check out ../shared)"
    if in_ci():
        pytest.fail(f"CI=true: {msg}", pytrace=False)
    pytest.skip(msg)


def pytest_sessionstart(session):
    if in_ci() and not SHARED.is_dir():
        raise pytest.UsageError(f"CI=true but the shared data folder {SHARED} is missing; "
                                "tests that read it would skip and the run would pass")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    # A skip raised anywhere (a fixture, a test body) that names the shared folder is a failure in CI.
    if in_ci() and rep.skipped and not hasattr(rep, "wasxfail") and isinstance(rep.longrepr, tuple):
        reason = str(rep.longrepr[2])
        if str(SHARED) in reason or "shared" in reason.lower():
            rep.outcome = "failed"
            rep.longrepr = f"CI=true: skipped for missing shared data: {reason}"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    if not REFERENCE.is_dir():
        missing_shared(f"reference traces at {REFERENCE}")
    return REFERENCE


@pytest.fixture(scope="session")
def report_schema() -> dict:
    import json

    p = SHARED / "contracts" / "report.schema.json"
    if not p.is_file():
        missing_shared(f"report schema at {p}")
    return json.loads(p.read_text())
