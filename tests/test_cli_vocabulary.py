"""One name per concept on the command line: every visible option of every `epi` command
(the lazy `epi meter` group included) avoids the second spellings that
epi.commands.aliases.SYNONYMS lists, and an old spelling kept as a hidden alias still works,
warns, and cannot be given beside the new one."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from epi.commands.aliases import SYNONYMS
from tests.cli_run import run_epi
from tests.host.test_hostile_cli import _commands


def _visible_options() -> dict[str, list[str]]:
    """Every visible long option → the commands that have it."""
    seen: dict[str, list[str]] = {}
    for path, cmd in _commands():
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                for name in (*p.opts, *p.secondary_opts):
                    if name.startswith("--"):
                        seen.setdefault(name, []).append(path)
    return seen


def test_no_command_spells_a_known_option_a_second_way() -> None:
    seen = _visible_options()
    wrong = {f"{old} (say {new})": seen[old] for new, olds in SYNONYMS.items()
             for old in olds if old in seen}
    assert not wrong, wrong
    assert "--out" in seen and "--trace" in seen  # the walk reached the commands


def test_the_walk_would_catch_a_second_spelling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break it once: a visible `--output` on a command is found."""
    from epi.commands import compare as compare_mod

    extra = click.Option(["--output"], default=None)
    monkeypatch.setattr(compare_mod.compare, "params", [*compare_mod.compare.params, extra])
    assert "compare" in _visible_options()["--output"]


def test_an_old_spelling_still_works_and_warns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "cal" / "ch1.json"
    args = ["meter", "calibrate", "ch1", "--emulate", "--emulate-gain-error", "0.04",
            "--volts", "230", "--amps", "0.05", "--watts", "9.2", "--seconds", "2"]
    code, _, err = run_epi(monkeypatch, capsys, *args, "--output", str(target))
    assert code == 0, err
    assert "--output is now --out" in err
    assert target.is_file()
    code, _, err = run_epi(monkeypatch, capsys, *args, "--output", str(target), "--out",
                             str(tmp_path / "other.json"))
    assert code == 2 and "give --out only (--output is its old spelling)" in err
