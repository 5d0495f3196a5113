"""Fast-changing loads: the emulator's registers refresh together once per metering
cycle, averaged over it, and the driver's plausibility rules hold on square waves (1–10 Hz),
ramps and bursts shorter than a sweep, losing no rows and no energy; and the chain's running
self-check (meter/driver/selfcheck.py) raises nothing on those loads from a correct chip. One
120 s run of each load serves both checks (they read the same sweeps; the self-check used
to repeat the run in tests/meter/test_selfcheck.py).

Expected figures are closed forms of the profiles (mean and RMS of a square wave), and the
profiles' exact integrals — not the emulator's own arithmetic.
"""

from __future__ import annotations

import math

import pytest

from meter.chip.calibration import Calibration
from meter.clock import SimulatedClock
from meter.driver.atm90e26 import ATM90E26Driver
from meter.driver.selfcheck import ChainSelfCheck, SelfCheckConfig
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import EmulatedSpiBus
from meter.emulation.load_profiles import RepeatingProfile, bursts, ramp, square_wave
from meter.errors import BusError

S = 1_000_000_000
MC = 1e8  # epi's meter constant: 3.6 mJ per count
SWEEP_S = 0.05  # the reference board's sweep
# Stated bounds: rows refused by the plausibility rules, and energy error against the exact
# integral (a few counts of 3.6 mJ over ~700 J).
MAX_LOST_ROW_FRACTION = 0.001
MAX_ENERGY_ERROR = 1e-4


def test_profiles_integrate_exactly() -> None:
    sq = square_wave(4.0, 2.7, 9.5)
    assert sq.energy_j(0, 10 * S) == pytest.approx((2.7 + 9.5) / 2 * 10, rel=1e-12)
    assert sq.power_w(int(0.1 * S)) == 9.5 and sq.power_w(int(0.2 * S)) == 2.7
    b = bursts(2.7, 9.5, 0.03, 0.5)
    assert b.energy_j(0, 50 * S) == pytest.approx((2.7 * 0.47 + 9.5 * 0.03) * 100, rel=1e-12)
    r = ramp(2.7, 9.5, 2.0)
    assert r.energy_j(0, 20 * S) == pytest.approx((2.7 + 9.5) / 2 * 20, rel=1e-9)
    with pytest.raises(ValueError):
        bursts(2.7, 9.5, 0.6, 0.5)
    with pytest.raises(ValueError):
        RepeatingProfile([(0.0, 1.0)])


def test_registers_refresh_together_and_average_over_the_cycle() -> None:
    # 10 Hz square wave, 0.2 s metering cycle = two whole periods: Pmean is the mean power,
    # Irms the RMS current sqrt((2.7² + 9.5²)/2) / 230, PowerF = P / (U · Irms)
    clock = SimulatedClock()
    chip = EmulatedChip(square_wave(10.0, 2.7, 9.5), clock, meter_constant_imp_per_kwh=MC,
                        refresh_period_s=0.2)
    driver = ATM90E26Driver(EmulatedSpiBus(chip), Calibration.default(MC), clock=clock,
                            first_measurement_s=0.2)
    driver.start()
    clock.advance(int(1.01 * S))
    p_mean = (2.7 + 9.5) / 2
    i_rms = math.sqrt((2.7 ** 2 + 9.5 ** 2) / 2) / 230.0
    first = {n: driver.read_value(n) for n in ("Pmean", "Irms", "PowerF", "Smean")}
    assert first["Pmean"] == pytest.approx(p_mean, abs=2 / 256)
    assert first["Irms"] == pytest.approx(i_rms, abs=2e-6)
    assert first["PowerF"] == pytest.approx(p_mean / (230.0 * i_rms), abs=1e-3)
    assert first["Smean"] == pytest.approx(230.0 * i_rms, abs=2 / 256)
    # within the same cycle every register reads the same, whatever the load does meanwhile
    clock.advance(int(0.05 * S))  # the square wave is now at its other level
    again = {n: driver.read_value(n) for n in first}
    assert again == first


@pytest.mark.parametrize("model", [
    square_wave(1.0, 2.7, 9.5), square_wave(4.0, 2.7, 9.5), square_wave(10.0, 2.7, 9.5),
    ramp(2.7, 9.5, 2.0), bursts(2.7, 9.5, 0.03, 0.5),
], ids=lambda m: m.label)
def test_fast_loads_lose_nothing_and_raise_no_self_check(model: RepeatingProfile) -> None:
    """120 s at the reference board's sweep: no row refused, no implausible reading, the
    energy within MAX_ENERGY_ERROR of the profile's integral, and the self-check (fed every
    reading with a power, as the daemon's sampler feeds it) silent on a correct chip."""
    clock = SimulatedClock()
    chip = EmulatedChip(model, clock, meter_constant_imp_per_kwh=MC)
    events: list[str] = []
    cal = Calibration.default(MC)
    driver = ATM90E26Driver(EmulatedSpiBus(chip), cal, clock=clock,
                            on_event=lambda k, d: events.append(k), first_measurement_s=0.2)
    driver.start()
    t0 = driver.energy_epoch_mono_ns
    assert t0 is not None
    check = ChainSelfCheck(SelfCheckConfig(joules_per_count=cal.joules_per_count()))
    raised = []
    n = int(120 / SWEEP_S)
    lost = checked = 0
    for _ in range(n):
        clock.advance(int(SWEEP_S * S))
        try:
            r = driver.read_sample()
        except BusError:
            lost += 1
            continue
        if r.power_w is None:
            continue
        checked += 1
        d = check.add(r.t_mono_ns, r.energy_j, r.power_w, r.voltage_v, r.current_a,
                      r.power_factor)
        if d is not None:
            raised.append(((r.t_mono_ns - t0) / S, d.kind, d.detail))
    truth = chip.true_energy_j(t0, driver.energy_t_mono_ns or 0)
    assert lost / n <= MAX_LOST_ROW_FRACTION, (lost, events)
    assert "implausible" not in events
    assert abs(driver.energy_j - truth) / truth <= MAX_ENERGY_ERROR
    assert checked >= 0.99 * n  # the check saw the whole run: 90 s past its 30 s window
    assert raised == []
