"""Emulator register behaviour: defaults, reset, read-clear, LastData, start/check state
machine, checksum readback, frozen blocks, LSB latch, the 24-cycle rule, faults."""

from __future__ import annotations

import pytest

from meter.chip import registers as regs
from meter.chip.calibration import Calibration
from meter.chip.frames import spi_read_frame, spi_read_value, spi_write_frame
from meter.clock import SimulatedClock
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.power_models import ConstantPower, ScriptedProfile

S = 1_000_000_000


@pytest.fixture
def chip() -> EmulatedChip:
    return EmulatedChip(ConstantPower(10.0, power_factor=0.8), SimulatedClock())


def _advance(chip: EmulatedChip, ns: int) -> None:
    clock = chip.clock
    assert isinstance(clock, SimulatedClock)
    clock.advance(ns)


def _rd(chip: EmulatedChip, address: int, cycles: int | None = None) -> int:
    return spi_read_value(chip.spi_transfer(spi_read_frame(address), cycles))


def _wr(chip: EmulatedChip, address: int, value: int, cycles: int | None = None) -> None:
    chip.spi_transfer(spi_write_frame(address, value), cycles)


def _configure(chip: EmulatedChip, cal: Calibration | None = None) -> Calibration:
    """The start-up sequence, by hand."""
    cal = cal or Calibration.default(chip.meter_constant_imp_per_kwh)
    _wr(chip, regs.CAL_START, regs.START_CODE)
    for address, word in zip(regs.METERING_ADDRESSES, cal.metering_words(), strict=True):
        _wr(chip, address, word)
    _wr(chip, regs.CS1, cal.cs1())
    _wr(chip, regs.ADJ_START, regs.START_CODE)
    for address, word in zip(regs.MEASUREMENT_CAL_ADDRESSES, cal.measurement_words(),
                             strict=True):
        _wr(chip, address, word)
    _wr(chip, regs.CS2, cal.cs2())
    _wr(chip, regs.CAL_START, regs.CHECK_CODE)
    _wr(chip, regs.ADJ_START, regs.CHECK_CODE)
    return cal


def test_power_on_values_and_soft_reset(chip: EmulatedChip) -> None:
    for r in regs.REGISTERS:
        if r.readable and r.address not in (regs.CS1, regs.CS2):
            assert chip.peek(r.address) == r.reset, r.name
    # CS1/CS2 read back the chip's own computation over the defaults
    assert _rd(chip, regs.CS1) == 0x55CB and _rd(chip, regs.CS2) == 0x6BB9
    _wr(chip, regs.FUNC_EN, 0x0030)
    _wr(chip, regs.SOFT_RESET, 0x1234)  # not the reset code: ignored
    assert _rd(chip, regs.FUNC_EN) == 0x0030
    _wr(chip, regs.SOFT_RESET, regs.SOFT_RESET_CODE)
    assert _rd(chip, regs.FUNC_EN) == 0x000C
    assert _rd(chip, regs.CAL_START) == regs.POWER_ON_CODE


def test_lastdata_follows_reads_and_accepted_writes_only(chip: EmulatedChip) -> None:
    _rd(chip, regs.reg("MMode").address)
    assert _rd(chip, regs.LAST_DATA) == 0x9422
    _wr(chip, regs.FUNC_EN, 0x0030)
    assert _rd(chip, regs.LAST_DATA) == 0x0030
    _wr(chip, 0x49, 0x1111)  # Urms is read-only: discarded, LastData unchanged
    _wr(chip, 0x7F, 0x2222)  # invalid address: discarded
    assert _rd(chip, regs.LAST_DATA) == 0x0030
    assert _rd(chip, 0x69) == 0x0000  # invalid address reads zero
    assert chip.stats["writes_dropped"] == 2


def test_24_cycle_rule(chip: EmulatedChip) -> None:
    _wr(chip, regs.FUNC_EN, 0x0030)
    # a write needs exactly 24 clocks
    _wr(chip, regs.FUNC_EN, 0x0020, cycles=23)
    _wr(chip, regs.FUNC_EN, 0x0020, cycles=32)
    assert chip.peek(regs.FUNC_EN) == 0x0030
    assert _rd(chip, regs.LAST_DATA) == 0x0030
    # a partial read returns the bits shifted so far (rest idle-high) and leaves LastData
    _rd(chip, regs.reg("MMode").address)
    partial = _rd(chip, regs.FUNC_EN, cycles=16)  # only 8 data bits
    assert partial == 0x00FF
    assert _rd(chip, regs.LAST_DATA) == 0x9422
    # more than 24 clocks: the read completes and updates LastData
    out = chip.spi_transfer(spi_read_frame(regs.FUNC_EN) + b"\x00", None)
    assert spi_read_value(out[:3]) == 0x0030
    assert _rd(chip, regs.LAST_DATA) == 0x0030


def test_calstart_state_machine_and_checksum_errors(chip: EmulatedChip) -> None:
    cal = _configure(chip)
    assert chip.cal_state == "checked" and chip.adj_state == "checked"
    assert _rd(chip, regs.SYS_STATUS) == 0
    # 5678 resets the metering block to its defaults
    _wr(chip, regs.CAL_START, regs.START_CODE)
    assert _rd(chip, 0x22) == 0xD174 and chip.cal_state == "run"
    # 8765 with a wrong CS1: metering stops, CalErr set (a level: it re-asserts after a read)
    _wr(chip, regs.CS1, cal.cs1() ^ 0x0100)
    _wr(chip, regs.CAL_START, regs.CHECK_CODE)
    assert chip.cal_state == "error"
    assert _rd(chip, regs.SYS_STATUS) & regs.CAL_ERR_MASK == regs.CAL_ERR_MASK
    assert _rd(chip, regs.SYS_STATUS) & regs.CAL_ERR_MASK == regs.CAL_ERR_MASK
    # any other value than 5678/8765/6886: stopped and flagged
    _wr(chip, regs.ADJ_START, 0x1234)
    assert chip.adj_state == "error"
    assert _rd(chip, regs.SYS_STATUS) & regs.ADJ_ERR_MASK == regs.ADJ_ERR_MASK


def test_metering_frozen_on_cs1_error_while_measurements_continue(chip: EmulatedChip) -> None:
    _configure(chip)
    _advance(chip, 2 * S)
    _rd(chip, regs.AT_ENERGY)
    chip.corrupt_register("Lgain", 0x0004)  # an upset in the metering block
    _advance(chip, 10 * S)
    assert _rd(chip, regs.AT_ENERGY) == 0  # energy silently stopped (whatnick #10)
    assert regs.reg("Pmean").decode(_rd(chip, 0x4A)) == 10.0  # measurements go on
    assert _rd(chip, regs.SYS_STATUS) & regs.CAL_ERR_MASK


def test_measurements_frozen_on_cs2_error() -> None:
    clock = SimulatedClock()
    t0 = clock.monotonic_ns()
    chip = EmulatedChip(ScriptedProfile([(0, 10.0), (3, 20.0)], start_mono_ns=t0), clock)
    _configure(chip)
    clock.advance(2 * S)
    before = _rd(chip, 0x4A)
    chip.corrupt_register("Ugain", 0x0001)  # CS2 no longer matches...
    clock.advance(5 * S)  # ...and the load doubles
    assert _rd(chip, 0x4A) == before  # frozen
    assert _rd(chip, regs.SYS_STATUS) & regs.ADJ_ERR_MASK
    _advance(chip, 1 * S)
    assert _rd(chip, regs.AT_ENERGY) > 0  # metering continues


def test_error_bits_that_clear_on_read_show_once_while_metering_stays_stopped() -> None:
    """`status_errors_clear_on_read`: CalErr reads 11 once, then 00, yet the block stays
    stopped (what a real chip may do): only the first read can tell."""
    clock = SimulatedClock()
    chip = EmulatedChip(ConstantPower(10.0), clock, status_errors_clear_on_read=True)
    cal = _configure(chip)
    clock.advance(2 * S)
    _rd(chip, regs.AT_ENERGY)
    chip.corrupt_register("Lgain", 0x0004)
    clock.advance(S)
    status = _rd(chip, regs.SYS_STATUS)
    assert regs.field("SysStatus", "CalErr").get(status) == 0b11
    assert _rd(chip, regs.SYS_STATUS) == 0 and chip.cal_state == "error"
    clock.advance(5 * S)
    assert _rd(chip, regs.AT_ENERGY) == 0  # still stopped
    assert _rd(chip, regs.CS1) != cal.cs1()  # what confirms the error: CS1 read back
    # a re-start clears the error; a new error shows once again
    _configure(chip, cal)
    assert chip.cal_state == "checked" and _rd(chip, regs.SYS_STATUS) == 0
    chip.corrupt_register("Lgain", 0x0004)
    assert _rd(chip, regs.SYS_STATUS) & regs.CAL_ERR_MASK == regs.CAL_ERR_MASK
    assert chip.describe()["status_errors_clear_on_read"] is True


def test_lsb_latch_holds_the_low_bits_of_the_last_rms_or_power_read(chip: EmulatedChip) -> None:
    _configure(chip)
    _advance(chip, 2 * S)
    hi = _rd(chip, 0x48)  # Irms of 10 W / (230 V · 0.8) = 54.348 mA
    _rd(chip, regs.LAST_DATA)  # other reads do not disturb the latch
    lo = _rd(chip, regs.LSB)
    value = regs.extended_value(regs.reg("Irms"), hi, lo)
    assert value == pytest.approx(10 / (230 * 0.8), abs=4e-6)
    assert lo & 0xFF == 0
    _rd(chip, 0x4C)  # Freq is not extended: latch unchanged
    assert _rd(chip, regs.LSB) == lo


def test_read_clear_energy_and_small_power_mode(chip: EmulatedChip) -> None:
    _configure(chip)
    _advance(chip, 36 * S)  # 360 J = 1000 counts at 1e6
    assert _rd(chip, regs.AT_ENERGY) == 1000
    assert _rd(chip, regs.AT_ENERGY) == 0
    assert _rd(chip, regs.LAST_DATA) == 0
    _wr(chip, regs.SMALL_P_MOD, regs.SMALL_POWER_CODE)
    _advance(chip, 1 * S)
    assert regs.to_signed16(_rd(chip, 0x4A)) > 5000  # ~508 LSB per watt


def test_faults_absent_stuck_and_reset(chip: EmulatedChip) -> None:
    _configure(chip)
    chip.set_absent(True)
    assert chip.spi_transfer(spi_read_frame(regs.FUNC_EN)) == b"\xff\xff\xff"
    chip.set_absent(False)  # plugged back in: a power-on
    assert _rd(chip, regs.CAL_START) == regs.POWER_ON_CODE
    _configure(chip)
    _wr(chip, regs.FUNC_EN, 0x0030)
    chip.set_stuck(0x1234)
    _wr(chip, regs.FUNC_EN, 0x0000)
    assert _rd(chip, regs.FUNC_EN) == 0x1234 and _rd(chip, regs.CAL_START) == 0x1234
    chip.set_stuck(None)
    assert _rd(chip, regs.FUNC_EN) == 0x0030  # the write was ignored
    t = chip.clock.monotonic_ns()
    chip.schedule_reset(t + 3 * S)
    _advance(chip, 2 * S)
    assert _rd(chip, regs.CAL_START) == regs.CHECK_CODE
    _advance(chip, 2 * S)
    assert _rd(chip, regs.CAL_START) == regs.POWER_ON_CODE
    assert chip.stats["resets"] == 1


def test_miso_bit_errors_flip_bits_at_the_given_rate(chip: EmulatedChip) -> None:
    chip.set_spi_faults(bit_error_rate=0.01, seed=3)
    n = 2000
    for _ in range(n):
        _rd(chip, regs.reg("MMode").address)
    rate = chip.stats["bit_errors"] / (n * 24)
    assert 0.007 < rate < 0.013
