"""No command deletes, renames or overwrites a user's file inside its output.

Every command with an --out/--output option, found by walking the CLI as
tests/host/test_hostile_cli.py does (the lazy `epi meter` group included), is run with that
option naming a directory that already holds a sentinel file. Whatever the command does, write
there or refuse, the sentinel must be there afterwards, byte for byte, and the answer must not
be a crash. A command with an output option and no case below fails the completeness test, so
a new command cannot slip past. The cases that do their whole work (the emulated meter for a
second, the analysis and report of a synthetic run, the firmware bundle) show the output is
written beside the sentinel, not over it; the others are refused on their inputs, which shows
the refusal does not clear the directory first.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from tests.host.test_hostile_cli import _commands

REPO = Path(__file__).resolve().parents[2]
SENTINEL = "users-own-file.txt"
TEXT = "the user's own file: never touched\n"
OUT_OPTIONS = ("--out", "--output")


def _commands_with_out() -> list[str]:
    return sorted(path for path, c in _commands() if not isinstance(c, click.Group)
                  and any(o in OUT_OPTIONS for p in c.params if isinstance(p, click.Option)
                          for o in p.opts))


# command → argv after `epi COMMAND`, given (out dir, a missing path, the synthetic inputs)
Case = Callable[[Path, Path, dict[str, Path]], list[str]]
CASES: dict[str, Case] = {
    "accuracy": lambda o, m, _: [str(m), "--out", str(o)],
    "analyze": lambda o, m, s: [str(s["run"]), "--trace", str(s["trace"]), "--out", str(o)],
    "bundle": lambda o, m, _: [str(m), "--out", str(o)],
    "campaign": lambda o, m, _: [str(m), "--out", str(o)],
    "compare": lambda o, m, _: [str(m), str(m), "--out", str(o)],
    "demo": lambda o, m, _: ["--out", str(o), "--study", str(m)],
    "maps import": lambda o, m, _: [str(m), "--out", str(o)],
    "meter calibrate": lambda o, m, _: ["0", "--emulate", "--out", str(o)],
    "meter firmware build": lambda o, m, _: ["--out", str(o)],
    "meter qualify": lambda o, m, _: ["--board", str(m), "--out", str(o)],
    "meter run": lambda o, m, _: ["--emulate", "--duration", "1", "--listen", "127.0.0.1:0",
                                  "--out", str(o)],
    "quantize": lambda o, m, _: [str(m), "--model", str(m), "--out", str(o)],
    "report": lambda o, m, s: [str(s["analysis"]), "--out", str(o)],
    "run": lambda o, m, _: [str(m), "--out", str(o)],
    "search": lambda o, m, _: [str(m), "--out", str(o)],
    "site": lambda o, m, _: [str(m), "--out", str(o)],
    "submit": lambda o, m, _: [str(m), "--out", str(o), "--hardware", str(m)],
}
WRITES = {"analyze", "report", "meter run", "meter firmware build"}  # do their whole work


def test_every_command_with_an_output_has_a_sentinel_case() -> None:
    found = _commands_with_out()
    assert len(found) >= 15  # the walk reached the meter group's commands too
    assert set(found) == set(CASES), set(found) ^ set(CASES)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A synthetic run with its trace, and its analysis (the report's input)."""
    from host.analysis.output import analyze_to
    from host.analysis.pipeline import Options
    from tests.host.conftest import write_synth_run

    root = tmp_path_factory.mktemp("sentinel")
    trace, run, _, _ = write_synth_run(root)
    analyze_to(root / "analysis", [run], trace, Options())
    return {"run": run, "trace": trace, "analysis": root / "analysis"}


# the two cases over FAST_TEST_LIMIT_S (tests/conftest.py) run in the full pass only
_LONG_CASES = frozenset({"report", "meter run"})
assert set(CASES) >= _LONG_CASES, _LONG_CASES - set(CASES)  # a misspelt name marks nothing


@pytest.mark.parametrize("command", [
    pytest.param(c, marks=pytest.mark.long) if c in _LONG_CASES else c for c in sorted(CASES)])
def test_the_sentinel_in_the_output_survives(command: str, synthetic: dict[str, Path],
                                             tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / SENTINEL).write_text(TEXT)
    argv = [sys.executable, "-m", "epi", *command.split(),
            *CASES[command](out, tmp_path / "missing.toml", synthetic)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "EPI_HOME": str(tmp_path / "home"),
                            "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
    assert (out / SENTINEL).read_text() == TEXT, (command, r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr[-2000:]
    if command in WRITES:
        assert r.returncode == 0, r.stderr[-2000:]
        assert {p.name for p in out.iterdir()} - {SENTINEL}, "nothing written beside it"
    else:
        assert r.returncode != 0 or len(list(out.iterdir())) >= 1
