"""Clocks (real and simulated) and N-line readings of the emulated chip."""

from __future__ import annotations

import time

import pytest

from meter.chip.calibration import Calibration
from meter.clock import SimulatedClock, SystemClock
from meter.driver.atm90e26 import ATM90E26Driver
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import EmulatedSpiBus
from meter.emulation.power_models import ConstantPower


def test_simulated_clock_moves_only_when_told() -> None:
    c = SimulatedClock(start_mono_ns=5, start_real_ns=1000)
    assert (c.monotonic_ns(), c.realtime_ns()) == (5, 1000)
    c.advance(10)
    c.sleep_until(12)  # in the past: nothing
    assert (c.monotonic_ns(), c.realtime_ns()) == (15, 1010)
    c.sleep_until(40)
    assert c.monotonic_ns() == 40 and c.realtime_ns() == 1035
    with pytest.raises(ValueError, match="backwards"):
        c.advance(-1)
    drifting = SimulatedClock(0, 0, drift_ppm=100.0)
    drifting.advance(1_000_000_000)
    assert drifting.realtime_ns() == 1_000_100_000


def test_system_clock_sleeps_until_a_monotonic_time() -> None:
    c = SystemClock()
    t = c.monotonic_ns()
    c.sleep_until(t + 20_000_000)
    assert c.monotonic_ns() - t >= 20_000_000
    assert abs(c.realtime_ns() - time.time_ns()) < 50_000_000


def test_n_line_registers_are_read_where_wired() -> None:
    clock = SimulatedClock()
    chip = EmulatedChip(ConstantPower(11.5, power_factor=0.9), clock, n_line=True)
    driver = ATM90E26Driver(EmulatedSpiBus(chip), Calibration.default(1e6), clock=clock,
                            n_line=True, first_measurement_s=0.2)
    driver.start()
    clock.advance(1_000_000_000)
    s = driver.read_sample()
    assert s.n_line is not None
    assert s.n_line["current_a"] == pytest.approx(11.5 / (230 * 0.9), abs=2e-5)
    assert s.n_line["power_w"] == pytest.approx(11.5, abs=0.005)
    assert s.n_line["power_factor"] == pytest.approx(0.9, abs=0.001)
    plain = ATM90E26Driver(EmulatedSpiBus(EmulatedChip(ConstantPower(1.0), clock)),
                           Calibration.default(1e6), clock=clock)
    plain.start()
    assert plain.read_sample().n_line is None
