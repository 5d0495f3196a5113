"""The meter daemon: open the board (or its emulation), sample it into a trace, serve it.

`MeterDaemon(options).run()` chooses what feeds the recording: the board's chips over SPI/UART
(this module), the board's MCU (`bus = "bridge"` or `--emulate-bridge`: meter/bridge/daemon.py),
plus software power counters beside either (meter/sources/recorder.py). Below all of them, one
`RecordingSession` (meter/recording/session.py) holds the lock, meta.json, the trace writer,
restart gaps, the boot id, the HTTP state, checkpoints and statistics.

For the chips, in order:

1. the trace directory's lock is taken (before touching any chip: a second daemon on the same
   directory is refused without disturbing the first one's board);
2. every enabled channel of the board file (or the emulated board) is opened — a real board
   whose chips do not answer refuses to start;
3. the bus is measured as driven (five back-to-back sweeps: system calls, chip-selects and
   wake-ups included) and the sample rate chosen: ``--rate``, else the board file's
   ``sampling.period_s``, else a round rate below 45 % of the wire limit (20 Hz for four
   chips at 160 kHz; at least 10 Hz where the bus allows), lowered to 90 % of the measured
   rate where that is less. An asked rate above the wire limit is refused; one above the
   measured rate is lowered to it, with one line in the log and ``rate_note`` in meta.json;
4. the segment begins (meta.json, a restart ``gap``, ``start``), the HTTP server starts if
   asked, and the sampler runs until the duration ends or ``stop()``;
5. a ``stop`` event and the final statistics (``stats.clean_stop = true``) end it.

Imports nothing from host/: the meter side runs on a Pi with the standard library.
"""

from __future__ import annotations

import contextlib
import math
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError
from epi.formats.json_types import JSON
from meter.board.channels import BoardConfig, Channel, emulated_board, load_board, open_channels
from meter.bridge.daemon import is_bridge_run, prepare_bridge, run_bridge
from meter.chip_factory import chip_factory
from meter.clock import Clock, SystemClock, is_simulated
from meter.daemon.http_server import MeterServer, parse_listen
from meter.daemon.metrics import ChannelInfo
from meter.daemon.options import DaemonOptions, RunResult
from meter.daemon.realtime import realtime_sampling
from meter.daemon.sampler import Sampler, SamplerStats
from meter.driver.atm90e26 import ATM90E26Driver
from meter.emulation.faults import FaultInjector, FaultSpec, parse_fault_specs
from meter.errors import BusError
from meter.load_check import load_findings
from meter.recording.session import Feeder, RecordingSession, clock_boot_id
from meter.sources.recorder import SourceRecorder

__all__ = ["BusBudget", "DaemonOptions", "MeterDaemon", "RunResult", "bus_budget",
           "clock_boot_id", "default_rate_hz", "frames_per_read", "measure_sweep_s"]

MIN_DEFAULT_RATE_HZ = 10.0
BUS_MARGIN = 0.45  # the default rate leaves more than half of the bus time free
NICE_RATES_HZ = (100.0, 50.0, 40.0, 25.0, 20.0, 10.0)
SCHEDULE_LEAD_NS = 100_000_000  # first sweep 100 ms after the segment starts
UART_BITS_PER_TRANSACTION = 60  # 6 bytes of 10 bits (start, 8 data, stop) per register access


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

    def describe(self) -> dict[str, JSON]:
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


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class _DirectPlan:
    """What the options ask of a direct-SPI run, checked before anything is opened."""

    board: BoardConfig
    specs: list[FaultSpec]


class MeterDaemon:
    """One daemon run. ``stop()`` and ``checkpoint()`` (from a signal handler or another
    thread) reach the recording session: a clean stop, or a SIGHUP checkpoint."""

    def __init__(self, options: DaemonOptions, log: Callable[[str], None] = _stderr) -> None:
        self.options = options
        self.log = log
        self.clock: Clock = options.clock if options.clock is not None else SystemClock()
        self.session: RecordingSession | None = None
        self.ready = threading.Event()  # set once sampling has begun (for tests)
        self.rate_note: str | None = None  # why the asked rate was lowered, if it was
        self.channels: list[Channel] = []  # the opened channels (kept after the run: tests)
        self.injector: FaultInjector | None = None  # its `applied` log: when each fault acted
        self._stop = threading.Event()
        self._checkpoint = threading.Event()

    @property
    def sampler(self) -> Feeder | None:
        """What feeds the trace (a Sampler or a BridgeRecorder) once it runs."""
        return self.session.feeder if self.session is not None else None

    @property
    def server(self) -> MeterServer | None:
        return self.session.server if self.session is not None else None

    def stop(self) -> None:
        self._stop.set()
        if self.session is not None:
            self.session.stop()

    def checkpoint(self) -> None:
        """SIGHUP: write a ``signal`` event and the statistics now; keep sampling."""
        self._checkpoint.set()
        if self.session is not None:
            self.session.request_checkpoint()

    # -- run ----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        o = self.options
        if o.duration_s is not None and not o.duration_s > 0:
            raise UserError(f"--duration {o.duration_s:g}: must be > 0 seconds")
        bridge = prepare_bridge(o, self.clock) if is_bridge_run(o) else None
        direct = self._plan() if bridge is None else None
        with RecordingSession(o.out_dir, self.clock, log=self.log, ready=self.ready) as session:
            self.session = session
            if self._stop.is_set():
                session.stop()
            if self._checkpoint.is_set():
                session.request_checkpoint()
            if bridge is not None:
                return run_bridge(bridge, session)
            assert direct is not None
            return self._run_direct(session, direct)

    def _plan(self) -> _DirectPlan:
        o = self.options
        if o.listen:
            parse_listen(o.listen)  # a bad --listen is refused before the lock is taken
        specs = parse_fault_specs(o.faults)
        if specs and o.board_path is not None and not o.emulate:
            raise UserError("--fault-injection: faults are injected into emulated chips only "
                            "(add --emulate)")
        return _DirectPlan(self._board(), specs)

    def _board(self) -> BoardConfig:
        o = self.options
        if o.board_path is not None:
            return load_board(o.board_path)
        if not o.emulate:
            raise UserError("epi meter run: give --board FILE, or --emulate for the emulator")
        return emulated_board(o.n_emulated_channels, clock=self.clock)

    def _run_direct(self, session: RecordingSession, plan: _DirectPlan) -> RunResult:
        o = self.options
        clock = self.clock
        board = plan.board
        channels: list[Channel] = []
        recorder: SourceRecorder | None = None
        sampler_ref: list[Sampler] = []

        def on_event(index: int, kind: str, detail: str) -> None:
            if sampler_ref:
                sampler_ref[0].driver_event(index, kind, detail)

        try:
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
            url = session.serve(o.listen, [ChannelInfo(ch.index, ch.name, ch.node)
                                           for ch in channels])
            started = session.now()
            sched0 = started[0] + SCHEDULE_LEAD_NS
            injector = FaultInjector(plan.specs, channels, sched0) if plan.specs else None
            self.injector = injector
            meta = self._meta(board, channels, period_s, injector, budget, sched0)
            recorder = _source_recorder(o, channels, clock)  # software sources: docs/sources.md
            if recorder is not None:
                meta["channels"] = [*channels_meta(channels), *recorder.channel_meta()]
            emulated = any(ch.emulator is not None for ch in channels)
            kind = "emulated" if emulated else "real"
            writer = session.begin(
                meta,
                f"{len(channels)} {kind} channel(s) at {rate:g} Hz"
                + (f"; faults {len(plan.specs)} scheduled" if plan.specs else ""),
                started=started)
            sampler = Sampler(
                channels, clock, writer, period_s=period_s, state=session.state,
                hub=session.hub, late_tolerance_s=o.late_tolerance_s,
                absent_retry_s=o.retry_interval_s, stats_interval_s=o.stats_interval_s,
                before_sweep=injector, wire_rate_hz=budget.wire_rate_hz,
            )
            sampler_ref.append(sampler)
            if recorder is not None:
                recorder.start(writer)
                self.log(f"epi meter: software sources on their own threads: "
                         f"{recorder.summary()}")
            session.attach(sampler)
            self.log(
                f"epi meter: sampling {len(channels)} {kind} channel(s) at {rate:g} Hz "
                f"(bus limit {budget.max_rate_hz:.1f} Hz) into {o.out_dir} segment "
                f"{writer.segment}" + (f"; serving {url}" if url else "")
            )
            for finding in load_findings(board):  # an expected load unresolved
                if finding.ok is False:
                    self.log(f"epi meter: WARNING {finding.item}: {finding.detail}; "
                             f"fix: {finding.fix}")
            sources = recorder

            def save_stats(stats: SamplerStats) -> None:
                session.save_stats(stats, **(sources.meta_updates(writer) if sources else {}))

            with (contextlib.nullcontext("") if is_simulated(self.clock)
                  else realtime_sampling()) as priority_note:
                if priority_note:
                    self.log(f"epi meter: {priority_note}")
                stats = sampler.run(o.duration_s, start_mono_ns=sched0,
                                    stats_callback=save_stats)
            if recorder is not None:
                recorder.finish(writer)
                recorder = None
            summary = (f"{stats.sweeps} sweeps, {stats.samples_written} samples, "
                       f"{stats.late_sweeps} late, {stats.skipped_sweeps} skipped, "
                       f"{stats.failed_reads} failed reads")
            session.finish(stats, summary)
            self.log(f"epi meter: stopped: {summary}")
            return RunResult(Path(o.out_dir), writer.segment, stats, url, rate)
        finally:
            if recorder is not None:
                recorder.stop()
            for ch in channels:
                ch.close()

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
        injector: FaultInjector | None,
        budget: BusBudget,
        sched0: int,
    ) -> dict[str, JSON]:
        """The keys of a direct-SPI segment's meta.json beside the session's common ones."""
        return {
            "emulated": any(ch.emulator is not None for ch in channels),
            "power_model": _power_model_meta(channels),
            "sample_period_s": period_s,
            "channels": channels_meta(channels),
            "board": board.describe(),
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
            "stats": {"clean_stop": False, **SamplerStats().as_dict()},
            **self.options.extra_meta,
        }


def channels_meta(channels: Sequence[Channel]) -> list[JSON]:
    return [ch.describe() for ch in channels]


def _power_model_meta(channels: Sequence[Channel]) -> dict[str, JSON] | None:
    """The emulated channels' power model: one description, or one per channel."""
    emulators = [(ch.index, ch.emulator) for ch in channels if ch.emulator is not None]
    if not emulators:
        return None
    models = [e.model for _, e in emulators]
    if all(m is models[0] for m in models):
        return models[0].describe()
    return {"kind": "per_channel", "modelled": True,
            "channels": {str(i): e.model.describe() for i, e in emulators}}


def _source_recorder(o: DaemonOptions, channels: Sequence[Channel], clock: Clock
                     ) -> SourceRecorder | None:
    """A SourceRecorder for the software sources, numbered after the board's channels."""
    if not o.sources:
        return None
    first = max((ch.index for ch in channels), default=-1) + 1
    rec = SourceRecorder(o.sources, first, clock, o.source_node or socket.gethostname())
    return rec if rec.n_channels else None
