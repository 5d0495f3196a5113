"""An output path that cannot be written is a one-line user error (exit 2, no crash log),
checked before any long work starts, for the commands whose --out this test lists.
The base model / run paths given do not exist: a command that started its work before checking
--out would fail on them instead, with a different message."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_run import run_epi
from tests.host.test_campaign import write_study


def _cases(blocker: Path, missing: Path, study: Path) -> list[list[str]]:
    bad = str(blocker / "sub")  # under a regular file: can never be made
    return [
        ["run", str(missing), "--out", bad],
        ["meter", "firmware", "build", "--out", bad],
        ["analyze", str(missing), "--trace", str(missing), "--out", bad],
        ["search", str(missing), "--out", bad],
        ["quantize", str(missing), "--model", str(missing), "--out", bad],
        ["accuracy", str(missing), "--out", str(blocker / "sub" / "acc.json")],
        ["maps", "import", str(missing), "--out", bad],
        ["model", "tiny", str(blocker / "sub" / "tiny.gguf")],
        ["campaign", str(study), "--out", bad],
    ]


@pytest.mark.parametrize("which", range(9))
def test_unwritable_out_is_one_line_before_any_work(
        which: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("the user's file\n")
    monkeypatch.setenv("EPI_HOME", str(tmp_path / "home"))
    (tmp_path / "s").mkdir()
    study = write_study(tmp_path / "s")  # a valid study (its own out is never made)
    args = _cases(blocker, tmp_path / "missing.gguf", study)[which]
    code, out, err = run_epi(monkeypatch, capsys, *args)
    assert code == 2, (args, out, err)
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and ("--out" in lines[0] or "OUT" in lines[0]), (args, err)
    assert "internal error" not in err and not (tmp_path / "home" / "logs").exists()
    assert blocker.read_text() == "the user's file\n"
