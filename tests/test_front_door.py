"""The README is a front door: at most 200 lines, the three paths on its first screen, no
dated run or commit hash; every command has a row in its command table, and every option of
every command is in docs/commands.md, which is what the CLI itself prints (regenerated and
compared)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_a_front_door() -> None:
    lines = README.splitlines()
    assert len(lines) <= 200, len(lines)
    first_screen = "\n".join(lines[:80])
    for path in ("make demo", "docs/hardware.md", "docs/reproduce.md"):
        assert path in first_screen, path
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README), "a dated run belongs in docs/bench.md"
    assert not re.search(r"\b[0-9a-f]{7,40}\b", README.replace("DEMO", "")), "a commit hash"
    assert "issue " not in README.lower()


def _command_paths() -> list[str]:
    text = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    return re.findall(r"^## `epi ([a-z -]+)`$", text, flags=re.M)


def test_every_command_has_a_row_in_the_readme() -> None:
    rows = set(re.findall(r"^\| `epi ([a-z -]+)` \|", README, flags=re.M))
    paths = _command_paths()
    assert "meter run" in paths and "compare" in paths  # the walk reached them
    # every top-level command and every `epi meter` command; a group's own sub-commands
    # (model, maps, data, meter firmware) are on its guide's page and in docs/commands.md
    wanted = {p for p in paths if " " not in p or (p.startswith("meter ")
                                                    and p.count(" ") == 1)}
    assert wanted - {"meter"} <= rows, sorted(wanted - {"meter"} - rows)


def test_the_commands_page_is_what_the_cli_prints() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_commands_doc.py"),
                           "--check"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, ("docs/commands.md is stale: run "
                                  "`python scripts/gen_commands_doc.py`\n" + proc.stderr)
