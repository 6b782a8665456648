"""accelreg's import graph: every import of the package's own modules, module to module.

    python tools/imports.py            # the cycles, the lazy imports, the private reaches
    python tools/imports.py --graph    # every edge, as "module -> imported"

Imports under ``if TYPE_CHECKING:`` are left out (they never run); imports inside functions are
counted and listed, because they hide the graph: each one should say why it is lazy.
A *private reach* is a module using a private (``_name``) module or name that belongs to a
package it is not part of: ``accelreg.launch.startup`` importing ``accelreg.integrations._postimport``,
or ``placement._backend_of(...)`` called from ``accelreg.integrations``. A private name belongs to
the package of the module that defines it (a private module to its own package), and every module
inside that package may use it. ``tests/test_architecture.py`` checks the graph has no cycles, that
the layers only import downwards, and that nothing reaches into another package's private names.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "accelreg"


@dataclass
class Graph:
    """Modules of the package, their imports of each other, and which imports are lazy."""

    modules: dict[str, Path]
    edges: dict[str, set[str]] = field(default_factory=dict)
    lazy: list[tuple[str, int, str]] = field(default_factory=list)  # (module, line, imported)
    private: list[tuple[str, int, str]] = field(default_factory=list)  # (module, line, "owner._name")

    def cycles(self) -> list[list[str]]:
        """Strongly connected components of more than one module (Tarjan)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on: set[str] = set()
        out: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            for w in sorted(self.edges.get(v, ())):
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
                if len(comp) > 1:
                    out.append(sorted(comp))

        for v in sorted(self.modules):
            if v not in index:
                visit(v)
        return out


def _module_names(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(tree: ast.Module) -> Iterator[tuple[ast.AST, bool]]:
    """Every import statement, with whether it runs inside a function; TYPE_CHECKING blocks skipped."""

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.AST, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from ((n, f) for orelse in child.orelse for n, f in walk(orelse, in_function))
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    yield from walk(tree, False)


def build(root: Path = ROOT) -> Graph:
    """The graph of ``root`` (the ``accelreg`` package folder)."""
    graph = Graph(_module_names(root))
    for name, path in graph.modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound: dict[str, str] = {}  # local name -> the accelreg module it is bound to
        for node, in_function in _imports(tree):
            for target in _targets(graph.modules, name, is_package, node):
                if target == name:
                    continue
                graph.edges.setdefault(name, set()).add(target)
                if in_function:
                    graph.lazy.append((name, node.lineno, target))
            for local, module, attr in _bindings(graph.modules, name, is_package, node):
                if attr is None:
                    bound[local] = module
                _reach(graph, name, node.lineno, module, attr)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
            ):
                _reach(graph, name, node.lineno, bound[node.value.id], node.attr)
    return graph


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _owner(modules: dict[str, Path], module: str) -> str:
    """The package a module's private names belong to: the module itself when it is a package,
    else its parent."""
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def _reach(graph: Graph, importer: str, line: int, module: str, attr: str | None) -> None:
    """Record ``importer`` using ``module`` (or ``module.attr``) where that is another package's private."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if _private(part):  # a private module: its package's
            owner = ".".join(parts[:i])
            if not (importer == owner or importer.startswith(owner + ".")):
                graph.private.append((importer, line, module))
            return
    if attr is not None and _private(attr):
        owner = _owner(graph.modules, module)
        if not (importer == owner or importer.startswith(owner + ".")):
            graph.private.append((importer, line, f"{module}.{attr}"))


def _from_base(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` in module ``name`` imports from, relative levels resolved."""
    if not node.level:
        return node.module or ""
    base_parts = name.split(".") if is_package else name.split(".")[:-1]
    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
    return ".".join([*base_parts, *([node.module] if node.module else [])])


def _bindings(
    modules: dict[str, Path], name: str, is_package: bool, node: ast.AST
) -> Iterator[tuple[str, str, str | None]]:
    """``(local name, accelreg module, attribute or None)`` for each name an import binds: the
    attribute is the imported name when it is not itself a module."""
    top = name.split(".")[0]
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == top and alias.name in modules:
                yield (alias.asname or alias.name.split(".")[0]), alias.name, None
        return
    assert isinstance(node, ast.ImportFrom)
    base = _from_base(name, is_package, node)
    if base.split(".")[0] != top or base not in modules:
        return
    for alias in node.names:
        full = f"{base}.{alias.name}"
        if full in modules:
            yield alias.asname or alias.name, full, None
        else:
            yield alias.asname or alias.name, base, alias.name


def _targets(modules: dict[str, Path], name: str, is_package: bool, node: ast.AST) -> Iterator[str]:
    top = name.split(".")[0]
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        base = _from_base(name, is_package, node)
        candidates = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    for target in candidates:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target.split(".")[0] == top:
            yield target


def main(argv: list[str]) -> int:
    graph = build()
    if "--graph" in argv:
        for module in sorted(graph.edges):
            print(f"{module} -> {', '.join(sorted(graph.edges[module]))}")
        return 0
    cycles = graph.cycles()
    for cycle in cycles:
        print("cycle:", " -> ".join(cycle))
    print(
        f"{len(graph.modules)} modules, {sum(map(len, graph.edges.values()))} imports, {len(cycles)} cycles"
    )
    print(f"{len(graph.lazy)} imports inside functions:")
    for module, line, target in sorted(graph.lazy):
        print(f"  {module}:{line} -> {target}")
    print(f"{len(graph.private)} reaches into another package's private names:")
    for module, line, target in sorted(graph.private):
        print(f"  {module}:{line} -> {target}")
    return 1 if cycles or graph.private else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
