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
