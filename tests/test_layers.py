"""The library's layers as a contract: epi.core < epi.formats < meter < host < epi.commands.

A module may import its own layer and the layers below it, never one above, lazily (inside a
function) or not: the meter runs on a Pi without the host's dependencies, and the formats are read
by both. Every `import` in every file is read with ast, function bodies included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# lowest first; a module's layer is the first prefix it matches
LAYERS: tuple[tuple[str, ...], ...] = (
    ("epi.core",),
    ("epi.formats",),
    ("meter",),
    ("host",),
    ("epi.commands", "epi.cli", "epi.__main__"),
)


def layer_of(module: str) -> int | None:
    """The index of the layer `module` belongs to (None: outside the project)."""
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                return i
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every absolute import in a file, function bodies included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module != "epi":  # the bare package: its names are read below
                found.append((node.lineno, node.module))
            # `from epi import commands` names a module, not only a package
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if node.module == "epi"]
    return found


def upward_imports(files: list[Path]) -> list[str]:
    bad = []
    for path in files:
        own = layer_of(module_name(path))
        if own is None:
            continue
        for line, mod in imported_modules(path):
            target = layer_of(mod)
            if target is not None and target > own:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {mod} "
                           f"(layer {LAYERS[target][0]} above {LAYERS[own][0]})")
    return bad


def library_files() -> list[Path]:
    return sorted(p for root in ("epi", "meter", "host") for p in (REPO / root).rglob("*.py"))


def test_the_layers_are_known() -> None:
    assert layer_of("epi.core.text") == 0
    assert layer_of("epi.formats.trace") == 1
    assert layer_of("meter.daemon.sampler") == 2
    assert layer_of("host.analysis.model") == 3
    assert layer_of("epi.commands.analyze") == 4
    assert layer_of("epi.cli") == 4
    assert layer_of("numpy") is None


def test_no_module_imports_a_layer_above_its_own() -> None:
    files = library_files()
    assert len(files) > 200
    assert upward_imports(files) == []


@pytest.mark.parametrize(("where", "text"), [
    ("epi/core/text.py", "from epi.formats import trace\n"),
    ("epi/formats/trace.py", "def f():\n    import meter.daemon.sampler\n"),
    ("meter/plan.py", "from host.analysis.model import Options\n"),
    ("host/analysis/model.py", "def f():\n    from epi.commands import analyze\n"),
    ("host/doctor.py", "from epi import cli\n"),
])
def test_one_upward_import_is_found(tmp_path: Path, where: str, text: str) -> None:
    """The contract fails when one upward import is added (a copy of the file, one line more)."""
    original = REPO / where
    copy = REPO / where.replace(".py", "_layer_probe.py")
    copy.write_text(original.read_text(encoding="utf-8") + "\n" + text, encoding="utf-8")
    try:
        bad = upward_imports([copy])
    finally:
        copy.unlink()
    assert len(bad) == 1, bad
