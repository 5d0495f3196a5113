"""Calibration round trips: an emulated chip with deliberately wrong front-end gains is
calibrated back to within 0.5 % of the reference values."""

from __future__ import annotations

import math

import pytest

from meter.chip import calibration as calib
from meter.chip.calibration import Calibration, CalibrationError
from meter.clock import SimulatedClock
from meter.driver import calibration_procedures as procedures
from meter.driver.atm90e26 import ATM90E26Driver
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import EmulatedSpiBus
from meter.emulation.power_models import ConstantPower, PowerModel

S = 1_000_000_000


def _rig(model: PowerModel, errors: dict[str, float]
         ) -> tuple[SimulatedClock, EmulatedChip, ATM90E26Driver]:
    clock = SimulatedClock()
    chip = EmulatedChip(model, clock, errors=errors, refresh_period_s=0.2)
    driver = ATM90E26Driver(EmulatedSpiBus(chip), Calibration.default(1e6), clock=clock,
                            first_measurement_s=0.2)
    driver.start()
    clock.advance(S)
    return clock, chip, driver


def _rel(measured: float | None, reference: float) -> float:
    assert measured is not None  # a ready reading
    return measured / reference - 1.0


@pytest.mark.parametrize(
    ("power_w", "pf", "errors"),
    [
        # the application note's own error sizes: +11.8 % voltage, +34.7 % current, −13.78 %
        (230.0, 1.0, {"voltage": 0.1181, "current_l": 0.3466, "energy_l": -0.1378}),
        # a Pi-sized load through a PSU (PF 0.6), errors of the other sign
        (9.2, 0.6, {"voltage": -0.042, "current_l": -0.081, "energy_l": 0.063}),
    ],
)
def test_wrong_gains_are_calibrated_to_within_half_a_percent(
    power_w: float, pf: float, errors: dict
) -> None:
    v_ref = 230.0
    i_ref = power_w / (v_ref * pf)
    clock, chip, driver = _rig(ConstantPower(power_w, voltage_v=v_ref, power_factor=pf), errors)
    before = driver.read_sample()
    assert abs(_rel(before.voltage_v, v_ref)) > 0.04  # really off before calibration
    report = procedures.calibrate_gains(driver, v_ref, i_ref, power_w, seconds=600, interval_s=0.2)
    assert set(report.changed) == {"Ugain", "IgainL", "Lgain"}
    assert report.energy_error_before is not None
    assert abs(report.energy_error_before - errors["energy_l"]) < 0.002
    clock.advance(S)
    after = driver.read_sample()
    assert abs(_rel(after.voltage_v, v_ref)) < 0.005
    assert abs(_rel(after.current_a, i_ref)) < 0.005
    assert abs(_rel(after.power_w, power_w)) < 0.005
    e0 = after.energy_j
    clock.advance(600 * S)
    e1 = driver.read_sample().energy_j
    assert abs(_rel(e1 - e0, power_w * 600)) < 0.005
    # the calibration the driver now holds is what is on the chip, checksums included
    cal = report.calibration
    assert driver.calibration is cal
    assert chip.peek(0x2C) == cal.cs1() and chip.peek(0x3B) == cal.cs2()
    assert chip.cal_state == chip.adj_state == "checked"


def test_phase_error_is_calibrated_with_lphi_at_pf_half() -> None:
    _clock, _chip, driver = _rig(
        ConstantPower(57.5, power_factor=0.5), {"phase_l_rad": math.radians(0.15)}
    )
    counts, elapsed = procedures.measure_energy(driver, 600)
    err = counts * driver.calibration.joules_per_count() / (57.5 * elapsed) - 1
    assert err < -0.004  # 0.15 degrees costs ~0.45 % at PF 0.5
    cal = driver.calibration.copy()
    cal.set("Lphi", calib.lphi_from_error(err))
    driver.apply_calibration(cal)
    counts, elapsed = procedures.measure_energy(driver, 600)
    err_after = counts * cal.joules_per_count() / (57.5 * elapsed) - 1
    assert abs(err_after) < 0.0005


def test_current_and_power_offsets_are_calibrated_at_no_load() -> None:
    _clock, chip, driver = _rig(
        ConstantPower(0.0), {"current_offset_a": 0.004, "power_offset_w": 0.06}
    )
    assert driver.read_value("Irms") == pytest.approx(0.004, abs=2e-5)
    assert driver.read_value("Pmean") == pytest.approx(0.06, abs=1 / 256)
    report = procedures.calibrate_offsets(driver, n_readings=4, interval_s=0.2)
    assert set(report.changed) >= {"IoffsetL", "PoffsetL"}
    assert abs(report.after["Irms"]) < 0.0001
    assert abs(report.after["Pmean"]) <= 1 / 256  # one LSB-extended Pmean step
    assert chip.peek(0x04) == 0x0000  # left small-power mode


def test_a_gain_the_chip_cannot_hold_is_refused_and_nothing_is_written() -> None:
    _clock, chip, driver = _rig(ConstantPower(50.0), {"voltage": -0.3})
    before = dict(driver.calibration.registers)
    with pytest.raises(CalibrationError, match="bit 15 must be 0"):
        procedures.calibrate_gains(driver, 230.0, 50.0 / 230.0, interval_s=0.2)
    assert driver.calibration.registers == before
    assert chip.peek(0x31) == before["Ugain"]


def test_too_short_an_energy_window_is_refused_with_the_window_needed() -> None:
    _clock, _chip, driver = _rig(ConstantPower(3.0), {})
    with pytest.raises(CalibrationError, match="measure for at least"):
        procedures.calibrate_gains(driver, 230.0, 3.0 / 230.0, 3.0, seconds=5, interval_s=0.2)
