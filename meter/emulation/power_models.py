"""Power models: what the load on an emulated channel draws, with exact ground truth.

The ATM90E26 emulator is fed by one of these. A model answers, at a monotonic time (ns):
`voltage_v`, `current_a`, `power_factor`, `frequency_hz` and `power_w` (= V·I·PF, signed;
negative means energy flowing back), and — for ground truth — the exact integral of active
power between two times: `energy_j(t0_mono_ns, t1_mono_ns)`, split into forward and reverse
parts by `energy_parts_j`. `describe()` gives a dict for trace metadata; every model says
`"modelled": True` so nobody mistakes its numbers for a measurement.

- `ConstantPower`: one fixed operating point.
- `ScriptedProfile`: piecewise-constant power steps at given offsets from a start time — the
  exact ground truth that tests integrate against.
- `ActivityModel`: this machine's real CPU activity (from /proc/stat) mapped to a Pi-5-like
  wall power (about 2.7 W idle to about 9.5 W at full load). The mapping is a model, not a
  measurement of this machine's power; it is labelled as such.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from meter.clock import Clock

NS_PER_S = 1_000_000_000


class PowerModel:
    """Base: a fixed voltage, power factor and frequency; subclasses define `power_w`.

    Current follows from active power: I = |P| / (V · |PF|).
    """

    kind = "base"

    def __init__(
        self, *, voltage_v: float = 230.0, power_factor: float = 1.0, frequency_hz: float = 50.0
    ) -> None:
        if voltage_v <= 0:
            raise ValueError(f"voltage_v must be > 0, got {voltage_v}")
        if not 0.0 < abs(power_factor) <= 1.0:
            raise ValueError(f"power_factor must be in (0, 1], got {power_factor}")
        if not 45.0 <= frequency_hz <= 65.0:
            raise ValueError(f"frequency_hz must be within 45..65 Hz, got {frequency_hz}")
        self._voltage_v = float(voltage_v)
        self._power_factor = float(abs(power_factor))
        self._frequency_hz = float(frequency_hz)

    def power_w(self, t_mono_ns: int) -> float:
        """Active power at a monotonic time (abstract: each model provides it)."""
        raise NotImplementedError(type(self).__name__ + " must implement power_w")

    def energy_j(self, t0_mono_ns: int, t1_mono_ns: int) -> float:
        """Exact integral of active power between two times (abstract: the ground truth)."""
        raise NotImplementedError(type(self).__name__ + " must implement energy_j")

    def energy_parts_j(self, t0_mono_ns: int, t1_mono_ns: int) -> tuple[float, float]:
        """(forward_j, reverse_j) between two times, both >= 0; default: by the net sign."""
        net = self.energy_j(t0_mono_ns, t1_mono_ns)
        return (net, 0.0) if net >= 0 else (0.0, -net)

    def voltage_v(self, t_mono_ns: int) -> float:
        return self._voltage_v

    def power_factor(self, t_mono_ns: int) -> float:
        """Magnitude of the power factor (lagging); the sign of power carries direction."""
        return self._power_factor

    def frequency_hz(self, t_mono_ns: int) -> float:
        return self._frequency_hz

    def current_a(self, t_mono_ns: int) -> float:
        return abs(self.power_w(t_mono_ns)) / (self._voltage_v * self._power_factor)

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "modelled": True,
            "voltage_v": self._voltage_v,
            "power_factor": self._power_factor,
            "frequency_hz": self._frequency_hz,
        }


class ConstantPower(PowerModel):
    """A load drawing `power_w` at all times (negative = reverse flow)."""

    kind = "constant"

    def __init__(self, power_w: float, **kwargs: float) -> None:
        super().__init__(**kwargs)
        self._power_w = float(power_w)

    def power_w(self, t_mono_ns: int) -> float:
        return self._power_w

    def energy_j(self, t0_mono_ns: int, t1_mono_ns: int) -> float:
        return self._power_w * (t1_mono_ns - t0_mono_ns) / NS_PER_S

    def energy_parts_j(self, t0_mono_ns: int, t1_mono_ns: int) -> tuple[float, float]:
        e = self.energy_j(t0_mono_ns, t1_mono_ns)
        return (e, 0.0) if e >= 0 else (0.0, -e)

    def describe(self) -> dict:
        return {**super().describe(), "power_w": self._power_w}


class _Piecewise(PowerModel):
    """Piecewise-constant power over breakpoints; exact integrals via a cumulative table."""

    def __init__(self, **kwargs: float) -> None:
        super().__init__(**kwargs)
        self._t: list[int] = []  # breakpoints, ascending
        self._p: list[float] = []  # power on [t[i], t[i+1]); the last one holds on
        self._cum: list[float] = []  # signed energy from t[0] to t[i]
        self._cum_fwd: list[float] = []
        self._cum_rev: list[float] = []

    def _append(self, t_ns: int, power_w: float) -> None:
        if self._t:
            if t_ns <= self._t[-1]:
                raise ValueError("breakpoints must increase")
            dt_s = (t_ns - self._t[-1]) / NS_PER_S
            e = self._p[-1] * dt_s
            self._cum.append(self._cum[-1] + e)
            self._cum_fwd.append(self._cum_fwd[-1] + max(e, 0.0))
            self._cum_rev.append(self._cum_rev[-1] + max(-e, 0.0))
        else:
            self._cum.append(0.0)
            self._cum_fwd.append(0.0)
            self._cum_rev.append(0.0)
        self._t.append(int(t_ns))
        self._p.append(float(power_w))

    def _prepare(self, t_mono_ns: int) -> None:
        """Hook for models that extend their history on demand."""

    def _index(self, t_ns: int) -> int:
        return max(bisect.bisect_right(self._t, t_ns) - 1, 0)

    def _cum_at(self, t_ns: int, table: list[float], part: int) -> float:
        """Integral from t[0] to t_ns of power (part 0), its positive (1) or negative (2) part."""
        i = self._index(t_ns)
        e = self._p[i] * (t_ns - self._t[i]) / NS_PER_S
        if part == 1:
            e = max(e, 0.0) if t_ns >= self._t[i] else min(e, 0.0)
        elif part == 2:
            e = max(-e, 0.0) if t_ns >= self._t[i] else min(-e, 0.0)
        return table[i] + e

    def power_w(self, t_mono_ns: int) -> float:
        self._prepare(t_mono_ns)
        return self._p[self._index(t_mono_ns)]

    def energy_j(self, t0_mono_ns: int, t1_mono_ns: int) -> float:
        self._prepare(max(t0_mono_ns, t1_mono_ns))
        return self._cum_at(t1_mono_ns, self._cum, 0) - self._cum_at(t0_mono_ns, self._cum, 0)

    def energy_parts_j(self, t0_mono_ns: int, t1_mono_ns: int) -> tuple[float, float]:
        self._prepare(max(t0_mono_ns, t1_mono_ns))
        fwd_table, rev_table = self._cum_fwd, self._cum_rev
        fwd = self._cum_at(t1_mono_ns, fwd_table, 1) - self._cum_at(t0_mono_ns, fwd_table, 1)
        rev = self._cum_at(t1_mono_ns, rev_table, 2) - self._cum_at(t0_mono_ns, rev_table, 2)
        return max(fwd, 0.0), max(rev, 0.0)


class ScriptedProfile(_Piecewise):
    """Power steps `[(t_offset_s, power_w), ...]` relative to `start_mono_ns`.

    Each power holds from its offset until the next one; the last holds for ever. Before the
    first offset the first power applies (the profile is stationary before it starts).
    `energy_j` is exact (sums of rectangles), which makes this the ground truth for tests.
    """

    kind = "scripted"

    def __init__(
        self,
        steps: Sequence[tuple[float, float]],
        *,
        start_mono_ns: int = 0,
        **kwargs: float,
    ) -> None:
        super().__init__(**kwargs)
        if not steps:
            raise ValueError("a scripted profile needs at least one (t_offset_s, power_w) step")
        self._steps = [(float(t), float(p)) for t, p in steps]
        self._start_mono_ns = int(start_mono_ns)
        last = None
        for t_s, p_w in self._steps:
            if last is not None and t_s <= last:
                raise ValueError(f"step offsets must increase: {t_s} after {last}")
            if not math.isfinite(p_w):
                raise ValueError(f"step power must be finite, got {p_w}")
            self._append(self._start_mono_ns + round(t_s * NS_PER_S), p_w)
            last = t_s

    def describe(self) -> dict:
        return {
            **super().describe(),
            "start_mono_ns": self._start_mono_ns,
            "steps": [[t, p] for t, p in self._steps],
        }


def read_cpu_times(proc_stat: str | Path = "/proc/stat") -> tuple[int, int]:
    """(busy_jiffies, total_jiffies) summed over all CPUs, from the `cpu` line of /proc/stat."""
    with open(proc_stat, encoding="ascii") as f:
        for line in f:
            if line.startswith("cpu "):
                fields = [int(x) for x in line.split()[1:]]
                idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
                total = sum(fields[:8])  # guest time is already inside user/nice
                return total - idle, total
    raise ValueError(f"{proc_stat}: no aggregate 'cpu' line")


class ActivityModel(_Piecewise):
    """This machine's CPU activity mapped to a Pi-5-like wall power — modelled, not measured.

    What it reads: the aggregate `cpu` line of the whole machine's /proc/stat (or any
    `cpu_times()` callable giving cumulative (busy, total) jiffies). Every process counts —
    the meter daemon itself, the inference, any other job — just as a wall meter would see
    the whole machine, not one process.

    Timing: the busy fraction u measured between two readings is the activity *of that
    interval*, so it sets the power of that interval — P = idle_w + (max_w − idle_w) · u on
    [previous reading, this reading) — not of the time after it (that was a lag of one update
    period: 100 % CPU from 1.0 to 1.3 s showed as power from 1.1 to 1.4 s). A reading is taken
    whenever the model is asked about a time at least `update_period_s` after the previous one,
    so power follows activity within max(update period, query period), i.e. within one sample
    period of the daemon that reads the chip. Times after the latest reading are provisional
    (the last power held) until the next reading replaces them; everything before the latest
    reading is final. Resolution: /proc/stat counts in jiffies (10 ms per CPU).

    Defaults follow published Pi 5 figures (≈2.7 W idle, ≈9.5 W with all cores busy, wall
    side of a USB-C supply with a power factor of ≈0.6). The history is kept so `energy_j`
    over any past window is exact for the model; beyond `max_points` the oldest half is dropped
    (earlier times then see the oldest kept power).
    """

    kind = "activity"

    def __init__(
        self,
        clock: Clock,
        *,
        idle_w: float = 2.7,
        max_w: float = 9.5,
        update_period_s: float = 0.05,
        proc_stat: str | Path = "/proc/stat",
        cpu_times: Callable[[], tuple[int, int]] | None = None,
        max_points: int = 50_000,
        voltage_v: float = 230.0,
        power_factor: float = 0.6,
        frequency_hz: float = 50.0,
    ) -> None:
        super().__init__(voltage_v=voltage_v, power_factor=power_factor, frequency_hz=frequency_hz)
        if not 0 < idle_w <= max_w:
            raise ValueError(f"need 0 < idle_w <= max_w, got {idle_w}, {max_w}")
        self._clock = clock
        self._idle_w = float(idle_w)
        self._max_w = float(max_w)
        self._period_ns = max(int(update_period_s * NS_PER_S), 1)
        self._proc_stat = str(proc_stat) if cpu_times is None else "cpu_times()"
        self._cpu_times = cpu_times or (lambda: read_cpu_times(proc_stat))
        self._max_points = int(max_points)
        self._busy, self._total = self._cpu_times()
        self._append(clock.monotonic_ns(), self._idle_w)

    def _prepare(self, t_mono_ns: int) -> None:
        """Read the activity since the last reading and give its power to that interval."""
        t_last = self._t[-1]
        if t_mono_ns < t_last + self._period_ns:
            return
        busy, total = self._cpu_times()
        d_total = total - self._total
        if d_total <= 0:  # no tick counted yet: the interval stays provisional
            return
        util = min(max((busy - self._busy) / d_total, 0.0), 1.0)
        self._busy, self._total = busy, total
        # The interval [t_last, now) gets the power of its own activity; the new breakpoint
        # at now holds that power provisionally until the next reading.
        power = self._idle_w + (self._max_w - self._idle_w) * util
        self._p[-1] = power
        self._append(int(t_mono_ns), power)
        if len(self._t) > self._max_points:
            half = len(self._t) // 2
            for table in (self._t, self._p, self._cum, self._cum_fwd, self._cum_rev):
                del table[:half]

    def describe(self) -> dict:
        return {
            **super().describe(),
            "source": self._proc_stat,
            "reads": "whole-machine CPU time (every process counts, as a wall meter sees it)",
            "timing": "each reading's busy fraction sets the power of the interval it measured",
            "mapping": "idle_w + (max_w - idle_w) * cpu_busy_fraction",
            "idle_w": self._idle_w,
            "max_w": self._max_w,
            "update_period_s": self._period_ns / NS_PER_S,
        }
