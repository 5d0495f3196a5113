"""Readiness from the chip's state, and the plausibility checks that catch misreads.

Expected figures come from the power model (a constant load), not from the driver.
"""

from __future__ import annotations

import pytest

from meter.chip.calibration import Calibration
from meter.clock import SimulatedClock
from meter.driver.atm90e26 import ATM90E26Driver
from meter.driver.plausibility import Limits, check_measurements
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import EmulatedSpiBus
from meter.emulation.power_models import ConstantPower
from meter.errors import BusError, ImplausibleReadingError

MS = 1_000_000
REFRESH_S = 0.2


def _rig(power_w: float = 4.0) -> tuple[SimulatedClock, EmulatedChip, ATM90E26Driver, list]:
    clock = SimulatedClock()
    chip = EmulatedChip(ConstantPower(power_w, power_factor=0.8), clock,
                        refresh_period_s=REFRESH_S)
    events: list[tuple[str, str]] = []
    driver = ATM90E26Driver(
        EmulatedSpiBus(chip, frame_time_s=24 / 160e3), Calibration.default(1e8), clock=clock,
        first_measurement_s=REFRESH_S, on_event=lambda k, d: events.append((k, d)),
    )
    return clock, chip, driver, events


@pytest.mark.parametrize("lead_us", range(0, 12_000, 500))
def test_a_read_straddling_the_first_refresh_is_never_a_value(lead_us: int) -> None:
    """A read begun just before the first measurement completes got 0 V, 0 W but 50 Hz (the
    frequency register read after the refresh) and passed the old value-based check."""
    clock, chip, driver, _ = _rig()
    driver.start()
    first_refresh = chip._t_power_on + int(REFRESH_S * 1e9)
    clock.sleep_until(first_refresh - lead_us * 1000)
    r = driver.read_sample()
    if r.ready:
        assert r.power_w == pytest.approx(4.0, abs=0.01)
        assert r.voltage_v == pytest.approx(230.0, abs=0.01)
    else:
        assert r.power_w is None and r.voltage_v is None and r.frequency_hz is None
    assert r.energy_j >= 0


def test_readings_after_a_reset_wait_for_the_new_measurement() -> None:
    clock, chip, driver, _ = _rig()
    driver.start()
    clock.advance(1_000 * MS)
    assert driver.read_sample().ready
    chip.reset_now()
    with pytest.raises(BusError):
        driver.read_sample()  # reset detected, re-initialised
    r = driver.read_sample()
    assert not r.ready and r.power_w is None
    clock.advance(int(REFRESH_S * 1e9))
    r = driver.read_sample()
    assert r.ready and r.power_w == pytest.approx(4.0, abs=0.01)


def test_limits_catch_what_bit_errors_produce() -> None:
    lim = Limits.for_frontend({"un_v": 230.0, "ib_a": 1.0})
    good = {"Urms": 230.0, "Irms": 4.0 / 184, "Pmean": 4.0, "Smean": 5.0, "PowerF": 0.8,
            "Freq": 50.0, "Qmean": 3.0, "Pangle": 36.9}
    assert check_measurements(good, lim) == []
    for key, bad in (("Pmean", 90.0), ("PowerF", 23.0), ("Urms", 0.29), ("Freq", 0.0),
                     ("Smean", 40.0), ("Irms", 100.0)):
        assert check_measurements({**good, key: bad}, lim), key


def test_bit_errors_never_give_an_unexplained_wrong_reading() -> None:
    """MOSI/MISO bit errors and cut frames: every reading returned is within 1 % of the load,
    every rejected one raised, and the energy matches the model's integral."""
    clock, chip, driver, events = _rig(4.0)
    driver.start()
    clock.advance(500 * MS)
    chip.set_spi_faults(bit_error_rate=0.001, mosi_bit_error_rate=0.001,
                        partial_frame_rate=0.01, seed=11)
    good = failed = 0
    for _ in range(1500):
        clock.advance(50 * MS)
        try:
            r = driver.read_sample()
        except BusError:
            failed += 1
            continue
        if not r.ready:
            continue
        good += 1
        assert r.power_w == pytest.approx(4.0, rel=0.01), (r, events[-3:])
        assert r.voltage_v == pytest.approx(230.0, rel=0.01)
        assert r.power_factor == pytest.approx(0.8, abs=0.01)
    assert good > 1000
    assert driver.energy_epoch_mono_ns is not None and driver.energy_t_mono_ns is not None
    truth = chip.true_energy_j(driver.energy_epoch_mono_ns, driver.energy_t_mono_ns)
    lost = sum(chip.true_energy_j(u["t0_mono_ns"], u["t1_mono_ns"]) for u in driver.unmetered)
    # a re-initialisation's unmetered window starts at the last good energy read, so the
    # energy lies between the truth less those windows and the truth
    assert (truth - lost) * 0.998 <= driver.energy_j <= truth * 1.002
    assert any(k in ("implausible", "misread") for k, _ in events)


def test_an_implausible_reading_twice_raises_with_the_reason() -> None:
    clock, _, driver, events = _rig()
    driver.limits = Limits((300.0, 400.0), (45.0, 65.0), 60.0, 11.5)  # 230 V is "a fault"
    driver.start()
    clock.advance(1_000 * MS)
    with pytest.raises(ImplausibleReadingError, match=r"voltage 230\.00 V outside"):
        driver.read_sample()
    assert events[-1][0] == "implausible"
