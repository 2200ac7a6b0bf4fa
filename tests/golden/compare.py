"""Field-by-field comparison of two report JSON objects, with float tolerances by field.

Like Perfetto's diff tests: the expected output is kept as a file, and a difference names the field, the
expected and the actual value. Floats compare within a tolerance; every other value exactly; a key present
on one side only is a difference.
"""

from __future__ import annotations

import fnmatch
import math

REL_TOL = 1e-9
ABS_TOL = 1e-9
"""The default: the analyses are deterministic on one machine, so floats differ only by the order of
float sums (a different BLAS or polars thread count), far below any figure a report prints."""
TOLERANCES: dict[str, tuple[float, float]] = {}
"""field path pattern (fnmatch, dots between keys, ``[]`` for any list index) -> (relative, absolute)."""


def _tol(path: str) -> tuple[float, float]:
    for pat, tol in TOLERANCES.items():
        if fnmatch.fnmatchcase(path, pat):
            return tol
    return REL_TOL, ABS_TOL


def _generic(path: str) -> str:
    out, i = [], 0
    while i < len(path):
        if path[i] == "[":
            j = path.index("]", i)
            out.append("[]")
            i = j + 1
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def diff(expected, actual, path: str = "", ignore: tuple[str, ...] = ()) -> list[str]:
    """The differences between two JSON values, one line each (empty when they match)."""
    if path and any(fnmatch.fnmatchcase(_generic(path), pat) for pat in ignore):
        return []
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for k in sorted(set(expected) | set(actual), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in actual:
                if not any(fnmatch.fnmatchcase(_generic(p), pat) for pat in ignore):
                    out.append(f"{p}: missing (expected {_short(expected[k])})")
            elif k not in expected:
                if not any(fnmatch.fnmatchcase(_generic(p), pat) for pat in ignore):
                    out.append(f"{p}: unexpected key (got {_short(actual[k])})")
            else:
                out += diff(expected[k], actual[k], p, ignore)
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{path}: {len(actual)} items, expected {len(expected)} ({_short(actual)} vs {_short(expected)})"]
        out = []
        for i, (a, b) in enumerate(zip(expected, actual)):
            out += diff(a, b, f"{path}[{i}]", ignore)
        return out
    num = (int, float)
    if (isinstance(expected, num) and isinstance(actual, num) and not isinstance(expected, bool)
            and not isinstance(actual, bool) and (isinstance(expected, float) or isinstance(actual, float))):
        rel, abs_ = _tol(_generic(path))
        if math.isclose(expected, actual, rel_tol=rel, abs_tol=abs_):
            return []
        return [f"{path}: {actual!r}, expected {expected!r} (tolerance rel {rel:g}, abs {abs_:g})"]
    if type(expected) is not type(actual) or expected != actual:
        return [f"{path}: {_short(actual)}, expected {_short(expected)}"]
    return []


def _short(x, n: int = 160) -> str:
    s = repr(x)
    return s if len(s) <= n else s[:n] + "..."
