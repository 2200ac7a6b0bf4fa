"""The layout rules of shared/design.md and of the role folders, enforced."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
import tomllib
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
MAX_MODULES_PER_FOLDER = 12
"""a role folder holds about a dozen modules at most (its __init__ not counted)."""
MAX_FUNCTION_LINES = 80
"""analysis/ functions: one idea each."""
LAZY_IMPORTS_ALLOWED = {"scipy", "ray"}
"""function-local imports analysis/ may keep: scipy (heavy to import: ~0.1 s that a white-box job without
clock domains to link, or a CLI start, does not pay) and ray (optional: the [ray] extra)."""
ANALYSIS = REPO / "analysis"


def _modules():
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).rglob("*.py")):
            if "hook_bootstrap" not in p.parts:  # a sitecustomize that a training job's interpreter runs
                yield pkg, p


def _name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for _, p in _modules()}
TREES = {name: ast.parse(p.read_text(), filename=str(p)) for name, p in MODULES.items()}


def _imported_packages(tree: ast.AST) -> set[str]:
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


def _import_edges(tree: ast.AST) -> set[str]:
    """The rankscope modules one module imports, anywhere in it (module level, functions, TYPE_CHECKING)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rankscope.") and not node.level:
            base = node.module.removeprefix("rankscope.")
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
        elif isinstance(node, ast.Import):
            out |= {a.name.removeprefix("rankscope.") for a in node.names if a.name.startswith("rankscope.")}
    return {m for m in out if m in MODULES}


def _function_local_imports(tree: ast.AST):
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield fn.name, node


def test_imports_point_down_only():
    back = []
    for pkg, path in _modules():
        for target in _imported_packages(TREES[_name(path)]) - {pkg}:
            if target not in ALLOWED[pkg]:
                back.append(f"{path.relative_to(REPO)} imports rankscope.{target}")
    assert not back, "imports that point up or sideways:\n" + "\n".join(back)


def test_no_import_circles():
    """No module reaches itself through imports: not at module level, not behind a function, not in a
    TYPE_CHECKING block."""
    edges = {m: _import_edges(t) for m, t in TREES.items()}
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges[v]:
                circles.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in edges:
        if m not in index:
            visit(m)
    assert not circles, f"import circles: {circles}"


def test_analysis_imports_at_module_level():
    local = [f"{MODULES[m].relative_to(REPO)}:{node.lineno} in {fn}" for m, t in TREES.items() if m.startswith("analysis")
             for fn, node in _function_local_imports(t)
             if ((node.module if isinstance(node, ast.ImportFrom) else node.names[0].name) or "").split(".")[0]
             not in LAZY_IMPORTS_ALLOWED]
    assert not local, "function-local imports in analysis/ (only " + ", ".join(sorted(LAZY_IMPORTS_ALLOWED)) + \
        " may load lazily):\n" + "\n".join(local)


def test_analysis_uses_no_reflection():
    users = [m for m, t in TREES.items() if m.startswith("analysis") for n in ast.walk(t)
             if (isinstance(n, ast.Import) and any(a.name == "inspect" for a in n.names))
             or (isinstance(n, ast.ImportFrom) and n.module == "inspect")]
    assert not users, f"inspect used in {users}"


def test_no_private_name_crosses_a_module():
    crossing = [f"{MODULES[m].relative_to(REPO)}:{n.lineno} {n.module}.{a.name}" for m, t in TREES.items()
                for n in ast.walk(t) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("rankscope.")
                for a in n.names if a.name.startswith("_")]
    assert not crossing, "private names imported from another module:\n" + "\n".join(crossing)


def test_no_module_over_limit():
    big = [f"{p.relative_to(REPO)}: {n}" for _, p in _modules()
           if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def _folders():
    return sorted({p.parent for _, p in _modules()})


def test_role_folders_stay_small_and_say_their_rule():
    problems = []
    for folder in _folders():
        rel = folder.relative_to(REPO)
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MAX_MODULES_PER_FOLDER:
            problems.append(f"{rel}: {len(modules)} modules (at most {MAX_MODULES_PER_FOLDER})")
        init = folder / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) if init.exists() else None
        first = (doc or "").strip().split("\n\n")[0]
        if not first or "\n" in first or not first.endswith("."):
            problems.append(f"{rel}/__init__.py: its docstring should open with the folder's rule in one line")
        prefixed = [p.name for p in modules if p.name.startswith(folder.name + "_")]
        if prefixed and folder.name not in ("flows", "hooks"):
            problems.append(f"{rel}: names that repeat the folder's prefix: {prefixed}")
    assert not problems, "\n".join(problems)


def test_analysis_functions_are_of_one_idea():
    long = [f"{MODULES[m].relative_to(REPO)}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
            for m, t in TREES.items() if m.startswith("analysis") for fn in ast.walk(t)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            and fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"analysis/ functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_report_sections_are_typed_not_extra_dicts():
    words = ("extra[", ".extra.get(")
    hits = [f"{p.relative_to(REPO)}: {w}" for pkg, p in _modules() if pkg in ("analysis", "dashboard", "cli")
            for w in words if w in p.read_text()]
    assert not hits, "\n".join(hits)


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


DOTTED = re.compile(r"^rankscope(\.\w+)+(:\w+)?$")


def test_every_dotted_module_string_resolves():
    """The format registry, the CLI's lazy commands and start-up list, the dashboard's lazy imports: a string
    that names a module (and an attribute) must name one that exists."""
    broken = []
    for m, t in TREES.items():
        for n in ast.walk(t):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and DOTTED.match(n.value):
                mod, _, attr = n.value.partition(":")
                if mod == "rankscope.hooks":  # a logger's name, not a module
                    continue
                try:
                    found = importlib.util.find_spec(mod) is not None
                except ModuleNotFoundError:
                    found = False
                if found and attr:
                    found = hasattr(importlib.import_module(mod), attr)
                if not found:
                    broken.append(f"{MODULES[m].relative_to(REPO)}:{n.lineno} {n.value}")
    assert not broken, "dotted names that point nowhere:\n" + "\n".join(broken)


def test_every_package_is_packaged():
    """Every code folder is a listed package, and so is every folder of data files (setuptools ignores an
    unlisted one, and warns)."""
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(cfg["tool"]["setuptools"]["packages"])
    folders = {"rankscope." + ".".join(f.relative_to(REPO).parts) for f in _folders() if (f / "__init__.py").exists()}
    data = set(cfg["tool"]["setuptools"]["package-data"])
    assert listed == folders | data, f"pyproject packages {sorted(listed ^ (folders | data))} differ from the folders"


def test_collectors_import_is_light():
    code = ("import sys, rankscope.collectors, rankscope.collectors.schema, rankscope.collectors.store, "
            "rankscope.collectors.ingest.files\n"
            "bad = [m for m in ('torch', 'dash', 'ray') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_dashboard_and_cli_use_each_package_s_public_face():
    """The CLI and the dashboard import analysis through each package's public face or its front-door modules,
    never a role folder's internal module."""
    faces = {"rankscope.analysis.diagnose", "rankscope.analysis.run_diff", "rankscope.analysis.hangs"}
    deep = defaultdict(list)
    for pkg, p in _modules():
        if pkg not in ("cli", "dashboard"):
            continue
        for n in ast.walk(TREES[_name(p)]):
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("rankscope.analysis."):
                parts = n.module.split(".")
                if len(parts) > 3 and n.module not in faces:
                    deep[str(p.relative_to(REPO))].append(n.module)
    assert not deep, f"imports past a package's public face: {dict(deep)}"
