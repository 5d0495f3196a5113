"""meter/ has no circle of files: every import, at module level or inside a function, drawn
from the source with ast. An import hidden in a function still ties the two files
together — it only moves the failure from import time to call time."""

from __future__ import annotations

import ast
from pathlib import Path

import meter

ROOT = Path(meter.__file__).resolve().parent
PACKAGE = "meter"


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module named by a (possibly relative) ``from ... import``."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph(root: Path = ROOT, *more_roots: Path) -> dict[str, set[str]]:
    """Module → the modules of `root` (and `more_roots`) it imports (files only: a package's
    ``__init__`` counts as a file; ``from pkg import name`` points at ``pkg.name`` when that
    is a module)."""
    roots = (root, *more_roots)
    files = {_module_name(p, r): p for r in roots for p in r.rglob("*.py")}
    packages = tuple(r.name for r in roots)
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = _resolve(name, is_package, node)
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in files else mod
                           for a in node.names]
            for target in targets:
                while target and target not in files:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target.startswith(packages) and target != name and target in files:
                    if files[target].name == "__init__.py" and not files[target].read_text().strip(
                            ).replace('"""', "").strip():
                        continue
                    graph[name].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_sees_a_circle_hidden_in_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from meter.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from meter import a\n    return a\nx = 1\n")
    (pkg / "c.py").write_text("from . import a\n")
    graph = import_graph(pkg)
    assert graph["meter.a"] == {"meter.b"} and graph["meter.c"] == {"meter.a"}
    assert find_cycles(graph) == [["meter.a", "meter.b"]]


def test_meter_has_no_circle_of_files() -> None:
    cycles = find_cycles(import_graph())
    assert cycles == [], "import circles in meter/: " + "; ".join(" ↔ ".join(c) for c in cycles)


def test_the_library_has_no_circle_of_files() -> None:
    """The same over the whole library: epi/, meter/ and host/ together."""
    import epi
    import host

    roots = [Path(m.__file__).resolve().parent for m in (epi, host)]
    graph = import_graph(ROOT, *roots)
    assert any(name.startswith("host.") for name in graph)  # the walk really covers host/
    cycles = find_cycles(graph)
    assert cycles == [], "import circles: " + "; ".join(" ↔ ".join(c) for c in cycles)
