"""The meter daemon: open the board (or its emulation), sample it into a trace, serve it.

`MeterDaemon(options).run()` does, in order:

1. takes the trace directory's lock (before touching any chip: a second daemon on the same
   directory is refused without disturbing the first one's board);
2. loads the board file (or builds the emulated board) and opens every enabled channel —
   a real board whose chips do not answer refuses to start;
3. measures the bus as driven (five back-to-back sweeps: system calls, chip-selects and
   wake-ups included) and chooses the sample rate: ``--rate``, else the board file's
   ``sampling.period_s``, else a round rate below 45 % of the wire limit (20 Hz for four
   chips at 160 kHz; at least 10 Hz where the bus allows), lowered to 90 % of the measured
   rate where that is less. An asked rate above the wire limit is refused; one above the
   measured rate is lowered to it, with one line in the log and ``rate_note`` in meta.json;
4. starts the HTTP server (clock sync, live stream, /metrics) if asked;
5. writes a new trace segment (meta.json first), a ``gap`` event when it continues after an
   earlier segment, a ``start`` event, then samples until the duration ends or ``stop()``;
6. writes a ``stop`` event and the final statistics (``stats.clean_stop = true``).

Imports nothing from host/: the meter side runs on a Pi with the standard library.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import threading
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epi import __version__
from epi.core.errors import UserError
from epi.core.files import read_boot_id
from meter.board import BoardConfig, Channel, emulated_board, load_board, open_channels
from meter.chip_factory import chip_factory
from meter.clock import Clock, SystemClock, describe_clock
from meter.daemon.http_server import MeterServer, parse_listen
from meter.daemon.live_stream import LiveHub
from meter.daemon.metrics import ChannelInfo, MeterState
from meter.daemon.sampler import Sampler, SamplerStats
from meter.daemon.trace import TraceLock, TraceWriter, gap_detail
from meter.driver.atm90e26 import ATM90E26Driver
from meter.emulation.faults import FaultInjector, parse_fault_specs
from meter.errors import BusError

if TYPE_CHECKING:
    from meter.sources.recorder import SourceRecorder

MIN_DEFAULT_RATE_HZ = 10.0
BUS_MARGIN = 0.45  # the default rate leaves more than half of the bus time free
NICE_RATES_HZ = (100.0, 50.0, 40.0, 25.0, 20.0, 10.0)
SCHEDULE_LEAD_NS = 100_000_000  # first sweep 100 ms after the segment starts
UART_BITS_PER_TRANSACTION = 60  # 6 bytes of 10 bits (start, 8 data, stop) per register access

_simulated_ids: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def clock_boot_id(clock: Clock) -> str | None:
    """The ``boot_id`` of a trace written with this clock.

    The machine's boot id says "this CLOCK_MONOTONIC"; a simulated clock is not that clock,
    so it gets an id of its own (the same for every run that shares the clock object).
    """
    if not getattr(clock, "simulated", False):
        return read_boot_id()
    try:
        if clock not in _simulated_ids:
            _simulated_ids[clock] = f"simulated:{uuid.uuid4()}"
        return _simulated_ids[clock]
    except TypeError:  # not weak-referenceable: one id per call
        return f"simulated:{uuid.uuid4()}"


def frames_per_read(n_line: bool = False) -> int:
    """Bus transactions one clean ``read_sample()`` of the driver takes (its own count; a test
    checks it against an emulated chip's frame counter)."""
    return ATM90E26Driver.frames_per_clean_read(n_line)


def measure_sweep_s(channels: Sequence[Channel], clock: Clock, sweeps: int = 5) -> float:
    """Median time of back-to-back sweeps over the channels, read through the bus as the
    daemon drives it (system-call, chip-select and wake-up latency included). Failed reads
    count with the time they took; the energy they meter is kept by the drivers."""
    times = []
    for _ in range(sweeps):
        t0 = clock.monotonic_ns()
        for ch in channels:
            with contextlib.suppress(BusError):
                ch.driver.read_sample()
        times.append(clock.monotonic_ns() - t0)
    times.sort()
    return times[len(times) // 2] / 1e9


@dataclass
class BusBudget:
    """How long one sweep over the channels keeps the bus busy, at best."""

    frames_per_read: dict[str, int]
    sweep_time_s: float  # wire time alone
    measured_sweep_s: float | None = None  # as driven, measured at start

    @property
    def wire_rate_hz(self) -> float:
        return 1.0 / self.sweep_time_s

    @property
    def max_rate_hz(self) -> float:
        """What the bus sustains as driven: the slower of the wire and the measurement."""
        return 1.0 / max(self.sweep_time_s, self.measured_sweep_s or 0.0)

    def describe(self) -> dict[str, Any]:
        return {
            "frames_per_read": dict(self.frames_per_read),
            "sweep_time_s": self.sweep_time_s,
            "wire_rate_hz": self.wire_rate_hz,
            "measured_sweep_s": self.measured_sweep_s,
            "max_rate_hz": self.max_rate_hz,
        }


def bus_budget(board: BoardConfig, channels: Sequence[Channel]) -> BusBudget:
    """Wire time of one sweep: SPI frames of 24 bits at the board's speed, UART bytes."""
    total = 0.0
    frames: dict[str, int] = {}
    for ch in channels:
        n = frames_per_read(ch.config.n_line)
        frames[ch.name] = n
        if ch.config.uart_port is not None and ch.emulator is None:
            total += n * UART_BITS_PER_TRANSACTION / ch.config.uart_baudrate
        else:
            total += n * 24 / board.speed_hz
    return BusBudget(frames, total)


def _round_down(rate_hz: float) -> float:
    """A rate at or below `rate_hz` with two significant digits (27.46 → 27)."""
    if rate_hz <= 0:
        return rate_hz
    digits = 1 - math.floor(math.log10(rate_hz))
    factor = 10.0**digits
    return math.floor(rate_hz * factor) / factor


def default_rate_hz(max_rate_hz: float) -> float:
    """The largest round rate within BUS_MARGIN of the bus limit; at least 10 Hz where the bus
    allows it (real transfers add system-call and chip-select time to the wire time)."""
    budget = BUS_MARGIN * max_rate_hz
    for rate in NICE_RATES_HZ:
        if rate <= budget:
            return rate
    if max_rate_hz >= MIN_DEFAULT_RATE_HZ:
        return MIN_DEFAULT_RATE_HZ
    return budget  # a slow bus (UART): below 10 Hz is all it can do


@dataclass
class DaemonOptions:
    """What `epi meter run` was asked to do."""

    out_dir: Path
    board_path: Path | None = None
    emulate: bool = False
    rate_hz: float | None = None
    duration_s: float | None = None
    listen: str | None = "127.0.0.1:8757"  # None: no HTTP server
    faults: Sequence[str] = ()
    n_emulated_channels: int = 4
    clock: Clock | None = None  # SystemClock unless a test or benchmark gives a SimulatedClock
    power_model: Any = None  # override the emulated channels' models (one, or one each)
    late_tolerance_s: float | None = None
    retry_interval_s: float = 1.0
    stats_interval_s: float = 5.0
    model_bus_timing: bool = True
    extra_meta: dict[str, Any] = field(default_factory=dict)
    sources: Sequence[Any] = ()  # opened meter.sources PowerSources, recorded beside the board
    source_node: str | None = None  # node of the software channels (default: hostname)
    emulate_bridge: bool = False  # issue 14: the board's MCU firmware emulated, over a pty


@dataclass
class RunResult:
    """What a finished run reports."""

    trace_dir: Path
    segment: int
    stats: SamplerStats
    url: str | None
    rate_hz: float


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class MeterDaemon:
    """One daemon run. ``stop()`` (from a signal handler or another thread) ends it cleanly."""

    def __init__(self, options: DaemonOptions, log: Callable[[str], None] = _stderr) -> None:
        self.options = options
        self.log = log
        self.clock: Clock = options.clock if options.clock is not None else SystemClock()
        self._stop = threading.Event()
        self.sampler: Sampler | None = None
        self.server: MeterServer | None = None
        self.ready = threading.Event()  # set once sampling has begun (for tests)
        self.rate_note: str | None = None  # why the asked rate was lowered, if it was
        self.channels: list[Channel] = []  # the opened channels (kept after the run: tests)
        self.injector: FaultInjector | None = None  # its `applied` log: when each fault acted

    def stop(self) -> None:
        self._stop.set()
        if self.sampler is not None:
            self.sampler.stop()

    def checkpoint(self) -> None:
        """SIGHUP: write a ``signal`` event and the statistics now; keep sampling."""
        if self.sampler is not None:
            self.sampler.request_checkpoint()

    # -- set-up -------------------------------------------------------------------------------
    def _board(self) -> BoardConfig:
        o = self.options
        if o.board_path is not None:
            return load_board(o.board_path)
        if not o.emulate:
            raise UserError("epi meter run: give --board FILE, or --emulate for the emulator")
        return emulated_board(o.n_emulated_channels, clock=self.clock)

    def _rate(self, board: BoardConfig, budget: BusBudget) -> float:
        """The sweep rate: asked (``--rate``, the board's ``sampling.period_s``) or chosen.

        Above the wire limit is refused; above what the bus sustains as driven (measured at
        start) is lowered to that, with one line in the log (and ``rate`` in meta.json).
        """
        o = self.options
        where = (
            "--rate"
            if o.rate_hz is not None
            else f"{board.path}: sampling.period_s"
            if board.period_explicit
            else None
        )
        if o.rate_hz is not None:
            rate = o.rate_hz
        elif where is not None:
            rate = 1.0 / board.sample_period_s
        else:  # our choice: the wire's default, unless the bus as driven cannot keep it
            rate = default_rate_hz(budget.wire_rate_hz)
            kept = 0.9 * budget.max_rate_hz
            return rate if rate <= kept else _round_down(kept)
        if not rate > 0 or not math.isfinite(rate):
            raise UserError(f"{where}: the rate must be a finite number > 0")
        n = len(budget.frames_per_read)
        if rate > budget.wire_rate_hz:
            raise UserError(
                f"{where}: {rate:g} Hz is more than the bus sustains for {n} channel(s) "
                f"({budget.wire_rate_hz:.1f} Hz: {max(budget.frames_per_read.values())} "
                f"transactions per reading at {board.speed_hz} Hz SPI)"
            )
        if rate > budget.max_rate_hz:
            lowered = _round_down(budget.max_rate_hz)
            self.rate_note = (
                f"{where}: {rate:g} Hz lowered to {lowered:g} Hz: the bus as driven sustains "
                f"{budget.max_rate_hz:.1f} sweeps/s for {n} channel(s) (measured "
                f"{(budget.measured_sweep_s or 0) * 1e3:.2f} ms per sweep at start; the wire "
                f"alone {budget.sweep_time_s * 1e3:.2f} ms)"
            )
            self.log(f"epi meter: {self.rate_note}")
            return lowered
        return float(rate)

    def _meta(
        self,
        board: BoardConfig,
        channels: Sequence[Channel],
        period_s: float,
        url: str | None,
        injector: FaultInjector | None,
        budget: BusBudget,
        sched0: int,
        started: tuple[int, int],
    ) -> dict[str, Any]:
        emulated = any(ch.emulator is not None for ch in channels)
        models = [ch.emulator.model for ch in channels if ch.emulator is not None]
        power_model: dict[str, Any] | None
        if not models:
            power_model = None
        elif all(m is models[0] for m in models):
            power_model = models[0].describe()
        else:
            power_model = {
                "kind": "per_channel",
                "modelled": True,
                "channels": {str(ch.index): ch.emulator.model.describe() for ch in channels
                             if ch.emulator is not None},
            }
        clock_info = describe_clock(self.clock)
        return {
            "daemon_version": __version__,
            "host": socket.gethostname(),
            "boot_id": clock_boot_id(self.clock),
            "pid": os.getpid(),
            "started_mono_ns": started[0],
            "started_real_ns": started[1],
            "emulated": emulated,
            "power_model": power_model,
            "sample_period_s": period_s,
            "channels": [ch.describe() for ch in channels],
            "board": board.describe(),
            "clock": clock_info,
            "listen": url,
            "fault_injection": injector.describe() if injector else None,
            "sampler": {
                "schedule_start_mono_ns": sched0,
                "late_tolerance_ns": round(
                    (self.options.late_tolerance_s or period_s / 4) * 1e9
                ),
                "retry_interval_s": self.options.retry_interval_s,
            },
            "bus": budget.describe(),
            "rate_note": self.rate_note,
            # the full stats block from the start: a segment killed before its first stats
            # rewrite still says what it is (zero counts, not a clean stop)
            "stats": self._stats_dict(SamplerStats(), clean=False),
            **self.options.extra_meta,
        }

    # -- run ----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        from meter.bridge.daemon import is_bridge_run, run_bridge  # issue 14: MCU bridge

        if is_bridge_run(self.options):
            return run_bridge(self)  # type: ignore[no-any-return]
        o = self.options
        clock = self.clock
        listen = parse_listen(o.listen) if o.listen else None
        specs = parse_fault_specs(o.faults)
        if specs and o.board_path is not None and not o.emulate:
            raise UserError("--fault-injection: faults are injected into emulated chips only "
                            "(add --emulate)")
        if o.duration_s is not None and not o.duration_s > 0:
            raise UserError(f"--duration {o.duration_s:g}: must be > 0 seconds")
        board = self._board()
        lock = TraceLock(o.out_dir)
        channels: list[Channel] = []
        writer: TraceWriter | None = None
        recorder = None
        try:
            sampler_ref: list[Sampler] = []

            def on_event(index: int, kind: str, detail: str) -> None:
                if sampler_ref:
                    sampler_ref[0].driver_event(index, kind, detail)

            chips = chip_factory(
                "emulated" if o.emulate or board.emulated else None,
                power_model=o.power_model,
                model_bus_timing=o.model_bus_timing,
            )
            channels = open_channels(board, chips, clock=clock, on_event=on_event)
            self.channels = channels
            budget = bus_budget(board, channels)
            budget.measured_sweep_s = measure_sweep_s(channels, clock)
            rate = self._rate(board, budget)
            period_s = 1.0 / rate
            emulated = any(ch.emulator is not None for ch in channels)
            state = MeterState(
                [ChannelInfo(ch.index, ch.name, ch.node) for ch in channels], {}
            )
            started = (clock.monotonic_ns(), clock.realtime_ns())
            sched0 = started[0] + SCHEDULE_LEAD_NS
            injector = FaultInjector(specs, channels, sched0) if specs else None
            self.injector = injector
            hub = LiveHub()
            url = None
            if listen is not None:
                self.server = MeterServer(listen[0], listen[1], state=state, hub=hub, clock=clock)
                url = self.server.url
            meta = self._meta(board, channels, period_s, url, injector, budget, sched0, started)
            recorder = _source_recorder(o, channels, clock)  # software sources: issue 17
            if recorder is not None:
                meta["channels"] += recorder.channel_meta()
            writer = TraceWriter(o.out_dir, meta, lock=lock)
            state.info.update(
                {
                    "daemon_version": __version__,
                    "host": meta["host"],
                    "boot_id": meta["boot_id"],
                    "emulated": emulated,
                    "power_model_kind": (meta["power_model"] or {}).get("kind"),
                    "clock_kind": meta["clock"].get("kind", "system"),
                    "segment": writer.segment,
                    "sample_period_s": period_s,
                    "started_real_ns": started[1],
                    "trace_dir": str(Path(o.out_dir).resolve()),
                }
            )
            sampler = Sampler(
                channels,
                clock,
                writer,
                period_s=period_s,
                state=state,
                hub=hub,
                late_tolerance_s=o.late_tolerance_s,
                absent_retry_s=o.retry_interval_s,
                stats_interval_s=o.stats_interval_s,
                before_sweep=injector,
            )
            self.sampler = sampler
            sampler_ref.append(sampler)
            if self._stop.is_set():
                sampler.stop()
            self._write_restart_gap(writer, started)
            kind = "emulated" if emulated else "real"
            writer.write_event(
                started[0], started[1], None, "start",
                f"epi meter {__version__}: {len(channels)} {kind} channel(s) at {rate:g} Hz; "
                f"segment {writer.segment}" + (f"; faults {len(specs)} scheduled" if specs else ""),
            )
            if self.server is not None:
                self.server.start()
            if recorder is not None:
                recorder.start(writer)
                self.log(f"epi meter: software sources on their own threads: "
                         f"{recorder.summary()}")
            self.log(
                f"epi meter: sampling {len(channels)} {kind} channel(s) at {rate:g} Hz "
                f"(bus limit {budget.max_rate_hz:.1f} Hz) into {o.out_dir} segment {writer.segment}"
                + (f"; serving {url}" if url else "")
            )
            self.ready.set()

            def save_stats(stats: SamplerStats) -> None:
                assert writer is not None
                if sampler.checkpoint_requested.is_set():
                    sampler.checkpoint_requested.clear()
                    t = (clock.monotonic_ns(), clock.realtime_ns())
                    writer.write_event(t[0], t[1], None, "signal",
                                       "SIGHUP: statistics checkpointed into meta.json; "
                                       "sampling goes on")
                    self.log(f"epi meter: SIGHUP: statistics checkpointed ({stats.sweeps} "
                             f"sweeps, {stats.samples_written} samples)")
                writer.update_meta(stats=self._stats_dict(stats, clean=False),
                                   **(recorder.meta_updates(writer) if recorder else {}))

            stats = sampler.run(o.duration_s, start_mono_ns=sched0, stats_callback=save_stats)
            if recorder is not None:
                recorder.finish(writer)
                recorder = None
            now = (clock.monotonic_ns(), clock.realtime_ns())
            writer.write_event(
                now[0], now[1], None, "stop",
                f"clean stop: {stats.sweeps} sweeps, {stats.samples_written} samples, "
                f"{stats.late_sweeps} late, {stats.skipped_sweeps} skipped, "
                f"{stats.failed_reads} failed reads",
            )
            final = self._stats_dict(stats, clean=True)
            final["ended_mono_ns"], final["ended_real_ns"] = now
            writer.close(stats=final)
            self.log(
                f"epi meter: stopped: {stats.sweeps} sweeps, {stats.samples_written} samples, "
                f"{stats.late_sweeps} late, {stats.skipped_sweeps} skipped, "
                f"{stats.failed_reads} failed reads"
            )
            return RunResult(Path(o.out_dir), writer.segment, stats, url, rate)
        except BaseException:
            if recorder is not None:
                recorder.stop()
            # a crash, or a trace directory removed under us: keep what the statistics say,
            # flagged as not a clean stop, where the files can still be written
            with contextlib.suppress(OSError):
                if writer is not None and self.sampler is not None:
                    writer.close(stats=self._stats_dict(self.sampler.stats, clean=False))
                elif writer is not None:
                    writer.close()
            if writer is None:
                lock.remove_if_unused()  # a failed start leaves no empty trace directory
            raise
        finally:
            if self.server is not None:
                self.server.stop()
            for ch in channels:
                ch.close()
            lock.release()

    def _stats_dict(self, stats: SamplerStats, *, clean: bool) -> dict[str, Any]:
        return {
            "clean_stop": clean,
            "updated_mono_ns": self.clock.monotonic_ns(),
            **stats.as_dict(),
        }

    def _write_restart_gap(self, writer: TraceWriter, started: tuple[int, int]) -> None:
        prev = writer.previous
        if prev is None:
            return
        how = "cleanly" if prev.clean_stop else "without a clean stop (crash, kill or power loss)"
        if prev.boot_id is not None and prev.boot_id == writer.meta.get("boot_id"):
            writer.write_event(
                prev.t_mono_ns, prev.t_real_ns, None, "gap",
                gap_detail(started[0], started[1],
                           f"daemon restart: segment {prev.segment} ended {how}"),
            )
        else:
            writer.write_event(
                started[0], started[1], None, "gap",
                gap_detail(
                    started[0], started[1],
                    f"daemon restart after a reboot: segment {prev.segment} ended {how}, its "
                    f"last sample at t_real_ns={prev.t_real_ns} (monotonic clocks differ)",
                ),
            )


def _source_recorder(o: DaemonOptions, channels: Sequence[Channel], clock: Clock
                     ) -> SourceRecorder | None:
    """A SourceRecorder for the software sources, numbered after the board's channels."""
    if not o.sources:
        return None
    from meter.sources.recorder import SourceRecorder

    first = max((ch.index for ch in channels), default=-1) + 1
    rec = SourceRecorder(o.sources, first, clock, o.source_node or socket.gethostname())
    return rec if rec.n_channels else None
