"""Library modules never import click: only `epi/commands/` (and the CLI root) may.

Every module under host/, meter/, epi/core and epi/formats is imported in a fresh interpreter;
after each import `click` must still be absent from `sys.modules`. A module that needs a
missing optional dependency (spidev, MicroPython's `machine`, ...) is passed over, but most
must import (so the test cannot pass by importing nothing).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("host", "meter", "epi/core", "epi/formats")


def _library_modules() -> list[str]:
    names = []
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            if rel.name == "__main__":
                continue  # runs a program when imported
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            names.append(".".join(parts))
    return names


CHECK = """
import importlib, json, sys
culprits, skipped, imported = [], [], 0
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "click":
            culprits.append(name)
        else:
            skipped.append(f"{name} ({exc.name})")
        continue
    imported += 1
    if "click" in sys.modules:
        culprits.append(name)
        break
print(json.dumps({"culprits": culprits, "skipped": skipped, "imported": imported}))
"""


def test_no_library_module_imports_click() -> None:
    modules = _library_modules()
    assert len(modules) > 50
    proc = subprocess.run([sys.executable, "-c", CHECK, json.dumps(modules)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["culprits"] == [], f"imports click: {out['culprits']}"
    assert out["imported"] >= 0.8 * len(modules), out["skipped"]


def _imports(path: Path) -> set[str]:
    """Every module an `import` names anywhere in a file (function bodies included)."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_no_library_module_imports_click_or_a_command_even_lazily() -> None:
    """Also an import inside a function (which the import test above cannot see)."""
    bad = []
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            for mod in _imports(path):
                if mod.split(".")[0] == "click" or mod == "epi.cli" or \
                        mod.startswith("epi.commands"):
                    bad.append(f"{path.relative_to(REPO)}: {mod}")
    assert bad == []
