"""Direction: forward and reverse active energy are read apart (APenergy/ANenergy
vs ATenergy = forward + reverse, docs/atm90e26.md §2); reverse energy — a CT clamped the wrong
way round, or export — is an event with its fix and is never added as consumption.

Expected figures are the power models' exact integrals at the meter constant (one energy LSB
= 0.1 pulse = 0.1 · 3.6e6 / MC J), not the protocol's own arithmetic.
"""

from __future__ import annotations

import pytest

from meter.chip.calibration import Calibration
from meter.clock import SimulatedClock
from meter.driver.atm90e26 import ATM90E26Driver
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import EmulatedSpiBus
from meter.emulation.power_models import ConstantPower, PowerModel, ScriptedProfile

S = 1_000_000_000
MC = 1e6  # imp/kWh: 0.36 J per count
LSB_J = 0.1 * 3.6e6 / MC


def _rig(model: PowerModel, *, ct_reversed: bool = False
         ) -> tuple[ATM90E26Driver, EmulatedChip, SimulatedClock, list[tuple[str, str]]]:
    clock = SimulatedClock()
    chip = EmulatedChip(model, clock, meter_constant_imp_per_kwh=MC,
                        ct_reversed=ct_reversed)
    events: list[tuple[str, str]] = []
    driver = ATM90E26Driver(EmulatedSpiBus(chip), Calibration.default(MC), clock=clock,
                            on_event=lambda k, d: events.append((k, d)),
                            first_measurement_s=0.2)
    driver.start()
    return driver, chip, clock, events


def _sweeps(driver: ATM90E26Driver, clock: SimulatedClock, seconds: float,
            period_s: float = 0.2) -> None:
    for _ in range(int(seconds / period_s)):
        clock.advance(int(period_s * S))
        driver.read_sample()


def test_reversed_ct_is_reported_not_summed() -> None:
    driver, chip, clock, events = _rig(ConstantPower(7.2), ct_reversed=True)
    t0 = driver.energy_epoch_mono_ns
    assert t0 is not None
    _sweeps(driver, clock, 60)
    truth_j = chip.true_energy_j(t0, driver.energy_t_mono_ns or 0)
    assert driver.energy_j == 0.0  # nothing counted as consumption
    assert driver.reverse_energy_j == pytest.approx(truth_j, abs=2 * LSB_J)
    kinds = [k for k, _ in events]
    assert kinds.count("reverse_energy") == 1  # once per episode, not once per sweep
    detail = dict(events)["reverse_energy"]
    assert "turn the clamp round" in detail
    assert driver.read_sample().power_w == pytest.approx(-7.2, abs=0.01)


def test_correct_ct_has_no_reverse_energy() -> None:
    driver, chip, clock, events = _rig(ConstantPower(7.2))
    t0 = driver.energy_epoch_mono_ns
    assert t0 is not None
    _sweeps(driver, clock, 60)
    truth_j = chip.true_energy_j(t0, driver.energy_t_mono_ns or 0)
    assert driver.energy_j == pytest.approx(truth_j, abs=2 * LSB_J)
    assert driver.reverse_energy_j == 0.0
    assert events == []


def test_export_episodes_split_exactly() -> None:
    # 20 s consuming 6 W, 10 s exporting 4 W, 20 s consuming 6 W again
    model = ScriptedProfile([(0, 6.0), (20, -4.0), (30, 6.0)], start_mono_ns=0)
    driver, _chip, clock, events = _rig(model)
    _sweeps(driver, clock, 50)
    t1 = driver.energy_t_mono_ns or 0
    t0 = driver.energy_epoch_mono_ns or 0
    forward_j, reverse_j = model.energy_parts_j(t0, t1)
    assert reverse_j == pytest.approx(40.0, abs=0.5)
    assert driver.energy_j == pytest.approx(forward_j, abs=3 * LSB_J)
    assert driver.reverse_energy_j == pytest.approx(reverse_j, abs=3 * LSB_J)
    assert [k for k, _ in events] == ["reverse_energy"]


def test_doctor_finding_for_a_reversed_ct() -> None:
    from meter.driver.direction import direction_findings

    driver, _chip, clock, _events = _rig(ConstantPower(7.2), ct_reversed=True)
    _sweeps(driver, clock, 10)
    good, _chip2, clock2, _events2 = _rig(ConstantPower(7.2))
    _sweeps(good, clock2, 10)
    found = direction_findings([("node0", driver.energy_j, driver.reverse_energy_j),
                                ("node1", good.energy_j, good.reverse_energy_j),
                                ("node2", 0.0, 0.0)])
    assert [f.ok for f in found] == [False, True, None]
    assert "turn the CT clamp round" in found[0].fix
    assert "reverse" in found[0].detail


@pytest.mark.parametrize(("meter_constant", "period_s"), [(MC, 0.05), (1e8, 0.05)])
def test_reversed_ct_at_20_hz_is_reported_and_none_leaks_into_consumption(
        meter_constant: float, period_s: float) -> None:
    """At the daemon's 20 Hz a window on a coarse meter constant holds fewer reverse counts
    than the slack: the event must still come (it counts the episode, not one window), and
    the first window after start — no trusted power yet — must not count reverse energy as
    consumption (it used to: 0.72–1.08 J of 216 J)."""
    clock = SimulatedClock()
    chip = EmulatedChip(ConstantPower(7.2), clock, meter_constant_imp_per_kwh=meter_constant,
                        ct_reversed=True)
    events: list[tuple[str, str]] = []
    driver = ATM90E26Driver(EmulatedSpiBus(chip), Calibration.default(meter_constant),
                            clock=clock, on_event=lambda k, d: events.append((k, d)),
                            first_measurement_s=0.2)
    driver.start()
    t0 = driver.energy_epoch_mono_ns
    assert t0 is not None
    _sweeps(driver, clock, 30, period_s)
    truth_j = chip.true_energy_j(t0, driver.energy_t_mono_ns or 0)
    lsb_j = 0.1 * 3.6e6 / meter_constant
    assert driver.energy_j == 0.0
    assert driver.reverse_energy_j == pytest.approx(truth_j, abs=2 * lsb_j)
    assert [k for k, _ in events].count("reverse_energy") == 1
