"""The layout rules of shared/design.md, enforced."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["collectors", "analysis", "dashboard", "datasets", "cli"]
# Who may import whom (imports point down only).
ALLOWED = {
    "collectors": set(),
    "analysis": {"collectors"},
    "datasets": {"collectors", "analysis"},
    "dashboard": {"collectors", "analysis"},
    "cli": {"collectors", "analysis", "datasets", "dashboard"},
}
MAX_LINES = 800


def _modules():
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).rglob("*.py")):
            yield pkg, p


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for n in names:
            parts = n.split(".")
            if parts[0] == "rankscope" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_imports_point_down_only():
    back = []
    for pkg, path in _modules():
        for target in _imported_packages(path) - {pkg}:
            if target not in ALLOWED[pkg]:
                back.append(f"{path.relative_to(REPO)} imports rankscope.{target}")
    assert not back, "imports that point up or sideways:\n" + "\n".join(back)


def test_no_module_over_limit():
    big = [f"{p.relative_to(REPO)}: {n}" for _, p in _modules()
           if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_no_file_name_shared_across_packages():
    seen = defaultdict(list)
    for _pkg, p in _modules():
        if p.name != "__init__.py":
            seen[p.name].append(str(p.relative_to(REPO)))
    dup = {k: v for k, v in seen.items() if len(v) > 1}
    assert not dup, f"file names used in more than one package: {dup}"


def test_columns_declared_only_in_schema():
    """pa.schema(...) / pa.field(...) appear only in collectors/schema.py."""
    offenders = []
    for _, p in _modules():
        if p.name == "schema.py" and p.parent.name == "collectors":
            continue
        text = p.read_text()
        if "pa.schema(" in text or "pa.field(" in text:
            offenders.append(str(p.relative_to(REPO)))
    assert not offenders, f"columns declared outside collectors/schema.py: {offenders}"


def test_collectors_import_is_light():
    code = ("import sys, rankscope.collectors, rankscope.collectors.schema, rankscope.collectors.store, "
            "rankscope.collectors.ingest.ingest_files\n"
            "bad = [m for m in ('torch', 'dash', 'ray') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
