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
    # the analysis role needs nothing, so the exit status says nothing about this machine
    proc = subprocess.run([sys.executable, "-m", "epi", "doctor", "--role", "analysis"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
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


def _doctor(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "epi", "doctor", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=60,
                          env={**os.environ, "EPI_HOME": str(home)})


def test_doctor_exits_non_zero_when_the_role_needs_what_is_missing(tmp_path: Path) -> None:
    # an empty epi home: no model prepared, no evaluation data, which a host needs
    proc = _doctor(tmp_path, "--role", "host")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()
    assert any(line.startswith("2 missing for the host role: smollm2, benchmarks")
               for line in last), last
    assert "Traceback" not in proc.stderr
    # a worker serves layers over RPC: models and data are another machine's business
    worker = _doctor(tmp_path, "--role", "worker", "--json")
    doc = json.loads(worker.stdout)
    assert doc["role"] == "worker"
    assert "smollm2" not in doc["missing_for_role"]
    by_item = {c["item"]: c for c in doc["checks"]}
    assert by_item["smollm2"]["ok"] is False and by_item["smollm2"]["needed_by"] == ["host"]
    assert worker.returncode == (1 if doc["missing_for_role"] else 0)
    assert _doctor(tmp_path, "--role", "analysis").returncode == 0
    bad = _doctor(tmp_path, "--role", "toaster")
    assert bad.returncode == 2 and "--role: 'toaster' is not one of" in bad.stderr
