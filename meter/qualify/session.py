"""Running a qualification: idle, then each channel loaded in turn, measured against a reference.

`qualify(...)` drives the steps through a `Plant` (who switches the load: the user, guided
by prompts, or the emulated plant) and a `Reference` (what the load really took: a plug-in
meter's reading typed in, a known resistive load, another CT on the same conductor, or the
emulator's exact integral), measures every channel over each window and hands the windows
to `meter.qualify.analysis`. The same code runs a real board and the emulated one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from meter.chip.calibration import l_pga_gain, threshold_power_w
from meter.clock import Clock
from meter.driver.atm90e26 import ATM90E26Driver
from meter.errors import BusError
from meter.qualify.analysis import (
    ChannelQualification,
    Window,
    crosstalk_fraction,
    judge_channel,
)


class Plant(Protocol):
    def set_load(self, channel: int | None, power_factor: float = 1.0) -> None:
        """Load channel `channel` alone (None: every channel idle)."""


class Reference(Protocol):
    uncertainty_pct: float

    def energy_j(self, channel: int, t0_mono_ns: int, t1_mono_ns: int,
                 windows: Sequence[Window]) -> float:
        """The energy channel `channel`'s load really took over the window (`windows`: every
        channel's, for a reference that is itself a channel)."""


@dataclass(frozen=True)
class QualifyOptions:
    accuracy_class_pct: float = 1.0
    idle_s: float = 30.0
    load_s: float = 30.0
    settle_s: float = 1.0  # after a switch: several metering cycles
    sweep_s: float = 0.05
    low_power_factor: float | None = 0.5  # None: skip the phase step
    min_load_w: float = 2.7  # the smallest load the board must meter (a Pi 5 at idle)


@dataclass
class _Acc:
    e0: float
    r0: float
    t_prev: int | None = None
    integral: float = 0.0
    p_sum: float = 0.0
    i_sum: float = 0.0
    u_sum: float = 0.0
    rows: int = 0
    refused: int = 0


def measure(drivers: Sequence[ATM90E26Driver], clock: Clock, seconds: float, sweep_s: float
            ) -> tuple[list[Window], int, int]:
    """Every channel over `seconds` of sweeps: (windows, t0, t1) in the clock's ns."""
    accs = [_Acc(d.energy_j, d.reverse_energy_j) for d in drivers]
    t0 = clock.monotonic_ns()
    end = t0 + int(seconds * 1e9)
    next_t = t0
    while True:
        next_t += int(sweep_s * 1e9)
        if next_t > end:
            break
        clock.sleep_until(next_t)
        for d, a in zip(drivers, accs, strict=True):
            try:
                r = d.read_sample()
            except BusError:
                a.refused += 1
                continue
            if r.power_w is None:
                continue
            if a.t_prev is not None:
                a.integral += r.power_w * (r.t_mono_ns - a.t_prev) / 1e9
            a.t_prev = r.t_mono_ns
            a.p_sum += r.power_w
            a.i_sum += r.current_a or 0.0
            a.u_sum += r.voltage_v or 0.0
            a.rows += 1
    t1 = clock.monotonic_ns()
    out = []
    for d, a in zip(drivers, accs, strict=True):
        n = max(a.rows, 1)
        counter = d.energy_j - a.e0
        # the integral covers the readings' span; the counter the whole window: scale
        integral = a.integral * (seconds / max(seconds - sweep_s, 1e-9)) if a.rows > 1 else 0.0
        out.append(Window(seconds, counter, d.reverse_energy_j - a.r0, integral, a.p_sum / n,
                          a.i_sum / n, a.u_sum / n, a.rows, a.refused,
                          d.calibration.joules_per_count()))
    return out, t0, t1


def start_threshold_w(driver: ATM90E26Driver) -> float:
    cal = driver.calibration
    fe = cal.frontend or {}
    if not fe:
        return 0.0
    return float(threshold_power_w(cal.get("PStartTh"), fe["un_v"], fe["ib_a"],
                                   l_pga_gain(cal.get("MMode")), fe["v_l_mv"], fe["v_u_mv"]))


def qualify(drivers: Sequence[ATM90E26Driver], names: Sequence[str], clock: Clock,
            plant: Plant, reference: Reference, opts: QualifyOptions
            ) -> list[ChannelQualification]:
    """Idle, each channel loaded at PF 1, each at a low PF: judged per channel."""
    def step(channel: int | None, pf: float, seconds: float) -> tuple[list[Window], int, int]:
        plant.set_load(channel, pf)
        clock.sleep_until(clock.monotonic_ns() + int(opts.settle_s * 1e9))
        for d in drivers:  # a reading after settling starts every channel's window
            with contextlib.suppress(BusError):
                d.read_sample()
        return measure(drivers, clock, seconds, opts.sweep_s)

    idle, _, _ = step(None, 1.0, opts.idle_s)
    loaded: list[tuple[list[Window], float]] = []
    for c in range(len(drivers)):
        wins, t0, t1 = step(c, 1.0, opts.load_s)
        loaded.append((wins, reference.energy_j(c, t0, t1, wins)))
    low: list[tuple[Window, float] | None] = [None] * len(drivers)
    if opts.low_power_factor is not None:
        for c in range(len(drivers)):
            wins, t0, t1 = step(c, opts.low_power_factor, opts.load_s)
            low[c] = (wins[c], reference.energy_j(c, t0, t1, wins))
    plant.set_load(None)
    results = []
    for c, d in enumerate(drivers):
        cross = {names[o]: crosstalk_fraction(loaded[o][0][c], idle[c], loaded[o][0][o],
                                              loaded[o][1])
                 for o in range(len(drivers)) if o != c}
        results.append(judge_channel(
            names[c], idle[c], loaded[c][0][c], loaded[c][1], reference.uncertainty_pct,
            opts.accuracy_class_pct, start_threshold_w(d), opts.min_load_w, cross, low[c]))
    return results
