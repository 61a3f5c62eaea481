"""The client package is the layer below the ledger API: nothing under `client/` imports
`tidelog.ledger` (the ledger package builds on the client, never the other way round), not even
lazily inside a function or under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

CLIENT_DIR = Path(__file__).resolve().parents[2] / "client"
FORBIDDEN = "tidelog.ledger"


def imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import anywhere in `tree`, relative ones resolved."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            out.append((node.lineno, module))
            # `from tidelog import ledger` imports the package too
            out.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return out


def test_the_client_package_has_modules_to_check():
    assert (CLIENT_DIR / "__init__.py").is_file()
    assert (CLIENT_DIR / "aio.py").is_file()


def test_no_client_module_imports_the_ledger_package():
    offenders = []
    for path in sorted(CLIENT_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, module in imported_modules(tree, "tidelog.client"):
            if module == FORBIDDEN or module.startswith(FORBIDDEN + "."):
                offenders.append(f"client/{path.relative_to(CLIENT_DIR)}:{line} imports {module}")
    assert offenders == []


def test_the_checker_sees_lazy_relative_and_type_checking_imports():
    source = """
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from tidelog.ledger.client import Ledgers
def f():
    import tidelog.ledger
    from ..ledger import segmented
    from tidelog import ledger
"""
    found = [m for _, m in imported_modules(ast.parse(source), "tidelog.client")]
    assert "tidelog.ledger.client" in found
    assert "tidelog.ledger" in found
    assert "tidelog.ledger.segmented" in found
