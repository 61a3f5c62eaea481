"""docs/ARCHITECTURE.md stays true to the tree, and the subpackages stay free of import cycles.

- every file or folder path the page names in backquotes exists, and every `path.py::Name`
  and `tidelog.x.y.Name` it names is defined there (read with `ast`; nothing is imported);
- its sections are numbered `## N.` / `### N.M`, in order, each number once;
- `tidelog.importgraph` finds no cycle between subpackages and no import that goes up a layer of
  docs/ARCHITECTURE.md §2.2 (the layer order is read from that section, nowhere else);
- the controller loads no client code.

Citations of `docs/ARCHITECTURE.md §N` elsewhere are checked by tests/test_citations.py, whose
parsing is reused here for the one document.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

from tests.test_citations import CITED_DOC, _sections, _sources
from tidelog import importgraph

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
TICKED = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)*/(?:[\w.-]+\.(?:py|md|yaml|proto)|)$")
SYMBOL = re.compile(r"^([\w/.-]+\.py)::([A-Za-z_][\w.]*)$")
DOTTED = re.compile(r"^tidelog(?:\.[A-Za-z_]\w*)+$")
CLASS_ATTR = re.compile(r"^([A-Z]\w+)\.([a-z_]\w*)$")
HEADING = re.compile(r"^(#+)\s+(\d+)(?:\.(\d+))?[.\s]")


def _ticked() -> list[str]:
    return TICKED.findall(DOC.read_text())


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _scope(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names bound at one level: definitions, assignments and imports (for re-exports)."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.update({t.id: node for t in targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, ast.If | ast.Try):  # `if TYPE_CHECKING:` and guarded imports
            out.update(_scope(node.body))
    return out


def _defines(path: Path, dotted: str) -> bool:
    """Whether `dotted` (Name or Class.member) is bound in the module at `path`."""
    first, *rest = dotted.split(".")
    node = _scope(_tree(path).body).get(first)
    for part in rest:
        if not isinstance(node, ast.ClassDef):
            return node is not None  # imported or assigned: deeper names are not checked
        node = _scope(node.body).get(part)
    return node is not None


def _modules() -> dict[str, Path]:
    return {importgraph.module_name(p): p for p in importgraph.source_files()}


def _resolve_dotted(name: str, modules: dict[str, Path]) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in modules:
            rest = ".".join(parts[cut:])
            return not rest or _defines(modules[module], rest)
    return False


def test_every_path_the_page_names_exists() -> None:
    missing = []
    for token in _ticked():
        path = token.split("::")[0]
        if PATH.match(path) and not (ROOT / path).exists():
            missing.append(token)
    assert not missing, "docs/ARCHITECTURE.md names paths that do not exist: " + ", ".join(missing)


def test_every_function_and_class_the_page_names_exists() -> None:
    modules = _modules()
    classes = {n.name: n for p in modules.values() for n in ast.walk(_tree(p)) if isinstance(n, ast.ClassDef)}
    missing = []
    for token in _ticked():
        if m := SYMBOL.match(token):
            path = ROOT / m.group(1)
            ok = path.is_file() and _defines(path, m.group(2))
        elif DOTTED.match(token):
            ok = _resolve_dotted(token, modules)
        elif m := CLASS_ATTR.match(token):
            cls = classes.get(m.group(1))
            ok = cls is None or m.group(2) in _scope(cls.body)  # a class from elsewhere is not ours
        else:
            continue
        if not ok:
            missing.append(token)
    assert not missing, "docs/ARCHITECTURE.md names code that does not exist: " + ", ".join(missing)


def test_sections_are_numbered_in_order() -> None:
    problems, top, sub = [], 0, 0
    for line in DOC.read_text().splitlines():
        m = HEADING.match(line)
        if not m:
            continue
        level, major, minor = len(m.group(1)), int(m.group(2)), m.group(3)
        if level == 2 and minor is None:
            if major != top + 1:
                problems.append(f"{line!r} follows section {top}")
            top, sub = major, 0
        elif level == 3 and minor is not None:
            if major != top or int(minor) != sub + 1:
                problems.append(f"{line!r} follows section {top}.{sub}")
            sub = int(minor)
        else:
            problems.append(f"{line!r}: use '## N. Title' or '### N.M Title'")
    assert top >= 5 and not problems, problems


def test_citations_of_this_page_name_sections_it_has() -> None:
    heads = _sections(DOC)
    bad = [
        f"{src.relative_to(ROOT)}: {m.group(0)}"
        for src in _sources()
        for m in CITED_DOC.finditer(src.read_text(errors="replace"))
        if m.group(1) == "docs/ARCHITECTURE.md" and m.group(2) and m.group(2) not in heads
    ]
    assert not bad, bad


def test_no_import_cycle_between_subpackages() -> None:
    graph, _ = importgraph.build()
    found = importgraph.cycles(graph)
    assert not found, [" <-> ".join(c) for c in found]


def test_importgraph_finds_a_planted_cycle(tmp_path: Path) -> None:
    for folder in importgraph.FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "ha" / "x.py").write_text('"""x."""\nfrom tidelog.broker import y\n')
    (tmp_path / "broker" / "y.py").write_text('"""y."""\nfrom ..ha import x\n')
    (tmp_path / "commitlog" / "z.py").write_text('"""z."""\nfrom tidelog.errors import E\n')
    graph, modules = importgraph.build(tmp_path)
    assert importgraph.cycles(graph) == [["broker", "ha"]]
    assert graph.targets("commitlog") == ["tidelog.errors"]
    assert {m.summary for m in modules} == {"x.", "y.", "z."}


def test_no_import_goes_up_a_layer() -> None:
    assert importgraph.layer_violations() == []


def test_the_controller_loads_no_client_code() -> None:
    check = (
        "import tidelog.controller.state, tidelog.controller.service, sys; "
        "loaded = [m for m in sys.modules if m.startswith('tidelog.client')]; "
        "assert not loaded, loaded"
    )
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


LAYERS_DOC = """### 2.2 Which folder may import which

1. the base: `tidelog/`
2. `commitlog/`
3. `ha/` and
   `ledger/` on a continuation line
4. `broker/`, except `broker/top.py`

Prose after the list naming `cli/` is no layer.

### 2.3 Next
"""


def _planted(tmp_path: Path, files: dict[str, str]) -> list[str]:
    for folder in importgraph.FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "doc.md").write_text(LAYERS_DOC)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return importgraph.layer_violations(tmp_path, tmp_path / "doc.md")


def test_the_layers_are_read_from_the_numbered_list() -> None:
    assert importgraph.read_layers(ROOT / "docs" / "ARCHITECTURE.md")[0][0] == "tidelog/"
    layers = importgraph.read_layers_text(LAYERS_DOC)
    assert layers == [("tidelog/",), ("commitlog/",), ("ha/", "ledger/"), ("broker/", "broker/top.py")]
    assert importgraph.layer_of("broker/top.py", layers) == 3  # the longest prefix names it
    assert importgraph.layer_of("ledger/x.py", layers) == 2
    assert importgraph.layer_of("cli/x.py", layers) is None


def test_the_layer_check_finds_a_planted_upward_import(tmp_path: Path) -> None:
    found = _planted(
        tmp_path,
        {
            "commitlog/low.py": '"""low."""\nfrom tidelog.ha import high\n',
            "ha/high.py": '"""high."""\nfrom tidelog.commitlog import low\n',
            "ha/typed.py": '"""Only for the type checker."""\nfrom typing import TYPE_CHECKING\n'
            "if TYPE_CHECKING:\n    from tidelog.broker import b\n",
            "broker/b.py": '"""b."""\n',
        },
    )
    assert found == ["commitlog/low.py:2 imports tidelog.ha.high (layer 3 above 2)"]


def test_the_layer_check_counts_the_package_init_an_import_runs(tmp_path: Path) -> None:
    """Importing `tidelog.ledger.x` runs ledger/__init__.py: an eager import there counts; a
    module `__getattr__` (a lazy name) does not."""
    eager = '"""eager."""\nfrom tidelog.broker.b import B\n'
    lazy = '"""lazy."""\ndef __getattr__(name):\n    from tidelog.broker import b\n    return b\n'
    files = {
        "ha/user.py": '"""user."""\nfrom tidelog.ledger.x import X\n',
        "ledger/x.py": '"""x."""\n',
        "broker/b.py": '"""b."""\n',
    }
    found = _planted(tmp_path, {**files, "ledger/__init__.py": eager})
    assert found == ["ledger/__init__.py:2 imports tidelog.broker.b (layer 4 above 3)"]
    (tmp_path / "ledger" / "__init__.py").write_text(lazy)
    assert importgraph.layer_violations(tmp_path, tmp_path / "doc.md") == []
    (tmp_path / "broker" / "__init__.py").write_text('"""b."""\n')
    (tmp_path / "commitlog" / "c.py").write_text('"""c."""\nfrom tidelog.ledger.x import X\n')
    assert importgraph.layer_violations(tmp_path, tmp_path / "doc.md") == [
        "commitlog/c.py:2 imports tidelog.ledger (layer 3 above 2)",
        "commitlog/c.py:2 imports tidelog.ledger.x (layer 3 above 2)",
    ]
