"""Plausibility checks of a chip reading, for the Pi's direct-SPI driver.

The checks themselves live in the chip layer, `meter.chip.plausibility` (MicroPython subset),
so the board firmware (meter/firmware/) runs exactly the same rules on the MCU: ranges,
P against U·I·PF (and S against U·I), and the energy counter against the power over the
interval. This module re-exports them for the driver and its callers.

The driver re-reads once on a failed check (a straddled refresh or a redirected read passes
the second time) and reports what it rejected, with these reasons, as ``implausible`` events.
"""

from __future__ import annotations

from meter.chip.plausibility import (
    ABS_TOL_W,
    FLOOR_X_UNIB,
    FREQUENCY_RANGE_HZ,
    LAG_FACTOR,
    MAX_CURRENT_X_IB,
    REGISTER_MAX_CURRENT_A,
    REL_TOL,
    SLACK_COUNTS,
    VOLTAGE_RANGE_X_UN,
    Limits,
    check_measurements,
    energy_bound_counts,
    physical_bound_counts,
)

__all__ = [
    "ABS_TOL_W",
    "FLOOR_X_UNIB",
    "FREQUENCY_RANGE_HZ",
    "LAG_FACTOR",
    "MAX_CURRENT_X_IB",
    "REGISTER_MAX_CURRENT_A",
    "REL_TOL",
    "SLACK_COUNTS",
    "VOLTAGE_RANGE_X_UN",
    "Limits",
    "check_measurements",
    "energy_bound_counts",
    "physical_bound_counts",
]
