"""The sampling loop: every channel on a steady schedule, faults turned into events.

Schedule: sweep k is due at ``t0 + k·period`` (absolute deadlines), so the schedule never
drifts however long a sweep takes. A sweep that begins more than ``late_tolerance`` after its
deadline is *late*; when a sweep overruns a whole period the slots that can no longer be
served are *skipped* (never bunched up). Both are counted, reported as ``late`` events (at
most one a second) and summarised with the lateness statistics in the segment metadata.
``seq`` is the schedule slot, so a skipped slot leaves a hole in ``seq``.

Faults: a read that raises a bus error writes no row (never a 0 W row for lack of data). The
first failure of a channel writes its event (``bus_error``, ``chip_reset``, ``absent``) with
the reason; while the channel keeps failing, failures are counted; when data comes back (or
the sampler stops) a ``gap`` event records the span and the counts. An absent chip, or one
that failed three reads in a row, is retried only once per ``absent_retry_s`` so that it
cannot eat the other channels' bus time. Events the driver reports itself (``reinit``,
``checksum_error``, ...) are written as they come, at most a few per second per kind and
channel (the rest are counted); its report of the failure a read raised is merged into that
failure's event. After start-up and after every re-initialisation the chip's measurement
registers hold their reset zeros until its first measurement cycle ends; the driver knows
when it started that cycle and marks earlier readings ``ready = False`` (the chip's state,
not the values, decides). Such readings are missing data, written as a gap, never as 0 W
rows. Readings that fail the driver's plausibility checks twice (``ImplausibleReadingError``)
are faults of kind ``implausible``: no row, an event with the reasons, a gap. An interval
the driver could not meter (``driver.unmetered``: a re-initialisation lost the chip's counter)
becomes a channel ``gap`` with its exact ends and a reason beginning ``UNMETERED_GAP_REASON``,
so energy checks can subtract exactly what the trace declares lost.

The sweep rate the bus sustains as driven is measured as the sampler runs (1 / p90 sweep
duration): in ``skipped`` events, ``stats.sustainable_rate_hz`` and the live state (/metrics).

Works with a ``SimulatedClock``: ``sleep_until`` then jumps, so an hour runs in seconds.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from epi.formats.json_types import JSON
from epi.formats.trace import EventKind
from meter.clock import Clock, is_simulated
from meter.daemon.event_budget import EventBudget
from meter.daemon.jitter import JitterStats
from meter.daemon.live_stream import LiveHub, StreamKind
from meter.daemon.metrics import COUNTED_FAULT_KINDS, MeterState
from meter.daemon.trace import UNMETERED_GAP_REASON, TraceWriter, gap_detail
from meter.driver.atm90e26 import UnmeteredInterval
from meter.driver.selfcheck import ChainSelfCheck, SelfCheckConfig
from meter.errors import (
    BusError,
    ChecksumError,
    ChipAbsentError,
    ChipResetError,
    ImplausibleReadingError,
)
from meter.recording.disk_full import DiskFullWatch
from meter.recording.failure_run import FailureRun


class SampleSource(Protocol):
    """What the sampler needs of a driver (``meter.driver.atm90e26.ATM90E26Driver``)."""

    def read_sample(self) -> object: ...


class ChannelLike(Protocol):
    """What the sampler needs of an opened channel (``meter.board.channels.Channel``)."""

    @property
    def index(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def driver(self) -> SampleSource: ...


# Which failed read is which event kind (any other BusError is a bus_error).
_FAULT_KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (ChipAbsentError, "absent"),
    (ChipResetError, "chip_reset"),
    (ChecksumError, "checksum_error"),
    (ImplausibleReadingError, "implausible"),
)
# counted per channel (/status and `epi doctor` show a reversed CT); a full disk is counted
# apart, once per episode (DiskFullWatch)
FAULT_EVENT_KINDS = frozenset(COUNTED_FAULT_KINDS) - {"disk_full"}
_BACKOFF_AFTER = 3  # consecutive failed reads before a channel is only retried now and then


def fault_kind(exc: BaseException) -> str:
    """The trace event kind of a failed read."""
    for cls, kind in _FAULT_KINDS:
        if isinstance(exc, cls):
            return kind
    return "bus_error"


def _unmetered(driver: object) -> list[UnmeteredInterval]:
    """The driver's list of intervals it could not meter (empty for drivers without one)."""
    lost = getattr(driver, "unmetered", None)
    return lost if isinstance(lost, list) else []


def _value(sample: object, name: str) -> float | int | None:
    """A reading's number (`Reading` or a test double's attribute); None when it is missing,
    not a number, or not finite."""
    v = getattr(sample, name, None)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _self_check(driver: object, period_s: float) -> ChainSelfCheck | None:
    """A chain self-check for a driver that knows its energy count (`calibration`), else
    None (software sources and test doubles have no counter to check)."""
    cal = getattr(driver, "calibration", None)
    per_count = getattr(cal, "joules_per_count", None)
    if not callable(per_count):
        return None
    j = per_count()
    if not isinstance(j, float) or not j > 0:
        return None
    return ChainSelfCheck(SelfCheckConfig(joules_per_count=j, sweep_s=period_s))


def _time(sample: object, name: str, default: int) -> int:
    v = getattr(sample, name, None)
    return v if isinstance(v, int) and not isinstance(v, bool) and v else default


@dataclass
class _ChannelRun:
    """Per-channel bookkeeping of the current fault run."""

    failures: FailureRun = field(default_factory=FailureRun)
    consecutive_failures: int = 0
    last_kind: str = ""
    retry_at_mono: int | None = None
    last_good_mono: int | None = None


@dataclass
class SamplerStats:
    """Counters of one sampler run (also written into meta.json under ``stats``)."""

    sweeps: int = 0
    late_sweeps: int = 0
    skipped_sweeps: int = 0
    samples_written: int = 0
    samples_dropped: int = 0  # read but not written: the disk was full (see disk_full events)
    failed_reads: int = 0
    deferred_reads: int = 0  # absent chips not retried yet in a sweep
    not_ready_reads: int = 0  # readings before the chip's first measurement after (re)init
    faults: dict[str, int] = field(default_factory=dict)
    suppressed_events: int = 0
    lateness: JitterStats = field(default_factory=JitterStats)
    sweep_duration: JitterStats = field(default_factory=JitterStats)

    wire_rate_hz: float | None = None  # what the bus's wire time alone allows (a cap)

    @property
    def sustainable_rate_hz(self) -> float | None:
        """Sweeps per second the bus kept up as driven, measured as the run goes:
        1 / (p90 of the sweep durations so far), never above the wire's own rate (emulated
        chips answer without the wire time, so their sweeps can be shorter than the bus
        allows); None before the first sweep (never 0)."""
        p90 = self.sweep_duration.quantile_ns(0.9)
        if not p90:
            return None
        rate = 1e9 / p90
        return min(rate, self.wire_rate_hz) if self.wire_rate_hz else rate

    def as_dict(self) -> dict[str, JSON]:
        return {
            "sweeps": self.sweeps,
            "late_sweeps": self.late_sweeps,
            "skipped_sweeps": self.skipped_sweeps,
            "samples_written": self.samples_written,
            "samples_dropped": self.samples_dropped,
            "failed_reads": self.failed_reads,
            "deferred_reads": self.deferred_reads,
            "not_ready_reads": self.not_ready_reads,
            "faults": dict(self.faults),
            "suppressed_events": self.suppressed_events,
            "schedule_lateness_ns": self.lateness.as_dict(),
            "sweep_duration_ns": self.sweep_duration.as_dict(),
            "sustainable_rate_hz": self.sustainable_rate_hz,
            "wire_rate_hz": self.wire_rate_hz,
        }


class Sampler:
    """Samples ``channels`` every ``period_s`` into a TraceWriter (and the live state/stream)."""

    def __init__(
        self,
        channels: Sequence[ChannelLike],
        clock: Clock,
        writer: TraceWriter,
        *,
        period_s: float,
        state: MeterState | None = None,
        hub: LiveHub | None = None,
        late_tolerance_s: float | None = None,
        absent_retry_s: float = 1.0,
        stats_interval_s: float = 5.0,
        before_sweep: Callable[[int], None] | None = None,
        wire_rate_hz: float | None = None,
    ) -> None:
        if not period_s > 0:
            raise ValueError("period_s must be positive")
        self.channels = list(channels)
        self.clock = clock
        self.writer = writer
        self.period_ns = max(1, round(period_s * 1e9))
        self.state = state
        self.hub = hub
        tol = late_tolerance_s if late_tolerance_s is not None else period_s / 4
        self.late_tolerance_ns = round(tol * 1e9)
        self.absent_retry_ns = round(absent_retry_s * 1e9)
        self.stats_interval_ns = round(stats_interval_s * 1e9)
        self.before_sweep = before_sweep
        self.stats = SamplerStats(wire_rate_hz=wire_rate_hz)
        self._runs = {ch.index: _ChannelRun() for ch in self.channels}
        self._names = {ch.index: ch.name for ch in self.channels}
        self._event_budget = EventBudget()
        self._late_pending = 0
        self._skipped_pending = 0
        self._late_max_ns = 0
        self._late_last_event_mono: int | None = None
        self._simulated = is_simulated(clock)
        self._stop = threading.Event()
        self._reading: int | None = None
        self._disk_full = DiskFullWatch()
        self.checkpoint_requested = threading.Event()
        self._held: list[tuple[str, str]] = []
        # unmetered intervals the drivers reported before this run are not this trace's
        self._unmetered_seen = {ch.index: len(_unmetered(ch.driver)) for ch in self.channels}
        # the chain checks itself (counter vs integral of Pmean, P vs U·I·PF)
        self._checks = {ch.index: _self_check(ch.driver, period_s) for ch in self.channels}
        if self.state is not None:  # a channel without a check shows no verdict at all
            for index, check in self._checks.items():
                if check is not None:
                    self.state.record_chain(index, False, None)

    # -- control ------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to end after the current sweep (safe from a signal handler)."""
        self._stop.set()

    def request_checkpoint(self) -> None:
        """Ask for the statistics callback after the current sweep (safe from a signal
        handler: nothing is written from the handler itself)."""
        self.checkpoint_requested.set()

    def _wait_until(self, deadline_ns: int) -> None:
        if not self._simulated:
            remaining_s = (deadline_ns - self.clock.monotonic_ns()) / 1e9
            if remaining_s > 0.003 and self._stop.wait(remaining_s - 0.002):
                return
        self.clock.sleep_until(deadline_ns)

    # -- events -------------------------------------------------------------------------------
    def event(self, channel: int | None, kind: str, detail: str = "") -> None:
        """Record an event now: counted, then written (at most a few a second per kind)."""
        t_mono, t_real = self.clock.monotonic_ns(), self.clock.realtime_ns()
        if kind in FAULT_EVENT_KINDS:
            self.stats.faults[kind] = self.stats.faults.get(kind, 0) + 1
            if self.state is not None:
                self.state.record_fault(channel, kind)
        admitted = self._event_budget.admit(channel, kind, t_mono, detail)
        if admitted is None:
            self.stats.suppressed_events += 1
            return
        detail = admitted
        self._write_event(t_mono, t_real, channel, kind, detail)

    def _write_event(
        self, t_mono: int, t_real: int, channel: int | None, kind: str, detail: str
    ) -> None:
        self.writer.write_event(t_mono, t_real, channel, kind, detail)
        if self.hub is not None:
            self.hub.publish(
                {
                    "type": StreamKind.EVENT,
                    "t_mono_ns": t_mono,
                    "t_real_ns": t_real,
                    "channel": channel,
                    "kind": kind,
                    "detail": detail,
                }
            )

    def driver_event(self, channel: int, kind: str, detail: str = "") -> None:
        """The drivers' ``on_event`` target (``open_channels(on_event=...)`` signature).

        Events a driver reports while the sampler reads it are held until the read ends, so
        that a failed read and the driver's report of the same failure make one event.
        """
        if self._reading == channel:
            self._held.append((kind, str(detail)))
        else:
            self.event(channel, kind, str(detail))

    def driver_event_handler(self, channel: int) -> Callable[[str, str], None]:
        """An ``on_event(kind, detail)`` callback bound to one channel."""

        def handler(kind: str, detail: str = "") -> None:
            self.driver_event(channel, kind, detail)

        return handler

    def _release_held(self, channel: int, failed_kind: str | None, repeated: bool) -> None:
        """Write the events the driver reported during a read.

        The driver's report of the very failure the read raised is dropped (the failure's own
        event says it); while a channel keeps failing the same way, its repeated reports are
        counted only. Other kinds (e.g. ``reinit`` after a recovered reset) are written.
        """
        held, self._held = self._held, []
        for kind, detail in held:
            if failed_kind is not None and kind == failed_kind:
                continue
            if repeated and kind in ("absent", "bus_error"):
                self.stats.faults[kind] = self.stats.faults.get(kind, 0) + 1
                continue
            self.event(channel, kind, detail)

    # -- faults -------------------------------------------------------------------------------
    def _fault(
        self, ch: int, kind: str, reason: str, t_mono: int, t_real: int, t_began: int
    ) -> bool:
        """Book a failed read; returns True when it only repeats the current failure run."""
        run = self._runs[ch]
        self.stats.failed_reads += 1
        run.consecutive_failures += 1
        if run.failures.book(t_mono, t_real, kind):
            run.last_kind = ""
        repeated = kind == run.last_kind
        if not repeated:  # the first failure of a run, or a new kind of failure
            run.last_kind = kind
            self.stats.faults[kind] = self.stats.faults.get(kind, 0) + 1
            if self.state is not None:
                self.state.record_fault(ch, kind)
            self._write_event(t_mono, t_real, ch, kind, reason)
        if kind == EventKind.ABSENT or run.consecutive_failures >= _BACKOFF_AFTER:
            run.retry_at_mono = t_began + self.absent_retry_ns
        else:
            run.retry_at_mono = None
        return repeated

    def _book_not_ready(self, ch: int, t_mono: int, t_real: int) -> None:
        run = self._runs[ch]
        self.stats.not_ready_reads += 1
        if run.failures.book(t_mono, t_real, "measurements not ready after (re)initialisation"):
            run.last_kind = ""

    def _close_gap(self, ch: int, end_mono: int, end_real: int, why: str) -> None:
        run = self._runs[ch]
        closed = run.failures.close()
        if closed is None:
            return
        detail = gap_detail(end_mono, end_real, f"{why}; no valid data: {closed.counts_text()}")
        self._write_event(closed.start_mono_ns, closed.start_real_ns, ch, "gap", detail)
        run.consecutive_failures = 0
        run.retry_at_mono = None

    def _declare_unmetered(self, ch: ChannelLike) -> None:
        """Write a ``gap`` event for each interval the driver newly reports as not metered.

        The driver's ``energy_j`` leaves out the energy of a re-initialisation window (from
        its last good energy read to the restart of metering): the chip's counter was lost
        (reset, unplugged) or stopped (checksum error, stuck). The gap gives its exact ends,
        so a reader can subtract exactly that interval from a reference energy.
        """
        lost = _unmetered(ch.driver)
        seen = self._unmetered_seen.get(ch.index, 0)
        if len(lost) <= seen:
            return
        offset = self.clock.realtime_ns() - self.clock.monotonic_ns()
        for u in lost[seen:]:
            t0, t1 = int(u["t0_mono_ns"]), int(u["t1_mono_ns"])
            est = u.get("estimate_j")
            est_text = "unknown" if est is None else f"≈{est:.3f} J at the last power"
            reason = (
                f"{UNMETERED_GAP_REASON}: {u.get('reason', 'chip re-initialised')}; "
                f"{(t1 - t0) / 1e9:.3f} s ({est_text}) not in energy_j"
            )
            self._write_event(t0, t0 + offset, ch.index, "gap",
                              gap_detail(t1, t1 + offset, reason))
        self._unmetered_seen[ch.index] = len(lost)
        self._restart_check(ch.index)

    def _restart_check(self, index: int) -> None:
        """Start the channel's self-check afresh: across a gap or an unmetered interval the
        counter and the integral no longer cover the same time."""
        check = self._checks.get(index)
        if check is not None:
            self._checks[index] = ChainSelfCheck(check.cfg)
            if self.state is not None:
                self.state.record_chain(index, False, None)

    def _check_chain(self, index: int, sample: object, t_mono: int) -> None:
        """Feed an accepted reading to the channel's self-check; a new disagreement becomes a
        ``chain_disagreement`` event (budgeted like the others), the ratio a /metrics gauge."""
        check = self._checks.get(index)
        energy, power = _value(sample, "energy_j"), _value(sample, "power_w")
        if check is None or energy is None or power is None:
            return
        d = check.add(t_mono, float(energy), float(power), _value(sample, "voltage_v"),
                      _value(sample, "current_a"), _value(sample, "power_factor"))
        if d is not None:
            self.event(index, "chain_disagreement",
                       f"{d.kind}: {d.detail} (ratio {d.ratio:.2f})")
        if self.state is not None:
            self.state.record_chain(index, bool(check.active), check.ratio)

    # -- sweeping -----------------------------------------------------------------------------
    def _sweep(self, seq: int) -> list[tuple[object, ...]]:
        rows: list[tuple[object, ...]] = []
        clock = self.clock
        for ch in self.channels:
            run = self._runs[ch.index]
            if run.retry_at_mono is not None and clock.monotonic_ns() < run.retry_at_mono:
                self.stats.deferred_reads += 1
                continue
            t0m, t0r = clock.monotonic_ns(), clock.realtime_ns()
            self._reading, self._held = ch.index, []
            try:
                sample = ch.driver.read_sample()
            except BusError as exc:
                self._reading = None
                t1m, t1r = clock.monotonic_ns(), clock.realtime_ns()
                kind = fault_kind(exc)
                repeated = self._fault(
                    ch.index, kind, str(exc) or type(exc).__name__,
                    (t0m + t1m) // 2, (t0r + t1r) // 2, t0m,
                )
                self._release_held(ch.index, kind, repeated)
                self._declare_unmetered(ch)
                continue
            finally:
                self._reading = None
            t1m, t1r = clock.monotonic_ns(), clock.realtime_ns()
            # the driver's own time stamp (middle of its register reads), else ours
            t_mono = _time(sample, "t_mono_ns", (t0m + t1m) // 2)
            t_real = _time(sample, "t_real_ns", (t0r + t1r) // 2)
            run.consecutive_failures = 0
            self._release_held(ch.index, None, False)
            self._declare_unmetered(ch)
            if not getattr(sample, "ready", True):
                self._book_not_ready(ch.index, t_mono, t_real)
                continue
            if run.failures.failing:
                self._close_gap(ch.index, t_mono, t_real, "data resumed")
                self._restart_check(ch.index)
            run.last_good_mono = t_mono
            self._check_chain(ch.index, sample, t_mono)
            rows.append(
                (
                    seq,
                    ch.index,
                    t_mono,
                    t_real,
                    _value(sample, "power_w"),
                    _value(sample, "voltage_v"),
                    _value(sample, "current_a"),
                    _value(sample, "power_factor"),
                    _value(sample, "frequency_hz"),
                    _value(sample, "energy_j"),
                    _value(sample, "status"),
                )
            )
        return rows

    def _note_storage(self, dropped: int) -> None:
        """Count rows a full disk dropped, flag the episode once (metric), and stop with a
        clear error when the trace directory was removed under us (TraceLostError)."""
        self.stats.samples_dropped += dropped
        self._disk_full.check(self.writer, self.stats.faults,
                              None if self.state is None else self.state.record_fault)

    def _publish(self, rows: list[tuple[object, ...]]) -> None:
        if self.state is None and self.hub is None:
            return
        keys = ("seq", "channel", "t_mono_ns", "t_real_ns", "power_w", "voltage_v",
                "current_a", "power_factor", "frequency_hz", "energy_j", "status")
        for row in rows:
            msg = {"type": StreamKind.SAMPLE, **dict(zip(keys, row, strict=True))}
            index = row[1]
            msg["name"] = self._names[index] if isinstance(index, int) else "?"
            if self.state is not None:
                self.state.record_sample(msg)
            if self.hub is not None:
                self.hub.publish(msg)

    def _note_lateness(self, seq: int, lateness_ns: int, skipped: int, now_mono: int) -> None:
        late = lateness_ns > self.late_tolerance_ns
        if late:
            self.stats.late_sweeps += 1
            self._late_pending += 1
            self._late_max_ns = max(self._late_max_ns, lateness_ns)
        if skipped:
            self.stats.skipped_sweeps += skipped
            self._skipped_pending += skipped
        if (late or skipped) and (
            self._late_last_event_mono is None
            or now_mono - self._late_last_event_mono >= 1_000_000_000
        ):
            self._flush_late(now_mono)
        if self.state is not None:
            self.state.record_sweep(
                late=late, skipped=skipped, jitter=self.stats.lateness.as_dict(),
                sustainable_rate_hz=self.stats.sustainable_rate_hz,
            )

    def sustainable_rate_hz(self) -> float | None:
        """The sweep rate the bus kept up so far, as driven (1 / p90 sweep duration)."""
        return self.stats.sustainable_rate_hz

    def _flush_late(self, now_mono: int) -> None:
        if not (self._late_pending or self._skipped_pending):
            return
        now_real = self.clock.realtime_ns()
        if self._late_pending:
            detail = (
                f"{self._late_pending} sweep(s) late by up to {self._late_max_ns / 1e6:.3f} ms "
                f"(tolerance {self.late_tolerance_ns / 1e6:.3f} ms)"
            )
            self._write_event(now_mono, now_real, None, "late", detail)
        if self._skipped_pending:
            rate = self.sustainable_rate_hz()
            detail = (
                f"{self._skipped_pending} scheduled sweep(s) skipped (no rows: the previous "
                f"sweep overran its slot); the bus as driven sustains "
                + (f"{rate:.1f} sweeps/s" if rate else "an unknown rate")
                + f" against {1e9 / self.period_ns:g} asked"
            )
            self._write_event(now_mono, now_real, None, "skipped", detail)
        self._late_last_event_mono = now_mono
        self._late_pending = self._skipped_pending = 0
        self._late_max_ns = 0

    def run(
        self,
        duration_s: float | None = None,
        *,
        start_mono_ns: int | None = None,
        stats_callback: Callable[[SamplerStats], None] | None = None,
    ) -> SamplerStats:
        """Sample until ``duration_s`` has passed (None: until ``stop()``); returns the stats.

        The sweep at slot k is due at ``start + k·period``; with a duration D, the slots with
        deadlines in [start, start + D) are sampled.
        """
        clock = self.clock
        t0 = start_mono_ns if start_mono_ns is not None else clock.monotonic_ns()
        end = t0 + round(duration_s * 1e9) if duration_s is not None else None
        period = self.period_ns
        k = 0
        next_stats = t0 + self.stats_interval_ns
        while not self._stop.is_set():
            deadline = t0 + k * period
            if end is not None and deadline >= end:
                break
            self._wait_until(deadline)
            if self._stop.is_set():
                break
            began = clock.monotonic_ns()
            lateness = began - deadline
            if self.before_sweep is not None:
                self.before_sweep(began)
            self.stats.lateness.add(lateness)
            rows = self._sweep(k)
            written = self.writer.write_samples(rows)
            self.stats.samples_written += written
            self._note_storage(len(rows) - written)
            self._publish(rows)
            self.stats.sweeps += 1
            now = clock.monotonic_ns()
            self.stats.sweep_duration.add(now - began)
            # The next slot; if it is already over (its successor is due), skip to the
            # latest slot whose deadline has passed.
            nxt = k + 1
            due = (now - t0) // period
            skipped = 0
            if due > nxt:
                skipped = due - nxt
                nxt = due
            if end is not None:
                last_slot = (end - t0 - 1) // period
                skipped = max(0, min(skipped, last_slot - k))
            self._note_lateness(k, lateness, skipped, now)
            k = nxt
            checkpoint = self.checkpoint_requested.is_set()
            if checkpoint:
                self.checkpoint_requested.clear()
            if (now >= next_stats or checkpoint) and stats_callback is not None:
                stats_callback(self.stats)
                next_stats = now + self.stats_interval_ns
        self.finish()
        return self.stats

    def finish(self) -> None:
        """Close open gaps and pending late reports (called at the end of ``run``)."""
        now_mono, now_real = self.clock.monotonic_ns(), self.clock.realtime_ns()
        for ch in self.channels:
            self._close_gap(ch.index, now_mono, now_real, "sampler stopped while failing")
        self._flush_late(now_mono)
