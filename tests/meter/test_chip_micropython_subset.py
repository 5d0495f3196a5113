"""The chip layer is reused by the board's MicroPython firmware: keep it to that subset.

No annotations (typing), no dataclasses, no `from __future__`, no walrus or `match`, no
f-string `=` specifiers, and imports only of `math` and the chip layer itself. A fast static
check of the constructs MicroPython lacks; tests/meter/firmware/ runs the same modules on real
MicroPython 1.27 and compiles them with mpy-cross.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHIP_MODULES = sorted(
    str(p.relative_to(REPO)) for p in (REPO / "meter" / "chip").glob("*.py")
)
_FSTRING_EQ = re.compile(r"\{[^{}]*[^=!<>]=(![rsa])?(:[^{}]*)?\}")
ALLOWED_IMPORTS = {"math", "meter.chip"} | {
    f"meter.chip.{p.stem}" for p in (REPO / "meter" / "chip").glob("*.py")
    if p.stem != "__init__"
}


@pytest.mark.parametrize("path", CHIP_MODULES)
def test_module_stays_in_the_micropython_subset(path: str) -> None:
    source = (REPO / path).read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', '?')}"
        assert not isinstance(node, (ast.AnnAssign, ast.NamedExpr, ast.Match)), where
        if isinstance(node, ast.Set) or (isinstance(node, (ast.List, ast.Tuple))
                                         and isinstance(node.ctx, ast.Load)):
            # MicroPython: "*x must be assignment target" ([a, *b] is a SyntaxError there)
            assert not any(isinstance(e, ast.Starred) for e in node.elts), where
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.returns is None, where
            args = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
            assert all(a.annotation is None for a in args), where
            # MicroPython has these three builtins and a property's `.setter`
            assert not node.decorator_list or all(
                (isinstance(d, ast.Name) and d.id in ("property", "classmethod", "staticmethod"))
                or (isinstance(d, ast.Attribute) and d.attr == "setter"
                    and isinstance(d.value, ast.Name))
                for d in node.decorator_list
            ), where
        if isinstance(node, ast.ClassDef):
            assert not node.decorator_list, where
        if isinstance(node, ast.Import):
            assert {a.name for a in node.names} <= ALLOWED_IMPORTS, where
        if isinstance(node, ast.ImportFrom):
            assert node.module in ALLOWED_IMPORTS, where
    # f-string self-documenting `=` ({x=}, {x=!r}, {x=:04X}), on any Python's tokenizer
    for n, line in enumerate(source.splitlines(), 1):
        if re.search(r"\bf[\"']", line):
            assert not _FSTRING_EQ.search(line), f"{path}:{n}"
