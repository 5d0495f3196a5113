"""The meter daemon: open the board (or its emulation), sample it into a trace, serve it.

`MeterDaemon(options).run()` does, in order:

1. takes the trace directory's lock (before touching any chip: a second daemon on the same
   directory is refused without disturbing the first one's board);
2. loads the board file (or builds the emulated board) and opens every enabled channel —
   a real board whose chips do not answer refuses to start;
3. chooses the sample rate: ``--rate``, else the board file's ``sampling.period_s``, else
   a round rate below 45 % of what the bus sustains for all channels (20 Hz for four chips
   at 160 kHz; at least 10 Hz where the bus allows);
   a rate above the bus limit is refused;
4. starts the HTTP server (clock sync, live stream, /metrics) if asked;
5. writes a new trace segment (meta.json first), a ``gap`` event when it continues after an
   earlier segment, a ``start`` event, then samples until the duration ends or ``stop()``;
6. writes a ``stop`` event and the final statistics (``stats.clean_stop = true``).

Imports nothing from host/: the meter side runs on a Pi with the standard library.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epi import __version__
from epi.core.errors import UserError
from epi.core.files import read_boot_id
from meter.board import BoardConfig, Channel, emulated_board, load_board, open_channels
from meter.clock import SystemClock
from meter.daemon.http_server import MeterServer, parse_listen
from meter.daemon.live_stream import LiveHub
from meter.daemon.metrics import ChannelInfo, MeterState
from meter.daemon.sampler import Sampler, SamplerStats
from meter.daemon.trace import TraceLock, TraceWriter, gap_detail
from meter.emulation.faults import FaultInjector, parse_fault_specs

MIN_DEFAULT_RATE_HZ = 10.0
BUS_MARGIN = 0.45  # the default rate leaves more than half of the bus time free
NICE_RATES_HZ = (100.0, 50.0, 40.0, 25.0, 20.0, 10.0)
SCHEDULE_LEAD_NS = 100_000_000  # first sweep 100 ms after the segment starts
UART_BITS_PER_TRANSACTION = 60  # 6 bytes of 10 bits (start, 8 data, stop) per register access

_frames_cache: dict[bool, int] = {}
_simulated_ids: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def clock_boot_id(clock: Any) -> str | None:
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
    """Bus transactions one ``read_sample()`` of the driver takes, counted on an emulated chip.

    Counted rather than hard-coded so that the rate limit follows the driver as it changes.
    """
    if n_line not in _frames_cache:
        from meter.chip.calibration import Calibration
        from meter.clock import SimulatedClock
        from meter.driver.atm90e26 import ATM90E26Driver
        from meter.emulation.chip_emulator import EmulatedChip
        from meter.emulation.emulated_bus import EmulatedSpiBus
        from meter.emulation.power_models import ConstantPower

        clock = SimulatedClock()
        chip = EmulatedChip(ConstantPower(10.0), clock, n_line=n_line)
        bus = EmulatedSpiBus(chip)
        cal = Calibration.default(chip.meter_constant_imp_per_kwh)
        driver = ATM90E26Driver(bus, cal, clock=clock, n_line=n_line)
        driver.start()
        clock.advance(1_000_000_000)
        driver.read_sample()
        before = bus.frames
        clock.advance(1_000_000_000)
        driver.read_sample()
        _frames_cache[n_line] = bus.frames - before
    return _frames_cache[n_line]


@dataclass
class BusBudget:
    """How long one sweep over the channels keeps the bus busy, at best."""

    frames_per_read: dict[str, int]
    sweep_time_s: float

    @property
    def max_rate_hz(self) -> float:
        return 1.0 / self.sweep_time_s

    def describe(self) -> dict[str, Any]:
        return {
            "frames_per_read": dict(self.frames_per_read),
            "sweep_time_s": self.sweep_time_s,
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


def _explicit_period(board: BoardConfig) -> float | None:
    """The board file's ``sampling.period_s`` if the file sets it (else the rate is ours)."""
    if board.path is None:
        return None
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        return board.sample_period_s
    try:
        data = tomllib.loads(Path(board.path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    sampling = data.get("sampling")
    if isinstance(sampling, dict) and "period_s" in sampling:
        return board.sample_period_s
    return None


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
    clock: Any = None  # SystemClock unless a test or benchmark gives a SimulatedClock
    power_model: Any = None  # override the emulated channels' models (one, or one each)
    late_tolerance_s: float | None = None
    retry_interval_s: float = 1.0
    stats_interval_s: float = 5.0
    model_bus_timing: bool = True
    extra_meta: dict[str, Any] = field(default_factory=dict)
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
        self.clock = options.clock if options.clock is not None else SystemClock()
        self._stop = threading.Event()
        self.sampler: Sampler | None = None
        self.server: MeterServer | None = None
        self.ready = threading.Event()  # set once sampling has begun (for tests)

    def stop(self) -> None:
        self._stop.set()
        if self.sampler is not None:
            self.sampler.stop()

    # -- set-up -------------------------------------------------------------------------------
    def _board(self) -> BoardConfig:
        o = self.options
        if o.board_path is not None:
            return load_board(o.board_path)
        if not o.emulate:
            raise UserError("epi meter run: give --board FILE, or --emulate for the emulator")
        return emulated_board(o.n_emulated_channels, clock=self.clock)

    def _rate(self, board: BoardConfig, budget: BusBudget) -> float:
        o = self.options
        where = (
            "--rate"
            if o.rate_hz is not None
            else f"{board.path}: sampling.period_s"
            if _explicit_period(board) is not None
            else None
        )
        if o.rate_hz is not None:
            rate = o.rate_hz
        elif where is not None:
            rate = 1.0 / board.sample_period_s
        else:
            return default_rate_hz(budget.max_rate_hz)
        if not rate > 0:
            raise UserError(f"{where}: the rate must be > 0")
        if rate > budget.max_rate_hz:
            n = len(budget.frames_per_read)
            raise UserError(
                f"{where}: {rate:g} Hz is more than the bus sustains for {n} channel(s) "
                f"({budget.max_rate_hz:.1f} Hz: {max(budget.frames_per_read.values())} "
                f"transactions per reading at {board.speed_hz} Hz SPI)"
            )
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
        models = [getattr(ch.emulator, "model", None) for ch in channels]
        if not emulated:
            power_model = None
        elif all(m is models[0] for m in models):
            power_model = models[0].describe()  # type: ignore[union-attr]
        else:
            power_model = {
                "kind": "per_channel",
                "modelled": True,
                "channels": {str(ch.index): m.describe() for ch, m in zip(channels, models,
                                                                          strict=True)},
            }
        clock_info = self.clock.describe() if hasattr(self.clock, "describe") else {}
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
            "stats": {"clean_stop": False},
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
        try:
            sampler_ref: list[Sampler] = []

            def on_event(index: int, kind: str, detail: str) -> None:
                if sampler_ref:
                    sampler_ref[0].driver_event(index, kind, detail)

            channels = open_channels(
                board,
                emulate=o.emulate or board.emulated,
                clock=clock,
                power_model=o.power_model,
                on_event=on_event,
                model_bus_timing=o.model_bus_timing,
            )
            budget = bus_budget(board, channels)
            rate = self._rate(board, budget)
            period_s = 1.0 / rate
            emulated = any(ch.emulator is not None for ch in channels)
            state = MeterState(
                [ChannelInfo(ch.index, ch.name, ch.node) for ch in channels], {}
            )
            started = (clock.monotonic_ns(), clock.realtime_ns())
            sched0 = started[0] + SCHEDULE_LEAD_NS
            injector = FaultInjector(specs, channels, sched0) if specs else None
            hub = LiveHub()
            url = None
            if listen is not None:
                self.server = MeterServer(listen[0], listen[1], state=state, hub=hub, clock=clock)
                url = self.server.url
            meta = self._meta(board, channels, period_s, url, injector, budget, sched0, started)
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
            self.log(
                f"epi meter: sampling {len(channels)} {kind} channel(s) at {rate:g} Hz "
                f"(bus limit {budget.max_rate_hz:.1f} Hz) into {o.out_dir} segment {writer.segment}"
                + (f"; serving {url}" if url else "")
            )
            self.ready.set()

            def save_stats(stats: SamplerStats) -> None:
                assert writer is not None
                writer.update_meta(stats=self._stats_dict(stats, clean=False))

            stats = sampler.run(o.duration_s, start_mono_ns=sched0, stats_callback=save_stats)
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
            if writer is not None and self.sampler is not None:
                # a crash: keep what the statistics say, flagged as not a clean stop
                writer.close(stats=self._stats_dict(self.sampler.stats, clean=False))
            elif writer is not None:
                writer.close()
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
