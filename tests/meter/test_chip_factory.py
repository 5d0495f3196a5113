"""Choosing real or emulated chips with a factory (by argument or EPI_METER_CHIPS)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from epi.core.errors import UserError
from meter.board.channels import emulated_board, load_board, open_channels
from meter.chip.calibration import Calibration
from meter.chip_factory import EmulatedChips, RealChips, chip_factory
from meter.clock import SimulatedClock
from meter.driver.atm90e26 import ATM90E26Driver
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import EmulatedSpiBus
from meter.emulation.power_models import ConstantPower

BOARD = Path(__file__).resolve().parents[2] / "hardware" / "epi-meter.toml"


def test_factory_by_name_and_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EPI_METER_CHIPS", raising=False)
    assert isinstance(chip_factory(), RealChips)
    assert isinstance(chip_factory("emulated"), EmulatedChips)
    monkeypatch.setenv("EPI_METER_CHIPS", "emulated")
    assert isinstance(chip_factory(), EmulatedChips)
    monkeypatch.setenv("EPI_METER_CHIPS", "fpga")
    with pytest.raises(UserError, match="EPI_METER_CHIPS 'fpga': expected one of real, emulated"):
        chip_factory()


def test_the_environment_variable_opens_a_board_file_emulated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPI_METER_CHIPS", "emulated")
    chans = open_channels(load_board(BOARD), clock=SimulatedClock(),
                          power_model=ConstantPower(5.0))
    assert [c.emulator is not None for c in chans] == [True] * 4
    for c in chans:
        c.close()


def test_a_factory_object_is_used_as_given() -> None:
    clock = SimulatedClock()
    chans = open_channels(emulated_board(2, clock=clock),
                          EmulatedChips(power_model=ConstantPower(2.0), seed=3), clock=clock)
    assert [c.emulator.model.describe()["kind"] for c in chans] == ["constant"] * 2
    for c in chans:
        c.close()


def test_a_missing_chip_says_what_to_check(tmp_path: Path) -> None:
    p = tmp_path / "b.toml"
    p.write_text('format = "epi-board"\nformat_version = 1\n[[channel]]\nname = "a"\n'
                 'chip_select = "CE0"\n')
    with pytest.raises(UserError) as info:
        open_channels(load_board(p), "real", allow_uncalibrated=True)
    assert "Check:" in str(info.value) and "spi" in str(info.value).split("Check:")[1]


def test_an_absent_chip_fails_at_start_with_what_to_check() -> None:
    clock = SimulatedClock()
    chip = EmulatedChip(ConstantPower(1.0), clock)
    chip.set_absent(True)
    driver = ATM90E26Driver(EmulatedSpiBus(chip), Calibration.default(1e8), clock=clock)
    with pytest.raises(Exception, match="unplugged, unpowered, wrong chip-select or SPI mode"):
        driver.start()


def test_the_production_daemon_does_not_import_the_emulator() -> None:
    code = ("import sys, meter.daemon.service, meter.board.channels, meter.chip_factory; "
            "print('meter.emulation.chip_emulator' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_a_default_power_model_is_built_only_for_a_channel_without_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Channel 0's default model makes a private follow directory that only the process's
    exit removes: built for a board whose channels all have their own models and then
    dropped, it was litter in the temporary directory."""
    import tempfile

    from meter.chip_factory import power_models_for
    from meter.emulation.power_models import ACTIVITY_ENV, FOLLOW_ENV

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(FOLLOW_ENV, raising=False)
    monkeypatch.delenv(ACTIVITY_ENV, raising=False)
    mine = [ConstantPower(1.0), ConstantPower(2.0)]
    assert power_models_for(None, mine, SimulatedClock()) == mine
    assert not list(tmp_path.glob("epi-meter-follow-*"))
    models = power_models_for(None, [None, mine[1]], SimulatedClock())  # channel 0 defaults
    assert models[1] is mine[1] and len(list(tmp_path.glob("epi-meter-follow-*"))) == 1
