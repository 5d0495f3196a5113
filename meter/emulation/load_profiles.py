"""Fast-changing load profiles for the emulator: square waves, ramps, bursts.

A real chip refreshes its measurement registers once per metering cycle, averaged over it,
while a sweep reads them one after another: a load that changes within a cycle or between two
reads is where the plausibility rules (P ≈ U·I·PF, energy against power) can refuse readings.
These profiles put that on the emulator. Each is a repeating pattern of (duration_s, power_w)
segments from `start_mono_ns`, piecewise constant, so its energy integral is exact (the ground
truth); a ramp is a staircase of `step_s` steps. Extended on demand, for ever.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from meter.emulation.power_models import NS_PER_S, PowerModel, _Piecewise


class RepeatingProfile(_Piecewise):
    """`pattern` [(duration_s, power_w), ...] repeated for ever from `start_mono_ns`."""

    kind = "repeating"

    def __init__(self, pattern: Sequence[tuple[float, float]], *, start_mono_ns: int = 0,
                 label: str = "", **kwargs: float) -> None:
        super().__init__(**kwargs)
        if not pattern:
            raise ValueError("a repeating profile needs at least one (duration_s, power_w)")
        for d, p in pattern:
            if not (d > 0 and math.isfinite(d) and math.isfinite(p)):
                raise ValueError(f"segment ({d!r}, {p!r}): duration > 0 and finite power")
        self.pattern = [(float(d), float(p)) for d, p in pattern]
        self.label = label or self.kind
        self._ns = [max(round(d * NS_PER_S), 1) for d, _ in self.pattern]
        self._append(int(start_mono_ns), self.pattern[0][1])
        self._next_t = int(start_mono_ns) + self._ns[0]  # the next breakpoint
        self._next = 1 % len(self.pattern)  # and its segment

    def _prepare(self, t_mono_ns: int) -> None:
        while self._next_t <= t_mono_ns:
            self._append(self._next_t, self.pattern[self._next][1])
            self._next_t += self._ns[self._next]
            self._next = (self._next + 1) % len(self.pattern)

    @property
    def period_s(self) -> float:
        return sum(self._ns) / NS_PER_S

    def mean_power_w(self) -> float:
        return sum(d * p for d, p in self.pattern) / sum(d for d, _ in self.pattern)

    def describe(self) -> dict:
        return {**super().describe(), "profile": self.label, "pattern": self.pattern}


def square_wave(frequency_hz: float, low_w: float, high_w: float, *, start_mono_ns: int = 0,
                **kwargs: float) -> RepeatingProfile:
    """High for half a period, low for the other half."""
    half = 0.5 / frequency_hz
    return RepeatingProfile([(half, high_w), (half, low_w)],
                            label=f"square {frequency_hz:g} Hz {low_w:g}-{high_w:g} W",
                            start_mono_ns=start_mono_ns, **kwargs)


def ramp(low_w: float, high_w: float, period_s: float, step_s: float = 0.01, *,
         start_mono_ns: int = 0, **kwargs: float) -> RepeatingProfile:
    """A triangle: up from low to high over half the period, down over the other half."""
    n = max(int(period_s / 2 / step_s), 1)
    up = [(step_s, low_w + (high_w - low_w) * (i + 0.5) / n) for i in range(n)]
    return RepeatingProfile(up + up[::-1], label=f"ramp {low_w:g}-{high_w:g} W over "
                            f"{period_s:g} s", start_mono_ns=start_mono_ns, **kwargs)


def bursts(base_w: float, burst_w: float, burst_s: float, every_s: float, *,
           start_mono_ns: int = 0, **kwargs: float) -> RepeatingProfile:
    """`burst_w` for `burst_s` (shorter than a sweep) every `every_s`, `base_w` otherwise."""
    if not 0 < burst_s < every_s:
        raise ValueError(f"need 0 < burst_s < every_s, got {burst_s}, {every_s}")
    return RepeatingProfile([(burst_s, burst_w), (every_s - burst_s, base_w)],
                            label=f"bursts {burst_w:g} W for {burst_s:g} s every {every_s:g} s",
                            start_mono_ns=start_mono_ns, **kwargs)


class SwitchedLoad(_Piecewise):
    """A load switched on and off at run time (`set(t_mono_ns, power_w, power_factor)`): the
    plant of an emulated qualification (meter/qualify). Exact integrals like the others; the
    power factor applies from the switch on (measurements use it at the end of a cycle)."""

    kind = "switched"

    def __init__(self, *, start_mono_ns: int = 0, **kwargs: float) -> None:
        super().__init__(**kwargs)
        self._append(int(start_mono_ns), 0.0)

    def set(self, t_mono_ns: int, power_w: float, power_factor: float | None = None) -> None:
        if t_mono_ns <= self._t[-1]:
            t_mono_ns = self._t[-1] + 1
        self._append(int(t_mono_ns), power_w)
        if power_factor is not None:
            if not 0.0 < abs(power_factor) <= 1.0:
                raise ValueError(f"power_factor must be in (0, 1], got {power_factor}")
            self._power_factor = float(abs(power_factor))


class Coupled(PowerModel):
    """What a CT sees: its own load plus `fraction` of a neighbour's (crosstalk)."""

    kind = "coupled"

    def __init__(self, own: PowerModel, other: PowerModel, fraction: float) -> None:
        super().__init__()
        self.own, self.other, self.fraction = own, other, float(fraction)

    def power_w(self, t_mono_ns: int) -> float:
        return self.own.power_w(t_mono_ns) + self.fraction * self.other.power_w(t_mono_ns)

    def energy_j(self, t0_mono_ns: int, t1_mono_ns: int) -> float:
        return (self.own.energy_j(t0_mono_ns, t1_mono_ns)
                + self.fraction * self.other.energy_j(t0_mono_ns, t1_mono_ns))

    def energy_parts_j(self, t0_mono_ns: int, t1_mono_ns: int) -> tuple[float, float]:
        f0, r0 = self.own.energy_parts_j(t0_mono_ns, t1_mono_ns)
        f1, r1 = self.other.energy_parts_j(t0_mono_ns, t1_mono_ns)
        return f0 + self.fraction * f1, r0 + self.fraction * r1

    def voltage_v(self, t_mono_ns: int) -> float:
        return self.own.voltage_v(t_mono_ns)

    def power_factor(self, t_mono_ns: int) -> float:
        return self.own.power_factor(t_mono_ns)


class Silent(PowerModel):
    """A dead channel: the CT unplugged (or its burden open): no current, whatever the load."""

    kind = "silent"

    def power_w(self, t_mono_ns: int) -> float:
        return 0.0

    def energy_j(self, t0_mono_ns: int, t1_mono_ns: int) -> float:
        return 0.0
