"""`epi meter read` and `epi meter calibrate`, and that `epi meter` imports nothing of host/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from epi.commands.meter_group import meter
from meter.chip.calibration import Calibration

REPO = Path(__file__).resolve().parents[2]


def _epi(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from epi.cli import main; main()", *args],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )


def test_read_emulated_prints_one_row_per_channel() -> None:
    result = CliRunner().invoke(meter, ["read", "--emulate", "--channels", "3"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:6] == ["ch", "name", "node", "voltage_v", "current_a", "power_w"]
    rows = [line.split() for line in lines[1:4]]
    assert [r[1] for r in rows] == ["ch0", "ch1", "ch2"]
    assert all(float(r[3]) == 230.0 for r in rows)
    assert 2.6 < float(rows[0][5]) < 9.6  # this machine's activity, modelled
    assert abs(float(rows[1][5]) - 3.15) < 1 / 256  # ch1: constant 3.15 W, 1/256 W steps
    assert "modelled, not measured" in result.output


def test_read_json_lines() -> None:
    result = CliRunner().invoke(meter, ["read", "--emulate", "--channels", "2", "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [r["name"] for r in rows] == ["ch0", "ch1"]
    assert abs(rows[1]["power_w"] - 3.15) < 1 / 256 and rows[1]["error"] is None


def test_epi_meter_imports_nothing_from_host() -> None:
    code = (
        "import sys\n"
        "from epi.cli import main\n"
        "sys.argv = ['epi', 'meter', 'read', '--emulate', '--channels', '1']\n"
        "main()\n"
        "bad = sorted(m for m in sys.modules if m == 'host' or m.startswith('host.')\n"
        "             or m.split('.')[0] in ('numpy', 'pandas', 'llama_cpp', 'gguf'))\n"
        "print('IMPORTED', bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "IMPORTED []" in out.stdout
    assert "ch0" in out.stdout


def test_user_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    out = _epi("meter", "read")
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "epi: error: epi meter read: give --board FILE (real chips) or --emulate"
    )
    bad = tmp_path / "b.toml"
    bad.write_text('format = "epi-board"\nformat_version = 1\n')
    out = _epi("meter", "read", "--board", str(bad))
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert f"{bad}: channel: needs at least one [[channel]] table" in out.stderr
    out = _epi("meter", "calibrate", "ch0", "--emulate", "--volts", "230")
    assert out.returncode == 2 and "--volts and --amps are required" in out.stderr


def test_calibrate_emulated_channel_and_save(tmp_path: Path) -> None:
    target = tmp_path / "cal" / "ch1.json"
    result = CliRunner().invoke(meter, [
        "calibrate", "ch1", "--emulate", "--volts", "230", "--amps", "0.05", "--watts", "9.2",
        "--emulate-gain-error", "0.04", "--out", str(target),
    ])
    assert result.exit_code == 0, result.output
    assert "Ugain     0x6720 -> 0x" in result.output
    after_errors = [float(line.split()[-3]) for line in result.output.splitlines()
                    if line.split()[:1] in (["Urms"], ["Irms"], ["Pmean"])]
    assert len(after_errors) == 3 and all(abs(e) < 0.5 for e in after_errors)  # percent
    cal = Calibration.from_dict(json.loads(target.read_text()))
    assert cal.get("Ugain") == round(26400 / 1.04)
    assert "calibrated against 230.0 V, 0.05 A, 9.2 W" in cal.note


def test_calibrate_refuses_a_ugain_with_bit_15() -> None:
    out = _epi("meter", "calibrate", "ch0", "--emulate", "--volts", "230", "--amps", "0.1",
               "--emulate-gain-error", "-0.3")
    assert out.returncode == 2
    assert out.stderr.startswith("epi: error: channel ch0: Ugain would be 0x")
    assert "bit 15 must be 0" in out.stderr and out.stderr.count("\n") == 1


def test_calibrate_a_board_channel_by_name_emulated(tmp_path: Path) -> None:
    target = tmp_path / "node2.json"
    result = CliRunner().invoke(meter, [
        "calibrate", "node2", "--board", str(REPO / "hardware/epi-meter.toml"), "--emulate",
        "--volts", "229.5", "--amps", "0.04", "--out", str(target),
    ])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("channel 2 (node2) [emulated chip]")
    assert target.exists()
