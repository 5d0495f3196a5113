"""Tests for real gaps that `make mutate` (scripts/mutate.py) found in meter/chip: a mutant
survived every test covering its module. Expected values from the module's documented rule."""

from __future__ import annotations

import pytest

from meter.chip.energy_window import REL_ALLOWANCE, SLACK_COUNTS, counts_range


@pytest.mark.parametrize("dt_s", [0.0, -0.5])
def test_a_window_of_no_time_holds_only_the_counters_own_step(dt_s: float) -> None:
    """No elapsed time (or a clock read backwards): the load metered nothing, so the range is
    just the counter's step at the ends, [0, SLACK_COUNTS], whatever the power."""
    assert counts_range(9.0, 12.0, dt_s, 0.36) == (0.0, SLACK_COUNTS)


def test_the_range_is_the_lower_and_higher_power_times_the_time() -> None:
    """9 W then 12 W for 10 s at 0.36 J/count: between 9·10/0.36 = 250 and 12·10/0.36 = 333.3
    counts, widened by the relative allowance and the counter's step at each end."""
    lo, hi = counts_range(12.0, -9.0, 10.0, 0.36)  # absolute: the sign does not matter
    assert lo == pytest.approx(250 * (1 - REL_ALLOWANCE) - SLACK_COUNTS)
    assert hi == pytest.approx(12 * 10 / 0.36 * (1 + REL_ALLOWANCE) + SLACK_COUNTS)


def test_a_pl_constant_of_exactly_32_bits_fits() -> None:
    """PL_Constant = 838860800 · G_L · V_L · V_U / (MC · Un · Ib), rounded (AN §3.2.2), must
    fit the 32-bit PLconstH/PLconstL pair: 0xFFFFFFFF fits, one more does not."""
    from meter.chip.calibration import CalibrationError, pl_constant

    mc = 838860800 / 0xFFFFFFFF  # every other factor 1: the constant is exactly 0xFFFFFFFF
    assert pl_constant(mc, 1.0, 1.0, 1, 1.0, 1.0) == 0xFFFFFFFF
    with pytest.raises(CalibrationError, match="32 bits"):
        pl_constant(838860800 / (0xFFFFFFFF + 1), 1.0, 1.0, 1, 1.0, 1.0)


def test_a_read_a_register_wrap_late_gets_its_wrap_back() -> None:
    """The design calibration at 1e6 imp/kWh counts 0.36 J, so 9 W is 25 counts/s and 3000 s
    between reads 75 000 counts, more than the 16-bit register holds: the wrap is added back
    and the energy is 9 W × the time, within one count."""
    from meter.chip.calibration import Calibration
    from meter.clock import SimulatedClock
    from meter.driver.atm90e26 import ATM90E26Driver
    from meter.emulation.chip_emulator import EmulatedChip
    from meter.emulation.emulated_bus import FRAME_TIME_160K_S, EmulatedSpiBus
    from meter.emulation.power_models import ConstantPower

    clock = SimulatedClock()
    chip = EmulatedChip(ConstantPower(9.0), clock, meter_constant_imp_per_kwh=1e6)
    driver = ATM90E26Driver(EmulatedSpiBus(chip, frame_time_s=FRAME_TIME_160K_S),
                            Calibration.default(1e6), clock=clock)
    driver.start()
    clock.advance(3000 * 10**9)
    driver.read_sample()
    elapsed_s = (driver.energy_t_mono_ns - driver.energy_epoch_mono_ns) / 1e9  # type: ignore[operator]
    assert 9.0 * elapsed_s / driver.calibration.joules_per_count() > 0xFFFF
    assert abs(driver.energy_j - 9.0 * elapsed_s) < driver.calibration.joules_per_count()
