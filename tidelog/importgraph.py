"""The import graph between tidelog's subpackages, and the module list of each, read from source.

Owns one question a maintainer asks before moving code: which subpackage imports which, and is
there a cycle between them? `python -m tidelog.importgraph` parses every `.py` under the package
folders with `ast` (nothing is imported or run), maps each `tidelog.X.y` import to the subpackage
`X`, prints the edges and exits 1 naming every cycle it finds and every import that goes up a
layer. `--modules` prints one line per module instead (line count and the first line of its
docstring), which is how the folder map in docs/ARCHITECTURE.md §2 is kept current.

Nodes: the repository's top-level folders (`broker`, `client`, `cli`, ...), and inside the
`tidelog/` folder each module and subpackage on its own (`tidelog.errors`, `tidelog.proto`, ...),
which is how a cycle through the foundation shows where it is.

Layers: the order written once in docs/ARCHITECTURE.md §2.2 (a numbered list of folders and
files) is read from there, and every import a module runs, with the package `__init__`s it runs
on the way, is checked against it; the printout ends with each import that goes up a layer.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The package folders, in the order they are printed; see pyproject.toml's package-dir.
FOLDERS: tuple[str, ...] = (
    "broker",
    "client",
    "commitlog",
    "controller",
    "ha",
    "ledger",
    "spark",
    "lab",
    "sim",
    "localcluster",
    "drill",
    "cli",
    "tidelog",
)
GENERATED_SUFFIXES: tuple[str, ...] = ("_pb2.py", "_pb2_grpc.py")
# The layer order is written once, as the numbered list of this section, and read from there.
DOC = ROOT / "docs" / "ARCHITECTURE.md"
LAYER_SECTION = "### 2.2 "
_ITEM = re.compile(r"^(\d+)\. ")
_LAYER_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)*(?:/|\.py))`")


@dataclass(frozen=True)
class Module:
    """One source file: its dotted name, the node it belongs to, and what it says it owns."""

    name: str
    node: str
    path: Path
    lines: int
    summary: str


@dataclass
class Graph:
    """Edges between nodes; each edge remembers the modules that make it, for the printout."""

    nodes: list[str] = field(default_factory=list)
    edges: dict[str, dict[str, set[str]]] = field(default_factory=dict)

    def add(self, src: str, dst: str, via: str) -> None:
        if src != dst:
            self.edges.setdefault(src, {}).setdefault(dst, set()).add(via)

    def targets(self, src: str) -> list[str]:
        return sorted(self.edges.get(src, {}))


def node_of(dotted: str) -> str | None:
    """The node a `tidelog...` module name belongs to, or None for anything outside the package."""
    parts = dotted.split(".")
    if parts[0] != "tidelog":
        return None
    if len(parts) >= 2 and parts[1] in FOLDERS and parts[1] != "tidelog":
        return parts[1]
    if len(parts) >= 2:
        return f"tidelog.{parts[1]}"  # a root module or cli, tidelog/proto
    return "tidelog"  # the package's own __init__


def module_name(path: Path, root: Path = ROOT) -> str:
    """`commitlog/log.py` -> `tidelog.commitlog.log`; `cli/__init__.py` -> `tidelog.cli`."""
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[0] != "tidelog":
        parts.insert(0, "tidelog")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path = ROOT) -> Iterator[Path]:
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" not in path.parts and not path.name.endswith(GENERATED_SUFFIXES):
                yield path


def _summary(tree: ast.Module) -> str:
    doc = ast.get_docstring(tree) or ""
    return doc.strip().splitlines()[0] if doc.strip() else "(no docstring)"


def read_module(path: Path, root: Path = ROOT) -> tuple[Module, ast.Module]:
    text = path.read_text()
    tree = ast.parse(text, filename=str(path))
    name = module_name(path, root)
    node = node_of(name)
    if node is None:  # cannot happen for files under the package folders
        raise ValueError(f"{path} is not part of the tidelog package")
    return Module(name, node, path, len(text.splitlines()), _summary(tree)), tree


def imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """Every module name an import statement in `tree` names, relative imports resolved."""
    package = module if is_package else module.rpartition(".")[0]
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.Import):
            yield from (alias.name for alias in stmt.names)
        elif isinstance(stmt, ast.ImportFrom):
            base = stmt.module or ""
            if stmt.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (stmt.level - 1)]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            yield base
            # `from tidelog import errors` names the module tidelog.errors, not the root
            yield from (f"{base}.{alias.name}" for alias in stmt.names if alias.name != "*")


def build(root: Path = ROOT) -> tuple[Graph, list[Module]]:
    graph = Graph()
    modules: list[Module] = []
    for path in source_files(root):
        mod, tree = read_module(path, root)
        modules.append(mod)
        if mod.node not in graph.nodes:
            graph.nodes.append(mod.node)
        for name in imported_names(tree, mod.name, path.name == "__init__.py"):
            target = node_of(name)
            if target is not None and _is_real(name, target):
                graph.add(mod.node, target, mod.name)
    return graph, modules


def _is_real(name: str, target: str) -> bool:
    """`from tidelog.x import y` also yields `tidelog.x.y`; a bare `tidelog` root names no node."""
    return not (target == "tidelog" and name == "tidelog")


def reachable(graph: Graph, start: str) -> set[str]:
    """Every node `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(graph.targets(start))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.targets(node))
    return seen


def cycles(graph: Graph) -> list[list[str]]:
    """Groups of nodes that all reach each other (strongly connected, more than one), each sorted.

    Quadratic, which is nothing for a dozen nodes and easier to check by eye than Tarjan's."""
    nodes = sorted(set(graph.nodes) | set(graph.edges))
    reach = {node: reachable(graph, node) for node in nodes}
    found: list[list[str]] = []
    placed: set[str] = set()
    for node in nodes:
        if node in placed or node not in reach[node]:
            continue
        group = sorted(other for other in reach[node] if node in reach[other])
        placed.update(group)
        found.append(group)
    return found


def cycle_edges(graph: Graph, component: list[str]) -> list[str]:
    """The edges inside one cycle, with the modules that make them: where to cut."""
    out = []
    for src in component:
        for dst in graph.targets(src):
            if dst in component:
                via = ", ".join(sorted(graph.edges[src][dst]))
                out.append(f"  {src} -> {dst}  ({via})")
    return out


def read_layers(doc: Path = DOC) -> list[tuple[str, ...]]:
    """The layers of docs/ARCHITECTURE.md §2.2, bottom first, each the folders and files it names.

    A layer is one numbered item of the section; its paths are the backquoted folders (`ha/`)
    and files (`client/transport.py`) in the item, continuation lines included."""
    return read_layers_text(doc.read_text())


def read_layers_text(text: str) -> list[tuple[str, ...]]:
    """`read_layers` of the page's text."""
    layers: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("### "):
            inside = line.startswith(LAYER_SECTION)
            continue
        if not inside:
            continue
        if _ITEM.match(line):
            layers.append([])
        elif not line.startswith(" "):
            continue  # prose between and after the items names paths that are no layer
        if layers:
            layers[-1].extend(_LAYER_PATH.findall(line))
    return [tuple(paths) for paths in layers]


def layer_of(path: str, layers: list[tuple[str, ...]]) -> int | None:
    """The index of the layer naming the longest prefix of `path` (relative, with slashes)."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, prefixes in enumerate(layers):
        for prefix in prefixes:
            fits = path == prefix if prefix.endswith(".py") else path.startswith(prefix)
            if fits and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def runtime_imports(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """Every module name imported when the module runs, with its line: `imported_names` without
    the imports under `if TYPE_CHECKING:`, which only the type checker reads, and without those of
    a module-level `__getattr__` (PEP 562), which run on the importer's behalf."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and node in tree.body:
            continue  # a package's lazy names: loaded when the importer asks for one, in its layer
        if isinstance(node, ast.Import | ast.ImportFrom):
            stub = ast.Module(body=[node], type_ignores=[])
            yield from ((name, node.lineno) for name in imported_names(stub, module, is_package))
            continue
        todo.extend(ast.iter_child_nodes(node))


def _loaded(name: str, known: dict[str, Path]) -> list[str]:
    """The modules Python runs to import `name`: the longest known module it names and every
    package `__init__` above it (importing `tidelog.ledger.metadata` runs ledger/__init__.py)."""
    parts = name.split(".")
    return [".".join(parts[:cut]) for cut in range(len(parts), 1, -1) if ".".join(parts[:cut]) in known]


def layer_violations(root: Path = ROOT, doc: Path = DOC) -> list[str]:
    """Every import that goes up a layer of §2.2, and every module no layer names."""
    layers = read_layers(doc)
    paths = {module_name(p, root): p for p in source_files(root)}
    rel = {name: p.relative_to(root).as_posix() for name, p in paths.items()}
    level = {name: layer_of(path, layers) for name, path in rel.items()}
    found = [f"{rel[name]} is in no layer of §2.2" for name, lay in level.items() if lay is None]
    for name, path in paths.items():
        src = level[name]
        if src is None:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for imported, line in runtime_imports(tree, name, path.name == "__init__.py"):
            for target in _loaded(imported, paths):
                dst = level[target]
                if dst is not None and dst > src:
                    found.append(f"{rel[name]}:{line} imports {target} (layer {dst + 1} above {src + 1})")
    return sorted(set(found))


def print_graph(graph: Graph) -> int:
    for src in graph.nodes:
        print(f"{src} -> {', '.join(graph.targets(src)) or '(nothing)'}")
    found = cycles(graph)
    for comp in found:
        print(f"CYCLE: {' <-> '.join(comp)}")
        print("\n".join(cycle_edges(graph, comp)))
    upward = layer_violations()
    for line in upward:
        print(f"UP A LAYER: {line}")
    return 1 if found or upward else 0


def print_modules(modules: list[Module]) -> int:
    for mod in modules:
        rel = mod.path.relative_to(ROOT)
        print(f"{str(rel):40} {mod.lines:5}  {mod.summary}")
    return 0


def main(argv: list[str] | None = None) -> int:
    summary = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m tidelog.importgraph", description=summary)
    parser.add_argument(
        "--modules",
        action="store_true",
        help="one line per module: its line count and the first line of its docstring",
    )
    args = parser.parse_args(argv)
    graph, modules = build()
    try:
        return print_modules(modules) if args.modules else print_graph(graph)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
