"""Sampler: absolute-deadline schedule, late/skipped sweeps, faults as events and gaps."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from epi.formats.trace import read_trace
from meter.clock import SimulatedClock, SystemClock
from meter.daemon.live_stream import LiveHub
from meter.daemon.metrics import ChannelInfo, MeterState
from meter.daemon.sampler import Sampler
from meter.daemon.trace import TraceWriter
from meter.errors import BusError, ChipAbsentError, ChipResetError

MS = 1_000_000


@dataclass
class Reading:
    power_w: float
    voltage_v: float = 230.0
    current_a: float = 0.05
    power_factor: float = 0.9
    frequency_hz: float = 50.0
    energy_j: float = 0.0
    status: int = 0


class ScriptedDriver:
    """A driver whose reads take `read_ns` of simulated time and fail when `fail(n)` says so."""

    def __init__(
        self,
        clock: SimulatedClock,
        power_w: float,
        read_ns: int = MS,
        fail: Callable[[int], BaseException | None] | None = None,
        slow: Callable[[int], int] | None = None,
    ) -> None:
        self.clock, self.power_w, self.read_ns = clock, power_w, read_ns
        self.fail, self.slow = fail, slow
        self.n = 0
        self.energy_j = 0.0

    def read_sample(self) -> Reading:
        n = self.n
        self.n += 1
        self.clock.advance(self.slow(n) if self.slow else self.read_ns)
        exc = self.fail(n) if self.fail else None
        if exc is not None:
            raise exc
        self.energy_j += 0.01
        return Reading(power_w=self.power_w, energy_j=self.energy_j)


@dataclass
class Chan:
    index: int
    name: str
    driver: ScriptedDriver


def _run(tmp_path: Path, drivers: list[ScriptedDriver], clock: SimulatedClock, *,
         period_s: float, duration_s: float, **kw: object) -> tuple[Sampler, object]:
    chans = [Chan(i, f"ch{i}", d) for i, d in enumerate(drivers)]
    writer = TraceWriter(tmp_path, {"channels": []})
    sampler = Sampler(chans, clock, writer, period_s=period_s, **kw)  # type: ignore[arg-type]
    sampler.run(duration_s)
    writer.close()
    return sampler, read_trace(tmp_path)


def test_schedule_has_absolute_deadlines_and_no_drift(tmp_path: Path) -> None:
    clock = SimulatedClock()
    t0 = clock.monotonic_ns()
    drivers = [ScriptedDriver(clock, 5.0 + i, read_ns=1_300_000) for i in range(4)]
    sampler, trace = _run(tmp_path, drivers, clock, period_s=0.01, duration_s=60.0)
    rows = list(trace.samples())
    assert sampler.stats.sweeps == 6000 and len(rows) == 24_000
    assert sampler.stats.late_sweeps == 0 and sampler.stats.skipped_sweeps == 0
    # every reading sits exactly where the schedule puts it, after a minute as at the start
    for r in rows[:8] + rows[-8:]:
        k, c = r["seq"], r["channel"]
        assert r["t_mono_ns"] == t0 + k * 10 * MS + c * 1_300_000 + 650_000
    assert sampler.stats.lateness.max_ns == 0
    assert sampler.stats.sweep_duration.max_ns == 4 * 1_300_000
    assert [r["power_w"] for r in rows[:4]] == [5.0, 6.0, 7.0, 8.0]


def test_overrun_counts_late_and_skipped_sweeps(tmp_path: Path) -> None:
    clock = SimulatedClock()
    slow = {100: 25 * MS}
    drivers = [ScriptedDriver(clock, 5.0, slow=lambda n: slow.get(n, MS))]
    drivers += [ScriptedDriver(clock, 5.0) for _ in range(3)]
    sampler, trace = _run(tmp_path, drivers, clock, period_s=0.01, duration_s=2.0)
    # sweep 100 starts on time and ends 28 ms later: slot 101 can no longer be served and is
    # skipped, slot 102 runs 8 ms late (tolerance: a quarter period, 2.5 ms)
    assert sampler.stats.skipped_sweeps == 1 and sampler.stats.late_sweeps == 1
    assert sampler.stats.lateness.max_ns == 8 * MS
    seqs = sorted({r["seq"] for r in trace.samples()})
    assert 101 not in seqs and 102 in seqs and len(seqs) == 199
    # reported right away (the skip) and then, at most one event a second, the late sweep
    (skipped,) = [e["detail"] for e in trace.events() if e["kind"] == "skipped"]
    (late,) = [e["detail"] for e in trace.events() if e["kind"] == "late"]
    assert skipped.startswith("1 scheduled sweep(s) skipped") and "sustains" in skipped
    assert "1 sweep(s) late by up to 8.000 ms" in late
    d = sampler.stats.as_dict()
    lateness = d["schedule_lateness_ns"]
    assert lateness["max_ns"] == 8 * MS and lateness["count"] == 199


def test_faults_become_events_and_gaps_never_rows(tmp_path: Path) -> None:
    clock = SimulatedClock()
    t0 = clock.monotonic_ns()

    def bus(n: int) -> BaseException | None:
        return BusError("LastData mismatch on 0x4A") if 10 <= n < 12 else None

    def absent(n: int) -> BaseException | None:
        return ChipAbsentError("reads 0xFFFF") if 20 <= n < 23 else None

    def reset(n: int) -> BaseException | None:
        return ChipResetError("FuncEn back at 000C") if n == 30 else None

    drivers = [
        ScriptedDriver(clock, 4.0),
        ScriptedDriver(clock, 4.0, fail=bus),
        ScriptedDriver(clock, 4.0, fail=absent),
        ScriptedDriver(clock, 4.0, fail=reset),
    ]
    sampler, trace = _run(tmp_path, drivers, clock, period_s=0.1, duration_s=10.0,
                          absent_retry_s=1.0)
    rows = list(trace.samples())
    assert all(r["power_w"] == 4.0 for r in rows)  # no row for lack of data, never 0 W
    have = {(r["channel"], r["seq"]) for r in rows}
    assert not any((1, s) in have for s in (10, 11)) and (1, 12) in have
    assert (3, 30) not in have and (3, 31) in have
    events = list(trace.events())
    kinds = [(e["channel"], e["kind"]) for e in events]
    assert kinds.count((1, "bus_error")) == 1  # the first of the run; the rest are counted
    assert kinds.count((2, "absent")) == 1 and kinds.count((3, "chip_reset")) == 1
    gaps = {g.channel: g for g in trace.gaps if g.source == "event"}
    g1 = gaps[1]
    assert g1.start_mono_ns == t0 + 10 * 100 * MS + 1 * MS + MS // 2
    assert g1.end_mono_ns == t0 + 12 * 100 * MS + 1 * MS + MS // 2
    assert "bus_error ×2" in g1.reason and "data resumed" in g1.reason
    # the absent chip is retried once a second, not every sweep
    assert "absent ×3" in gaps[2].reason
    assert sampler.stats.deferred_reads == 3 * 9
    assert sampler.stats.faults == {"bus_error": 1, "absent": 1, "chip_reset": 1}
    assert sampler.stats.failed_reads == 2 + 3 + 1


def test_repeatedly_failing_channel_is_retried_once_a_second(tmp_path: Path) -> None:
    clock = SimulatedClock()
    drivers = [ScriptedDriver(clock, 4.0),
               ScriptedDriver(clock, 4.0, fail=lambda n: BusError("x") if n < 6 else None)]
    sampler, trace = _run(tmp_path, drivers, clock, period_s=0.1, duration_s=5.0)
    # reads 0, 1, 2 fail in sweeps 0..2; then one try a second: sweeps 12, 22, 32 fail,
    # sweep 42 delivers
    seqs = [r["seq"] for r in trace.samples() if r["channel"] == 1]
    assert seqs[0] == 42 and len([r for r in trace.samples() if r["channel"] == 0]) == 50
    assert sampler.stats.failed_reads == 6


def test_channel_failing_at_stop_gets_its_gap_closed(tmp_path: Path) -> None:
    clock = SimulatedClock()
    drivers = [ScriptedDriver(clock, 3.0, fail=lambda n: BusError("dead") if n >= 5 else None)]
    _, trace = _run(tmp_path, drivers, clock, period_s=0.1, duration_s=1.0)
    (gap,) = [g for g in trace.gaps if g.source == "event"]
    assert "sampler stopped while failing" in gap.reason and "bus_error ×3" in gap.reason
    assert gap.end_mono_ns is not None and gap.end_mono_ns > gap.start_mono_ns


def test_driver_events_are_written_and_rate_limited(tmp_path: Path) -> None:
    clock = SimulatedClock()
    driver = ScriptedDriver(clock, 3.0)
    writer = TraceWriter(tmp_path, {})
    state = MeterState([ChannelInfo(0, "ch0", None)], {})
    sampler = Sampler([Chan(0, "ch0", driver)], clock, writer, period_s=0.1, state=state)
    handler = sampler.driver_event_handler(0)
    for _ in range(12):
        handler("reinit", "calibration reloaded")
    clock.advance(1_500 * MS)
    handler("reinit", "calibration reloaded")
    handler("checksum_error", "CS1 mismatch")
    writer.close()
    events = list(read_trace(tmp_path).events())
    reinit = [e for e in events if e["kind"] == "reinit"]
    assert len(reinit) == 6 and "(+7 similar events not written)" in reinit[-1]["detail"]
    assert sampler.stats.suppressed_events == 7
    assert sampler.stats.faults == {"reinit": 13, "checksum_error": 1}
    assert state.snapshot()["channels"][0]["faults"] == {"reinit": 13, "checksum_error": 1}


def test_a_bug_is_not_swallowed_as_a_fault(tmp_path: Path) -> None:
    clock = SimulatedClock()
    drivers = [ScriptedDriver(clock, 3.0, fail=lambda n: ZeroDivisionError("bug"))]
    with pytest.raises(ZeroDivisionError):
        _run(tmp_path, drivers, clock, period_s=0.1, duration_s=1.0)


def test_live_state_and_stream_get_every_sample(tmp_path: Path) -> None:
    clock = SimulatedClock()
    drivers = [ScriptedDriver(clock, 7.5), ScriptedDriver(clock, 2.5)]
    state = MeterState([ChannelInfo(0, "ch0", None), ChannelInfo(1, "ch1", "n1")], {})
    hub = LiveHub()
    sub = hub.subscribe()
    _run(tmp_path, drivers, clock, period_s=0.05, duration_s=1.0, state=state, hub=hub)
    msgs = sub.get(0.1)
    assert sum(m.type == "sample" for m in msgs) == 40
    snap = state.snapshot()
    assert snap["sweeps_total"] == 20
    assert [c["last"]["power_w"] for c in snap["channels"]] == [7.5, 2.5]


def test_stop_ends_a_real_time_run_promptly(tmp_path: Path) -> None:
    clock = SystemClock()

    class Quick:
        def read_sample(self) -> Reading:
            return Reading(power_w=1.0)

    writer = TraceWriter(tmp_path, {})
    sampler = Sampler([Chan(0, "ch0", Quick())], clock, writer, period_s=2.0)  # type: ignore[arg-type]
    threading.Timer(0.3, sampler.stop).start()
    t = time.monotonic()
    stats = sampler.run(None)
    writer.close()
    assert time.monotonic() - t < 1.5  # the 2 s wait between sweeps is interruptible
    assert stats.sweeps == 1


def test_sustainable_rate_measured_as_it_runs_is_in_stats_and_metrics(tmp_path: Path) -> None:
    """Three channels whose reads take 2 ms each: every sweep lasts 6 ms, so the bus as driven
    sustains 1 / 6 ms = 166.67 sweeps/s; stats, meta and /metrics all say so."""
    from prometheus_client.parser import text_string_to_metric_families

    from meter.daemon.metrics import render_prometheus

    clock = SimulatedClock()
    drivers = [ScriptedDriver(clock, 4.0, read_ns=2 * MS) for _ in range(3)]
    state = MeterState([ChannelInfo(i, f"ch{i}", None) for i in range(3)], {})
    before = render_prometheus(state, 0, 0)
    assert "\nepi_meter_sustainable_rate_hertz " not in before  # unknown: absent, never 0
    sampler, _ = _run(tmp_path, drivers, clock, period_s=0.01, duration_s=1.0, state=state)
    expected = 1e9 / (3 * 2 * MS)
    assert sampler.stats.as_dict()["sustainable_rate_hz"] == pytest.approx(expected, rel=1e-12)
    fams = {f.name: f for f in text_string_to_metric_families(render_prometheus(state, 0, 0))}
    (sample,) = fams["epi_meter_sustainable_rate_hertz"].samples
    assert sample.value == pytest.approx(expected, rel=1e-12)
    assert state.snapshot()["sustainable_rate_hz"] == pytest.approx(expected, rel=1e-12)


def test_sustainable_rate_follows_a_bus_that_slows_down(tmp_path: Path) -> None:
    """Sweeps of 2 ms, then (from the 20th read on) of 8 ms for most of the run: the rate
    measured as it runs drops from 500/s to the slow sweeps' 125/s."""
    clock = SimulatedClock()
    drivers = [ScriptedDriver(clock, 4.0, slow=lambda n: 2 * MS if n < 20 else 8 * MS)]
    sampler, _ = _run(tmp_path, drivers, clock, period_s=0.01, duration_s=2.0)
    # 200 sweeps, 180 of them slow: the 90th percentile is a slow sweep
    assert sampler.stats.sustainable_rate_hz == pytest.approx(1e9 / (8 * MS), rel=1e-12)


def test_unmetered_intervals_of_a_driver_become_gaps_with_exact_ends(tmp_path: Path) -> None:
    """A driver that reports (as ATM90E26Driver.unmetered does) an interval its energy count
    leaves out gets one channel gap with exactly those ends, marked as energy not metered."""
    from meter.daemon.trace import UNMETERED_GAP_REASON

    clock = SimulatedClock()

    class Losing(ScriptedDriver):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, **kw)  # type: ignore[arg-type]
            self.unmetered: list[dict] = [
                {"t0_mono_ns": 1, "t1_mono_ns": 2, "reason": "before the run"}
            ]

        def read_sample(self) -> Reading:
            if self.n == 7:
                t = self.clock.monotonic_ns()
                self.unmetered.append({"t0_mono_ns": t - 30 * MS, "t1_mono_ns": t + MS,
                                       "reason": "chip reset", "estimate_j": 0.124})
            return super().read_sample()

    drivers = [Losing(clock, 4.0), ScriptedDriver(clock, 4.0)]
    _, trace = _run(tmp_path, drivers, clock, period_s=0.1, duration_s=1.0)
    want = drivers[0].unmetered[1]
    gaps = [g for g in trace.gaps if g.reason.startswith(UNMETERED_GAP_REASON)]
    assert [(g.channel, g.start_mono_ns, g.end_mono_ns) for g in gaps] == [
        (0, want["t0_mono_ns"], want["t1_mono_ns"])
    ]
    assert "chip reset" in gaps[0].reason and "0.031 s" in gaps[0].reason
    # the rows themselves are untouched: this is about energy, not missing readings
    assert len([r for r in trace.samples() if r["channel"] == 0]) == 10
