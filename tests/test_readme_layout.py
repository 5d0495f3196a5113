"""The layout table (docs/development.md, "Layout"; the README links to it) matches the
tree: every package and top-level module of the library has a row, and every path a row
names exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _layout_paths() -> set[str]:
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    table = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in table.splitlines()
                   if line.startswith("| `")]
    return {p.rstrip("/") for cell in first_cells for p in re.findall(r"`([^`]+)`", cell)}


def _library_rooms() -> set[str]:
    rooms: set[str] = set()
    for top in ("epi", "meter", "host"):
        for child in (REPO / top).iterdir():
            if child.name.startswith(("_", ".")):
                continue
            package = child.is_dir() and (child / "__init__.py").exists()
            module = child.suffix == ".py" and top != "epi"  # epi/cli.py etc. share one row
            if package or module:
                rooms.add(f"{top}/{child.name}")
    return rooms


def test_every_library_room_has_a_row() -> None:
    missing = sorted(_library_rooms() - _layout_paths())
    assert missing == [], f"the layout table lacks rows for {missing}"


def test_every_row_names_a_path_that_exists() -> None:
    gone = sorted(p for p in _layout_paths()
                  if "/" in p or p.endswith((".py", ".toml", ".md"))
                  if not (REPO / p).exists())
    assert gone == [], f"the layout table names paths that do not exist: {gone}"
