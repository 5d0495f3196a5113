"""Clocks for the meter side: the real one, and a simulated one for fast emulated runs.

Everything on the meter side that needs time (the emulator's physics, power models, the
driver's timestamps, the daemon's sampler) takes a `clock` instead of calling `time` directly,
so an hour of emulated metering can run in a second with `SimulatedClock`, and the same code
runs unchanged against real chips with `SystemClock`.

Both clocks give integer nanoseconds: `monotonic_ns()` (CLOCK_MONOTONIC) and `realtime_ns()`
(CLOCK_REALTIME, UTC since the epoch); `sleep_until(t_mono_ns)` waits (or, simulated, jumps)
until the monotonic clock reaches `t_mono_ns`.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

from epi.formats.json_types import JSON

# A fixed, readable default start for simulated runs (2024-01-01T00:00:00Z) so results repeat.
DEFAULT_SIM_REAL_NS = 1_704_067_200_000_000_000
DEFAULT_SIM_MONO_NS = 1_000_000_000


@runtime_checkable
class Clock(Protocol):
    """What the meter side needs of a clock: both clocks in integer ns, and a way to wait.

    `SystemClock` and `SimulatedClock` are the two implementations; every function that takes
    a clock takes this type (a clock with ``simulated = True`` jumps instead of sleeping).
    """

    def monotonic_ns(self) -> int: ...

    def realtime_ns(self) -> int: ...

    def sleep_until(self, t_mono_ns: int) -> None: ...


def is_simulated(clock: object) -> bool:
    """True for a clock that jumps (`SimulatedClock`): nothing real may be waited for."""
    return bool(getattr(clock, "simulated", False))


@runtime_checkable
class DescribedClock(Protocol):
    """A clock that says what it is (meta.json's ``clock``): both clocks here do."""

    def describe(self) -> dict[str, JSON]: ...


def describe_clock(clock: object) -> dict[str, JSON]:
    """A clock's own description, or {"kind": "system"} for one that has none."""
    return clock.describe() if isinstance(clock, DescribedClock) else {"kind": "system"}


class SystemClock:
    """The machine's clocks: CLOCK_MONOTONIC and CLOCK_REALTIME, in integer nanoseconds."""

    simulated = False

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()

    def realtime_ns(self) -> int:
        return time.time_ns()

    def sleep_until(self, t_mono_ns: int) -> None:
        """Sleep until the monotonic clock reaches `t_mono_ns` (returns at once if past)."""
        while True:
            remaining_ns = t_mono_ns - time.monotonic_ns()
            if remaining_ns <= 0:
                return
            time.sleep(remaining_ns / 1e9)

    def sleep(self, seconds: float) -> None:
        self.sleep_until(self.monotonic_ns() + int(seconds * 1e9))

    def describe(self) -> dict[str, JSON]:
        return {"kind": "system"}


class SimulatedClock:
    """A clock that only moves when told: `advance(ns)` or `sleep_until(t)` jump forward.

    Monotonic and realtime move together (no drift unless `drift_ppm` is given, which makes
    realtime run fast by that many parts per million — useful for clock-sync tests).
    Thread-safe: a lock guards the current time.
    """

    simulated = True

    def __init__(
        self,
        start_mono_ns: int = DEFAULT_SIM_MONO_NS,
        start_real_ns: int = DEFAULT_SIM_REAL_NS,
        *,
        drift_ppm: float = 0.0,
    ) -> None:
        self._start_mono_ns = int(start_mono_ns)
        self._start_real_ns = int(start_real_ns)
        self._mono_ns = int(start_mono_ns)
        self._drift_ppm = float(drift_ppm)
        self._lock = threading.Lock()

    def monotonic_ns(self) -> int:
        with self._lock:
            return self._mono_ns

    def realtime_ns(self) -> int:
        with self._lock:
            elapsed = self._mono_ns - self._start_mono_ns
        return self._start_real_ns + elapsed + int(elapsed * self._drift_ppm * 1e-6)

    def advance(self, ns: int) -> int:
        """Move time forward by `ns` (>= 0); returns the new monotonic time."""
        if ns < 0:
            raise ValueError(f"a clock cannot go backwards (advance by {ns} ns)")
        with self._lock:
            self._mono_ns += int(ns)
            return self._mono_ns

    def sleep_until(self, t_mono_ns: int) -> None:
        """Jump to `t_mono_ns` if it is in the future; otherwise do nothing."""
        with self._lock:
            if t_mono_ns > self._mono_ns:
                self._mono_ns = int(t_mono_ns)

    def sleep(self, seconds: float) -> None:
        self.advance(int(seconds * 1e9))

    def describe(self) -> dict[str, JSON]:
        return {
            "kind": "simulated",
            "start_mono_ns": self._start_mono_ns,
            "start_real_ns": self._start_real_ns,
            "drift_ppm": self._drift_ppm,
        }
