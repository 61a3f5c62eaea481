"""The shape rules of docs/ARCHITECTURE.md §2 that ruff cannot check: no function over 80 lines.

Generated code (tidelog/proto) is exempt. A long function is a sign of several jobs in one
place; split it along them (the complexity and statement limits are ruff's C901 and PLR0915).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".venv", ".git", "proto", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache", "build"}
MAX_LINES = 80


def _functions() -> list[tuple[str, int]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if SKIP & set(rel.parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(rel))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                out.append((f"{rel}:{node.lineno} {node.name}", length))
    return out


def test_no_function_is_longer_than_80_lines() -> None:
    long = [f"{where} ({n} lines)" for where, n in _functions() if n > MAX_LINES]
    assert not long, "functions over 80 lines; split them along their jobs:\n" + "\n".join(long)


def test_the_check_sees_the_code() -> None:
    # guard against a walk that silently finds nothing (a moved root, a wrong suffix)
    names = {where.split()[-1] for where, _ in _functions()}
    assert {"apply_role", "step", "require"} <= names
