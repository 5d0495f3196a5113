"""Plausibility checks of a chip reading: what a bit error or a cut frame can produce.

The ATM90E26's SPI has no checksum on reads and no address echo. LastData confirms that the
word we received is the word the chip sent, but a MOSI bit error can redirect a read to
another register, which LastData then confirms. What remains is physics and the chip's own
definitions of its registers (docs/atm90e26.md §Consistency):

* ranges: mains voltage within [0.5, 1.5]·Un, frequency 45..65 Hz, |PF| ≤ 1, current at most
  ``MAX_CURRENT_X_IB``·Ib (and never above the register's full scale);
* consistency: apparent power S = Urms·Irms and active power P = Urms·Irms·PF, within
  ``REL_TOL`` of U·I plus ``ABS_TOL_W`` (register resolution and a refresh straddled between
  two register reads);
* energy: the ATenergy counts since the last read cannot exceed what the power allows over
  that interval (``energy_bound_counts``).

The driver re-reads once on a failed check (a straddled refresh or a redirected read passes
the second time) and reports what it rejected, with these reasons, as ``implausible`` events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

REL_TOL = 0.01
ABS_TOL_W = 0.05
MAX_CURRENT_X_IB = 60.0
REGISTER_MAX_CURRENT_A = 65.535
FREQUENCY_RANGE_HZ = (45.0, 65.0)
VOLTAGE_RANGE_X_UN = (0.5, 1.5)
# Energy bound: the power registers are the mean of the last complete refresh window, so the
# load may have risen since; allow LAG_FACTOR times the power read, plus FLOOR_X_UNIB·Un·Ib.
LAG_FACTOR = 4.0
FLOOR_X_UNIB = 0.05
SLACK_COUNTS = 2


@dataclass(frozen=True)
class Limits:
    """The physical ranges of one channel (from its analog front end)."""

    voltage_v: tuple[float, float]
    frequency_hz: tuple[float, float]
    max_current_a: float
    floor_w: float

    @property
    def max_power_w(self) -> float:
        return self.voltage_v[1] * self.max_current_a

    @classmethod
    def for_frontend(cls, frontend: Mapping[str, float]) -> Limits:
        un, ib = float(frontend["un_v"]), float(frontend["ib_a"])
        lo, hi = VOLTAGE_RANGE_X_UN
        return cls(
            voltage_v=(lo * un, hi * un),
            frequency_hz=FREQUENCY_RANGE_HZ,
            max_current_a=min(MAX_CURRENT_X_IB * ib, REGISTER_MAX_CURRENT_A),
            floor_w=FLOOR_X_UNIB * un * ib,
        )


def check_measurements(values: Mapping[str, float], limits: Limits) -> list[str]:
    """Reasons why a set of register values (Urms, Irms, Pmean, Smean, PowerF, Freq) cannot be
    one measurement of a mains channel; empty when they can."""
    u, i, p = values["Urms"], values["Irms"], values["Pmean"]
    s, pf, f = values["Smean"], values["PowerF"], values["Freq"]
    reasons = []
    lo, hi = limits.voltage_v
    if not lo <= u <= hi:
        reasons.append(f"voltage {u:.2f} V outside {lo:g}..{hi:g} V")
    flo, fhi = limits.frequency_hz
    if not flo <= f <= fhi:
        reasons.append(f"frequency {f:.2f} Hz outside {flo:g}..{fhi:g} Hz")
    if not -1.0005 <= pf <= 1.0005:
        reasons.append(f"power factor {pf:.3f} outside -1..1")
    if not 0 <= i <= limits.max_current_a:
        reasons.append(f"current {i:.3f} A outside 0..{limits.max_current_a:g} A")
    if reasons:
        return reasons
    ui = u * i
    tol = REL_TOL * ui + ABS_TOL_W
    if abs(s - ui) > tol:
        reasons.append(f"apparent power {s:.3f} VA but U·I = {ui:.3f} VA")
    if abs(p - ui * pf) > tol:
        reasons.append(f"active power {p:.3f} W but U·I·PF = {ui * pf:.3f} W")
    return reasons


def energy_bound_counts(
    powers_w: list[float], dt_s: float, joules_per_count: float, limits: Limits
) -> float:
    """The most ATenergy counts a load whose power reads ``powers_w`` can meter in ``dt_s``."""
    p = max((abs(x) for x in powers_w), default=0.0)
    return (p * LAG_FACTOR + limits.floor_w) * max(dt_s, 0.0) / joules_per_count + SLACK_COUNTS


def physical_bound_counts(dt_s: float, joules_per_count: float, limits: Limits) -> float:
    """The most counts any load within the channel's ranges can meter in ``dt_s``."""
    return limits.max_power_w * max(dt_s, 0.0) / joules_per_count + SLACK_COUNTS
