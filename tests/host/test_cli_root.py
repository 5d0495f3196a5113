"""The `epi` root command: lazy sub-commands, doctor, model preparation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)


def test_help_lists_commands_without_importing_them() -> None:
    proc = run_py(
        "import sys\n"
        "from epi.cli import cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('host', 'meter')))\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "quantize" in proc.stdout and "meter" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_meter_commands_import_nothing_from_host() -> None:
    proc = run_py(
        "import sys\n"
        "from epi.cli import cli\n"
        "try:\n    cli.main(['meter', '--help'])\nexcept SystemExit:\n    pass\n"
        "print([m for m in sys.modules if m == 'host' or m.startswith('host.')])\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_doctor_reports_every_area() -> None:
    proc = subprocess.run([sys.executable, "-m", "epi", "doctor"], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for area in ("llama.cpp", "models", "eval data", "meter", "power"):
        assert f"\n{area}\n" in proc.stdout
    assert "-DGGML_NATIVE=OFF" in proc.stdout
    assert "ggml-rpc-server" in proc.stdout


def test_unknown_model_name_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "epi", "model", "prepare", "gpt5"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "epi: error: unknown model 'gpt5' (known: smollm2)"


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_model_prepare_is_idempotent() -> None:
    from host.quant.models import model_path, prepare_model

    first = prepare_model("smollm2")
    mtime = model_path("smollm2").stat().st_mtime_ns
    second = prepare_model("smollm2")
    assert second == first
    assert model_path("smollm2").stat().st_mtime_ns == mtime  # not rewritten
    assert first.n_layers == 30 and first.n_embd == 576
    assert first.license == "Apache-2.0"
    on_disk = json.loads(model_path("smollm2").with_suffix(".manifest.json").read_text())
    assert on_disk["sha256"] == first.sha256
