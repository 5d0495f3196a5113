"""One reading of one ATM90E26: a frozen record with units in its field names.

``ready`` is False for a reading taken before the chip finished its first measurement cycle
after start-up or re-initialisation (the driver knows when it started the measurement block;
see ``ATM90E26Driver.first_measurement_s``). The measurement fields of such a reading are
``None`` — the registers still hold their reset zeros, which are not values — while
``energy_j`` stays valid (the metering block runs independently).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from epi.formats.json_types import JSON


@dataclass(frozen=True)
class Reading:
    """One reading of one chip. Units in the names; ``None`` where a value was not read."""

    t_mono_ns: int
    t_real_ns: int
    power_w: float | None
    voltage_v: float | None
    current_a: float | None
    power_factor: float | None
    frequency_hz: float | None
    energy_j: float
    status: int
    reactive_power_var: float | None = None
    apparent_power_va: float | None = None
    phase_angle_deg: float | None = None
    energy_counts: int = 0
    energy_t_mono_ns: int | None = None
    n_line: dict[str, float] | None = None
    ready: bool = True

    def as_dict(self) -> dict[str, JSON]:
        """The fields as a plain dict (for JSON output)."""
        return dataclasses.asdict(self)


MEASUREMENT_FIELDS = (
    "power_w",
    "voltage_v",
    "current_a",
    "power_factor",
    "frequency_hz",
    "reactive_power_var",
    "apparent_power_va",
    "phase_angle_deg",
)
