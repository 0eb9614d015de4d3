"""The package's modules import each other without a circle.

The import graph is read from the source (``ast``), not from ``sys.modules``, so it
sees every ``import`` statement: at module level, inside functions (the lazy imports
that hide a circle from Python's import machinery but not from a reader) and inside
``try`` blocks. Only ``if TYPE_CHECKING:`` blocks are left out: they never run.
Imports by a computed name (``importlib.import_module``, as the pickle shim and the
CLI's estimator table do) are not seen.

An edge ``a -> b`` means module ``a`` names module ``b`` in an import:
``import p.b`` and ``from p.b import x`` give ``p.b``; ``from p import b`` gives
``p.b`` when ``b`` is a module of ``p``, else ``p`` (its ``__init__``). The parent
packages Python also imports on the way are not edges: every submodule would then
form a circle with an ``__init__`` that re-exports it.

Run as a script to print the circles (``python tests/test_import_graph.py``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "ilargi_sklearn"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[tuple[str, list[str], int]]:
    """``(module, names, level)`` of every import that can run."""
    found: list[tuple[str, list[str], int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, [], 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names]
            found.append((node.module or "", names, node.level))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in its body)."""
    paths = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    packages = {name for name, p in paths.items() if p.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        here = name if name in packages else name.rpartition(".")[0]
        edges: set[str] = set()
        for module, names, level in _imports(tree):
            if level:
                base = here.split(".")
                base = base[: len(base) - (level - 1)]
                module = ".".join(base + ([module] if module else []))
            if module != PACKAGE and not module.startswith(PACKAGE + "."):
                continue
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in paths]
            if len(targets) < len(names) or not names:
                # A name that is not a submodule comes from the module itself.
                while module and module not in paths:
                    module = module.rpartition(".")[0]
                targets.append(module)
            edges.update(t for t in targets if t and t != name)
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(cycles)


def _describe(graph: dict[str, set[str]], cycle: list[str]) -> str:
    members = set(cycle)
    arrows = [f"  {a} -> {b}" for a in cycle for b in sorted(graph[a] & members)]
    return "\n".join([f"{len(cycle)} modules:", *arrows])


def test_the_graph_sees_the_package():
    """The reader finds the package's modules and their imports (a graph that
    missed them would find no circle for the wrong reason; the function-level
    imports are checked on a small package below)."""
    graph = import_graph()
    assert len(graph) > 50
    assert (
        f"{PACKAGE}.multisource._operators"
        in graph[f"{PACKAGE}.multisource._multi_source"]
    )
    assert f"{PACKAGE}.multisource" in graph[f"{PACKAGE}.datasets._flights"]


def test_cycles_are_found(tmp_path):
    """A circle through a function-level import is reported; one behind
    ``if TYPE_CHECKING:`` is not (it never runs)."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text(f"from {PACKAGE}.sub.b import g\n")
    (pkg / "sub" / "b.py").write_text(
        "def g():\n    from .a import f\n"
        "from typing import TYPE_CHECKING\n"
        f"if TYPE_CHECKING:\n    from {PACKAGE}.sub import c\n"
    )
    (pkg / "sub" / "c.py").write_text(f"from {PACKAGE}.sub.b import g\n")
    graph = import_graph(pkg)
    assert graph[f"{PACKAGE}.sub"] == {f"{PACKAGE}.sub.a"}
    assert graph[f"{PACKAGE}.sub.b"] == {f"{PACKAGE}.sub.a"}
    assert import_cycles(graph) == [[f"{PACKAGE}.sub.a", f"{PACKAGE}.sub.b"]]


def test_no_import_cycle():
    """A circle means two modules each need the other: the layers of STYLE.md
    (backend, data structure, estimators, planner, CLI) no longer stack. Break it
    by moving the shared piece down, or by a registration hook (as the Dask
    source kind does) instead of an upward import."""
    graph = import_graph()
    cycles = import_cycles(graph)
    assert not cycles, "import circles in the package:\n" + "\n".join(
        _describe(graph, c) for c in cycles
    )


if __name__ == "__main__":
    graph = import_graph()
    cycles = import_cycles(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports")
    for c in cycles:
        print(_describe(graph, c))
    print(f"{len(cycles)} circle(s)")
