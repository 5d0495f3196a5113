"""Every output option of every command, given a path nothing can be written to, is refused
with one line and exit 2 before any work: never a crash log. The inputs named do not exist, so
a command that started its work before checking its output fails on them with another message.

The option list is read from the command tree itself (lazily loaded groups included): a new
output option without a case here fails `test_every_output_option_has_a_case`.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from tests.cli_run import run_epi
from tests.host.test_campaign import write_study
from tests.host.test_hostile_cli import _commands

OUTPUT_OPTIONS = ("--out", "--output", "-o")


def _cases(bad_dir: str, bad_file: str, missing: Path, study: Path) -> dict[str, list[str]]:
    m = str(missing)
    return {
        "demo --out": ["demo", "--out", bad_dir],
        "model tiny out": ["model", "tiny", bad_file],
        "maps import --out": ["maps", "import", m, "--out", bad_dir],
        "quantize --out": ["quantize", m, "--model", m, "--out", bad_dir],
        "run --out": ["run", m, "--out", bad_dir],
        "accuracy --out": ["accuracy", m, "--out", bad_file],
        "analyze --out": ["analyze", m, "--trace", m, "--out", bad_dir],
        "search --out": ["search", m, "--out", bad_dir],
        "meter run --out": ["meter", "run", "--emulate", "--out", bad_dir, "--duration", "1"],
        "meter qualify --out": ["meter", "qualify", "--emulate", "--out", bad_file],
        "meter firmware build --out": ["meter", "firmware", "build", "--out", bad_dir],
        "meter calibrate --out": ["meter", "calibrate", "0", "--emulate", "--zero", "--out",
                                  bad_file],
        "meter calibrate --output": ["meter", "calibrate", "0", "--emulate", "--zero",
                                     "--output", bad_file],
        "campaign --out": ["campaign", str(study), "--out", bad_dir],
        "report --out": ["report", m, "--out", bad_dir],
        "bundle --out": ["bundle", m, "--out", bad_file],
        "compare --out": ["compare", m, m, "--out", bad_file],
        "submit --out": ["submit", m, "--hardware", m, "--out", bad_dir],
        "site --out": ["site", m, "--out", bad_dir],
    }


def _output_options() -> set[str]:
    found = set()
    for path, cmd in _commands():
        for p in cmd.params:
            names = getattr(p, "opts", [])
            for o in names:
                if o in OUTPUT_OPTIONS:
                    found.add(f"{path} {o}")
            if isinstance(p, click.Argument) and p.name == "out":
                found.add(f"{path} out")
    return found


def test_every_output_option_has_a_case(tmp_path: Path) -> None:
    cases = _cases("d", "f", tmp_path, tmp_path)
    assert _output_options() == set(cases)


CASES = sorted(_cases("d", "f", Path("m"), Path("s")))


@pytest.mark.parametrize("where", ["/proc/epi-test-out", "/sys/kernel/epi-test-out"])
@pytest.mark.parametrize("case", CASES)
def test_an_unwritable_output_is_one_line_before_any_work(
        case: str, where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EPI_HOME", str(tmp_path / "home"))
    (tmp_path / "s").mkdir()
    study = write_study(tmp_path / "s")
    args = _cases(where, where + ".json", tmp_path / "missing", study)[case]
    code, out, err = run_epi(monkeypatch, capsys, *args)
    # a deprecated spelling's warning line may come first: the error is the one other line
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("epi: warning:")]
    assert "internal error" not in err and not (tmp_path / "home" / "logs").exists(), (args, err)
    assert code == 2, (args, out, err)
    assert len(lines) == 1, (args, err)
    assert where in lines[0], (args, err)  # it names the output path, not a missing input
