"""Power models and the emulator's physics: exact ground truth, energy to one register LSB."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from meter.chip import registers as regs
from meter.chip.calibration import Calibration
from meter.clock import SimulatedClock
from meter.driver.atm90e26 import ATM90E26Driver
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import FRAME_TIME_160K_S, EmulatedSpiBus
from meter.emulation.power_models import ActivityModel, ConstantPower, PowerModel, ScriptedProfile

S = 1_000_000_000


def test_constant_power_model() -> None:
    m = ConstantPower(9.2, voltage_v=230.0, power_factor=0.8)
    assert m.energy_j(0, 10 * S) == pytest.approx(92.0)
    assert m.current_a(0) == pytest.approx(9.2 / (230 * 0.8))
    assert m.describe()["modelled"] is True
    assert ConstantPower(-5.0).energy_parts_j(0, 2 * S) == (0.0, 10.0)


def test_scripted_profile_integrates_exactly() -> None:
    t0 = 5 * S
    m = ScriptedProfile([(0, 2.0), (1.5, 10.0), (4, -3.0)], start_mono_ns=t0)
    assert m.power_w(t0 + S) == 2.0 and m.power_w(t0 + 2 * S) == 10.0
    assert m.power_w(t0 - S) == 2.0  # stationary before the start
    assert m.energy_j(t0, t0 + 5 * S) == pytest.approx(2 * 1.5 + 10 * 2.5 - 3 * 1)
    assert m.energy_j(t0 + S, t0 + 2 * S) == pytest.approx(2 * 0.5 + 10 * 0.5)
    assert m.energy_parts_j(t0, t0 + 6 * S) == pytest.approx((28.0, 6.0))
    assert m.energy_j(t0 + 3 * S, t0 + S) == pytest.approx(-m.energy_j(t0 + S, t0 + 3 * S))
    with pytest.raises(ValueError, match="increase"):
        ScriptedProfile([(1, 1.0), (1, 2.0)])


def test_activity_model_maps_cpu_busy_fraction_to_power(tmp_path: Path) -> None:
    stat = tmp_path / "stat"

    def write(busy: int, idle: int) -> None:
        stat.write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0\n")

    write(1000, 1000)
    clock = SimulatedClock()
    t0 = clock.monotonic_ns()
    m = ActivityModel(clock, idle_w=2.7, max_w=9.5, update_period_s=1.0, proc_stat=stat)
    assert m.power_w(t0) == 2.7
    write(1100, 1000)  # 100 % busy since the last reading
    assert m.power_w(t0 + 2 * S) == pytest.approx(9.5)
    write(1150, 1050)  # 50 %
    assert m.power_w(t0 + 4 * S) == pytest.approx(2.7 + 6.8 * 0.5)
    # each reading's activity is the power of the interval it measured (no lag); history is
    # kept: past windows integrate the same however often they are asked
    assert m.energy_j(t0, t0 + 4 * S) == pytest.approx(9.5 * 2 + 6.1 * 2)
    assert m.energy_j(t0, t0 + 5 * S) == pytest.approx(9.5 * 2 + 6.1 * 2 + 6.1)
    d = m.describe()
    assert d["kind"] == "activity" and d["modelled"] is True and d["idle_w"] == 2.7


def test_activity_model_reads_this_machines_proc_stat() -> None:
    clock = SimulatedClock()
    m = ActivityModel(clock)
    t = clock.monotonic_ns()
    end = time.monotonic() + 0.25
    while time.monotonic() < end:  # keep one CPU busy: the busy fraction must show it
        sum(i * i for i in range(1000))
    p = m.power_w(t + S)
    one_core_half_busy = 0.5 / (os.cpu_count() or 1)
    assert 2.7 + one_core_half_busy * (9.5 - 2.7) < p <= 9.5


def test_pmean_is_the_exact_mean_power_of_the_refresh_window() -> None:
    clock = SimulatedClock()
    t0 = clock.monotonic_ns()
    model = ScriptedProfile([(0, 4.0), (1.1, 8.0)], start_mono_ns=t0)
    chip = EmulatedChip(model, clock, refresh_period_s=0.2)
    driver = ATM90E26Driver(EmulatedSpiBus(chip), Calibration.default(1e6), clock=clock)
    driver.start()
    clock.sleep_until(t0 + 1_250_000_000)  # window 1.0..1.2 s: 0.1 s at 4 W, 0.1 s at 8 W
    assert driver.read_value("Pmean") == pytest.approx(6.0, abs=2e-3)
    clock.sleep_until(t0 + 1_450_000_000)
    assert driver.read_value("Pmean") == pytest.approx(8.0, abs=2e-3)


def _run(model: PowerModel, clock: SimulatedClock, hours: float, period_s: float,
         mc: float = 1e6) -> tuple[ATM90E26Driver, EmulatedChip, float, list]:
    chip = EmulatedChip(model, clock, meter_constant_imp_per_kwh=mc)
    events: list = []
    driver = ATM90E26Driver(
        EmulatedSpiBus(chip, frame_time_s=FRAME_TIME_160K_S),
        Calibration.default(mc),
        clock=clock,
        on_event=lambda k, d: events.append((k, d)),
    )
    driver.start()
    r0 = chip.pending_counts()
    end = clock.monotonic_ns() + int(hours * 3600 * S)
    while clock.monotonic_ns() < end:
        clock.advance(int(period_s * S))
        driver.read_sample()
    return driver, chip, r0, events


def test_energy_matches_the_model_integral_to_one_lsb_over_24_hours() -> None:
    clock = SimulatedClock()
    t0 = clock.monotonic_ns()
    rng = random.Random(7)
    steps = [(k * 97.0, rng.uniform(2.7, 9.5)) for k in range(0, 24 * 3600 // 97 + 2)]
    model = ScriptedProfile(steps, start_mono_ns=t0)
    driver, chip, r0, events = _run(model, clock, hours=24, period_s=60)
    truth_j = model.energy_j(driver.energy_epoch_mono_ns, driver.energy_t_mono_ns)  # type: ignore[arg-type]
    lsb_j = driver.calibration.joules_per_count()
    assert truth_j > 400_000  # a long run: more than 1.1 million register counts
    assert abs(driver.energy_j - truth_j) < lsb_j
    # and exactly, once the chip's sub-LSB remainders at both ends are accounted for
    r1 = chip.pending_counts()
    assert driver.energy_j + (r1 - r0) * lsb_j == pytest.approx(truth_j, abs=1e-6 * truth_j)
    assert events == []


def test_a_read_gap_longer_than_a_register_wrap_is_corrected() -> None:
    clock = SimulatedClock()
    # 9 W at 1e6 imp/kWh: 25 counts/s, so 3000 s = 75 000 counts > 0xFFFF
    driver, _chip, _r0, events = _run(ConstantPower(9.0), clock, hours=3000 / 3600,
                                    period_s=3000)
    truth = 9.0 * (driver.energy_t_mono_ns - driver.energy_epoch_mono_ns) / S  # type: ignore[operator]
    assert abs(driver.energy_j - truth) < driver.calibration.joules_per_count()
    assert [k for k, _ in events] == ["late"]
    assert "wrapped 1×" in events[0][1]


def test_a_wrap_under_varying_power_is_counted_by_the_nearest_whole_number() -> None:
    """9 W at both reads, 15 W for 1376 s between: the two readings' mean power expects
    75 000 counts where the chip counted 97 933 (read as 97 933 − 65 536 = 32 397). The
    missing counts are 0.65 of a wrap: the nearest whole number (1) restores the energy,
    truncating (0) would lose 65 536 counts (23.6 kJ)."""
    clock = SimulatedClock()
    t0 = clock.monotonic_ns()
    model = ScriptedProfile([(0, 9.0), (800, 15.0), (800 + 1376, 9.0)], start_mono_ns=t0)
    driver, _chip, _r0, events = _run(model, clock, hours=3000 / 3600, period_s=3000)
    truth = model.energy_j(driver.energy_epoch_mono_ns, driver.energy_t_mono_ns)  # type: ignore[arg-type]
    jpc = driver.calibration.joules_per_count()
    assert truth / jpc > regs.ENERGY_WRAP + 75_000 * 0.25  # the power did vary that much
    assert abs(driver.energy_j - truth) < jpc
    assert [k for k, _ in events] == ["late"] and "wrapped 1×" in events[0][1]


def test_below_the_start_threshold_nothing_is_metered() -> None:
    clock = SimulatedClock()
    # start threshold of the design calibration: 0.2 % of Ib · Un = 0.46 W
    driver, chip, _, _ = _run(ConstantPower(0.3), clock, hours=0.1, period_s=10)
    assert driver.energy_counts == 0
    assert chip.peek(regs.EN_STATUS) & regs.EN_P_NOLOAD


def test_reverse_power_meters_into_the_reverse_and_absolute_registers() -> None:
    clock = SimulatedClock()
    chip = EmulatedChip(ConstantPower(-7.2), clock)
    driver = ATM90E26Driver(EmulatedSpiBus(chip), Calibration.default(1e6), clock=clock)
    driver.start()
    for address in (0x40, 0x41):
        driver.read_clear(address)
    clock.advance(50 * S)  # 360 J = 1000 counts
    assert driver.read_clear(0x40) == 0
    assert driver.read_clear(0x41) == 1000
    assert driver.read_clear(0x42) == 1000  # ATenergy: absolute
    assert driver.read_value("Pmean") == pytest.approx(-7.2, abs=4e-3)
    assert driver.read_value("PowerF") == pytest.approx(-1.0)
