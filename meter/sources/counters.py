"""Raw counter values → trace rows and events, one ``ChannelTracker`` per channel.

The rules (docs/sources.md):

* an **energy counter** writes a row only when its value changes: ``energy_j`` is the energy
  since the channel's first reading, ``power_w`` the mean power since the previous change
  (ΔE/Δt). An unchanged value is "no update yet", never a 0 W reading;
* a **power reading** writes a row per reading; ``energy_j`` integrates the readings over the
  sample times (trapezoid);
* a counter below its previous value **wrapped** when the source gives its range
  (``max_energy_range_uj``) and the wrapped step is plausible: a ``counter_wrap`` event, and the
  energy continues correctly. Otherwise it went **backwards** (driver reload, reset): a
  ``counter_backwards`` event and a ``gap`` over the step, whose energy is not counted;
* a value unchanged for ``freeze_after_s`` (5 s for an energy counter, 30 s for a power
  reading, which a coarse sensor may legitimately repeat) is **frozen**: a ``counter_frozen``
  event, no rows until it moves again, then a ``gap`` over the frozen span;
* a failing read (permission denied, file gone, NVML error) writes its event once per run of
  failures, with the fix, and a ``gap`` when readings resume. Never a zero.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from epi.formats.json_types import JSON
from meter.recording.failure_run import FailureRun
from meter.sources.common import ChannelSpec, SourceError

#: Largest power a wrapped step may imply before it counts as "went backwards" instead, W.
MAX_PLAUSIBLE_POWER_W = 20_000.0
DEFAULT_FREEZE_AFTER_S = 5.0  # an energy counter that does not move for 5 s is stuck
# A power reading may repeat exactly for a while (a coarse sensor at a steady load).
POWER_FREEZE_AFTER_S = 30.0

# (t_mono_ns, t_real_ns, kind, detail) of one event
EventSink = Callable[[int, int, str, str], None]


@dataclass
class TrackerStats:
    """What a channel did, for the trace metadata (update interval *as measured*)."""

    reads: int = 0
    updates: int = 0  # reads whose value changed (energy) / rows written (power)
    unchanged_reads: int = 0
    rows: int = 0
    wraps: int = 0
    backwards: int = 0
    frozen: int = 0
    failed_reads: int = 0
    min_step: float | None = None  # smallest nonzero change seen (J or W): the resolution
    intervals_ns: deque[int] = field(default_factory=lambda: deque(maxlen=256))

    def update_interval_s(self) -> float | None:
        """Median time between value changes, s (None before two changes)."""
        snapshot = list(self.intervals_ns)  # one C-level copy: safe while the poller appends
        if not snapshot:
            return None
        return statistics.median(snapshot) / 1e9

    def as_dict(self) -> dict[str, JSON]:
        return {
            "reads": self.reads,
            "updates": self.updates,
            "unchanged_reads": self.unchanged_reads,
            "rows": self.rows,
            "wraps": self.wraps,
            "backwards": self.backwards,
            "frozen": self.frozen,
            "failed_reads": self.failed_reads,
            "update_interval_s_measured": self.update_interval_s(),
            "smallest_step_measured": self.min_step,
        }


class ChannelTracker:
    """Turns one channel's raw values into (t_mono_ns, t_real_ns, power_w, energy_j) rows."""

    def __init__(self, spec: ChannelSpec, emit: EventSink, *,
                 freeze_after_s: float | None = None) -> None:
        self.spec = spec
        self.emit = emit
        if freeze_after_s is None:
            freeze_after_s = (DEFAULT_FREEZE_AFTER_S if spec.counter == "energy"
                              else POWER_FREEZE_AFTER_S)
        self.freeze_after_ns = int(freeze_after_s * 1e9)
        self.stats = TrackerStats()
        self.energy_j = 0.0
        self._last_value: float | None = None
        self._last_change_ns: int | None = None  # time of the last value change
        self._last_change_real_ns: int | None = None
        self._last_row_ns: int | None = None
        self._last_power_w: float | None = None
        self._frozen_since: tuple[int, int] | None = None
        self._failures = FailureRun()  # the open run of failed reads, by error kind
        self._last_error: SourceError | None = None  # the latest failed read's error

    # -- one reading -----------------------------------------------------------------------
    def feed(self, t_mono_ns: int, t_real_ns: int, value: float | SourceError
             ) -> tuple[int, int, float, float] | None:
        """Account one raw reading; return the row to write, or None (no new information)."""
        self.stats.reads += 1
        if isinstance(value, SourceError):
            self._fail(t_mono_ns, t_real_ns, value)
            return None
        resumed = self._resume(t_mono_ns, t_real_ns)
        if self.spec.counter == "energy":
            return self._energy(t_mono_ns, t_real_ns, float(value), resumed)
        return self._power(t_mono_ns, t_real_ns, float(value), resumed)

    def close(self, t_mono_ns: int, t_real_ns: int) -> None:
        """At stop: close an open run of failures or a freeze with its gap event."""
        closed = self._failures.close()
        if closed is not None and self._last_error is not None:
            err = self._last_error
            self._gap(closed.start_mono_ns, closed.start_real_ns, t_mono_ns, t_real_ns,
                      f"stopped while failing: {err.kind} ×{closed.failures}: {err.message}")
        if self._frozen_since is not None:
            start, start_real = self._frozen_since
            self._gap(start, start_real, t_mono_ns, t_real_ns,
                      f"stopped while the counter was frozen ({self.spec.name})")
            self._frozen_since = None

    # -- energy counters --------------------------------------------------------------------
    def _energy(self, t: int, t_real: int, raw: float, resumed: bool
                ) -> tuple[int, int, float, float] | None:
        prev = self._last_value
        if prev is None:  # the baseline: nothing to write yet
            self._mark_change(t, t_real, raw)
            return None
        if raw == prev:
            self._unchanged(t, t_real)
            return None
        assert self._last_change_ns is not None and self._last_change_real_ns is not None
        dt_ns = t - self._last_change_ns
        step = raw - prev
        valid = not resumed
        if step < 0:
            rng = self.spec.max_range_j
            wrapped = step + rng if rng else None
            if wrapped is not None and 0 < wrapped <= MAX_PLAUSIBLE_POWER_W * max(dt_ns, 1) / 1e9:
                self.stats.wraps += 1
                self.emit(t, t_real, "counter_wrap",
                          f"{self.spec.name}: counter wrapped at its range {rng:.6g} J "
                          f"({prev:.6g} → {raw:.6g} J); energy continues")
                step = wrapped
            else:
                self.stats.backwards += 1
                self.emit(t, t_real, "counter_backwards",
                          f"{self.spec.name}: counter went backwards {prev:.6g} → {raw:.6g} J "
                          "(driver reload or reset); the step is not counted")
                self._gap(self._last_change_ns, self._last_change_real_ns, t, t_real,
                          f"{self.spec.name}: counter went backwards")
                self._mark_change(t, t_real, raw)
                return None
        self._note_step(step)
        self.energy_j += step
        self.stats.intervals_ns.append(dt_ns)
        self._mark_change(t, t_real, raw)
        if not valid:
            return None
        return self._row(t, t_real, step / (dt_ns / 1e9) if dt_ns > 0 else float("nan"))

    # -- power readings ---------------------------------------------------------------------
    def _power(self, t: int, t_real: int, watts: float, resumed: bool
               ) -> tuple[int, int, float, float] | None:
        prev = self._last_value
        if prev is None:
            self._mark_change(t, t_real, watts)
        elif watts == prev:
            self._unchanged(t, t_real)
            if self._frozen_since is not None:
                return None
        else:
            self._note_step(abs(watts - prev))
            assert self._last_change_ns is not None
            self.stats.intervals_ns.append(t - self._last_change_ns)
            self._mark_change(t, t_real, watts)  # closes a freeze (gap, no trapezoid across)
        if self._last_row_ns is not None and self._last_power_w is not None and not resumed:
            self.energy_j += 0.5 * (watts + self._last_power_w) * (t - self._last_row_ns) / 1e9
        self._last_power_w = watts
        return self._row(t, t_real, watts)

    # -- shared -----------------------------------------------------------------------------
    def _row(self, t: int, t_real: int, power_w: float) -> tuple[int, int, float, float]:
        self._last_row_ns = t
        self.stats.rows += 1
        return (t, t_real, power_w, self.energy_j)

    def _note_step(self, step: float) -> None:
        if step > 0 and (self.stats.min_step is None or step < self.stats.min_step):
            self.stats.min_step = step

    def _mark_change(self, t: int, t_real: int, value: float) -> None:
        if self._last_value is not None:
            self.stats.updates += 1
        self._last_value = value
        self._last_change_ns, self._last_change_real_ns = t, t_real
        if self._frozen_since is not None:
            start, start_real = self._frozen_since
            self._frozen_since = None
            self._gap(start, start_real, t, t_real,
                      f"{self.spec.name}: counter frozen for {(t - start) / 1e9:.3g} s")
            self._last_row_ns = None  # no trapezoid across the frozen span
            self._last_power_w = None

    def _unchanged(self, t: int, t_real: int) -> None:
        self.stats.unchanged_reads += 1
        assert self._last_change_ns is not None and self._last_change_real_ns is not None
        if self._frozen_since is None and t - self._last_change_ns > self.freeze_after_ns:
            self.stats.frozen += 1
            self._frozen_since = (self._last_change_ns, self._last_change_real_ns)
            self.emit(t, t_real, "counter_frozen",
                      f"{self.spec.name}: value unchanged for "
                      f"{(t - self._last_change_ns) / 1e9:.3g} s (stuck counter or driver); "
                      "no rows until it moves; fix: check the driver, `epi doctor`")
        return None

    def _fail(self, t: int, t_real: int, err: SourceError) -> None:
        self.stats.failed_reads += 1
        previous, self._last_error = self._last_error, err
        opened = self._failures.book(t, t_real, err.kind)
        # once per run of failures, and again whenever the kind of failure changes
        if opened or previous is None or err.kind != previous.kind:
            self.emit(t, t_real, err.kind, f"{self.spec.name}: {err.line()}")

    def _resume(self, t: int, t_real: int) -> bool:
        """Close a run of failures: a gap over it; the next step is not trusted."""
        closed = self._failures.close()
        if closed is None or self._last_error is None:
            return False
        self._gap(closed.start_mono_ns, closed.start_real_ns, t, t_real,
                  f"{self.spec.name}: data resumed after {self._last_error.kind} "
                  f"×{closed.failures}")
        self._last_row_ns = None
        self._last_power_w = None
        return True

    def _gap(self, start: int, start_real: int, end: int, end_real: int, reason: str) -> None:
        self.emit(start, start_real, "gap",
                  f"end_mono_ns={end} end_real_ns={end_real}; {reason}")
