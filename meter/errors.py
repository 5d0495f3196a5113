"""Every exception the meter package raises, in one place (as gpiozero keeps `exc.py`).

The chip and bus faults live in `meter.chip.errors` because the board firmware raises them
too (MicroPython subset); they are re-exported here with the serial link's `LinkLost`.
"""

from __future__ import annotations

from meter.chip.errors import (
    BusError,
    BusTimeout,
    CalibrationError,
    ChecksumError,
    ChipAbsentError,
    ChipFault,
    ChipResetError,
    ChipStuckError,
    ImplausibleReadingError,
    VerifyError,
)

__all__ = [
    "BusError",
    "BusTimeout",
    "CalibrationError",
    "ChecksumError",
    "ChipAbsentError",
    "ChipFault",
    "ChipResetError",
    "ChipStuckError",
    "ImplausibleReadingError",
    "LinkLost",
    "VerifyError",
]


class LinkLost(Exception):
    """The serial port to the board's MCU failed or is gone."""
