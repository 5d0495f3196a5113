"""The bridge recorder: telemetry lines from the MCU -> epi-trace rows and events.

What it guarantees (docs/bridge.md):

* every sweep line becomes one sample row per channel that delivered, its time the MCU's
  energy-read time mapped onto this machine's CLOCK_MONOTONIC (`clockmap`); a failed reading
  (the MCU sends `fail`: a fault, `implausible`, or `not_ready` before a chip's first complete
  measurement after a (re)start — the firmware decides that from the chip's state, the
  recorder never guesses it from the values) writes no row;
* `energy_j` = cumulative ATenergy counts × J per count, continued across MCU resets (a reset
  restarts the MCU's counts; the recorder keeps the trace's counter monotonic);
* an interval the MCU's chip protocol could not meter (a chip reset, absent, stuck, a
  checksum error: its counts leave that energy out) arrives as an `unmetered` event and is
  declared as the direct path declares it: a channel `gap` whose reason begins with
  `energy not metered`, its ends the MCU's times mapped onto CLOCK_MONOTONIC;
* a gap in `seq` writes a `gap` event spanning the last line before to the first line after:
  the cumulative counts carry the energy over it exactly, only time resolution is lost;
* a bad CRC or an unparsable line writes a `bus_error` event (at most 5 a second, counted);
  so does a line longer than MAX_LINE_BYTES (read in bounded pieces, never held whole);
* a sweep line is untrusted even with a good CRC (`trust`): a channel given twice or a time
  in the future drops the sweep with a `bus_error` event; cumulative counts that went back
  (`counter_backwards`) or rose faster than any load can (`implausible`) drop that reading
  with an event and never move `energy_j`; when they stay there for REBASE_AFTER readings
  the channel continues from them with a `gap` event declaring the energy not metered;
* an MCU reset (new boot id in `hello`, or `seq` going back) writes a `gap` event, starts a
  new clock mapping, and asks the firmware for `hello` again;
* a lost serial port is retried every `reconnect_s`; when lines come back a `gap` event covers
  the outage. Nothing of this stops the recorder;
* storage, as on the direct-SPI path: a full disk is counted once per episode as a
  `disk_full` fault (stats and /metrics; the writer records the event and the gap), and a
  trace directory removed under the recorder (`--out` deleted) stops it within
  `STORAGE_CHECK_S` with the writer's one-line TraceLostError (exit status 2, restartable).

The clock mapping (offset, drift, uncertainty) of each MCU boot is written into the segment's
meta.json under `bridge.clock`; every refit that moved it by more than its uncertainty is
kept in `bridge.clock_history`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from epi.core.errors import UserError
from meter.bridge.clockmap import ClockMapper, Mapping
from meter.bridge.hello import Hello, parse_hello
from meter.bridge.link import Link, wire_ns
from meter.bridge.protocol import (
    ChannelReading,
    LineError,
    Message,
    Sweep,
    command,
    decode_line,
)
from meter.bridge.trust import (
    FUTURE_TOLERANCE_NS,
    MAX_MCU_US,
    counts_problem,
    pong_problem,
    power_problem,
    sweep_problem,
    time_problem,
)
from meter.chip.calibration import joules_per_count
from meter.clock import Clock
from meter.daemon.event_budget import EventBudget
from meter.daemon.live_stream import StreamKind
from meter.daemon.trace import EVENT_KINDS, UNMETERED_GAP_REASON, TraceWriter, gap_detail
from meter.errors import LinkLost
from meter.firmware.telemetry import NOT_READY
from meter.recording.disk_full import DiskFullWatch
from meter.recording.failure_run import FailureRun

MAX_LINE_BYTES = 4096
MAX_PENDING_SWEEPS = 3000  # sweeps held while the first clock mapping is being fitted
INITIAL_PINGS = 8
DENSE_PINGS_S = 30.0  # after a boot's first ping, ping 10× as often: drift is fitted sooner
STORAGE_CHECK_S = 0.5  # how often the trace directory's presence and the disk are checked
REBASE_AFTER = 3  # rejected readings in a row after which a channel's counts are taken anew
PONG_REBASE_AFTER = 3  # agreeing rejected pongs in a row after which the mapping starts anew


@dataclass
class BridgeStats:
    lines: int = 0
    sweeps: int = 0
    samples_written: int = 0
    lost_lines: int = 0
    bad_crc: int = 0
    unparsable: int = 0
    mcu_resets: int = 0
    reconnects: int = 0
    failed_readings: int = 0
    not_ready_readings: int = 0
    pings: int = 0
    pongs: int = 0
    command_errors: int = 0
    suppressed_events: int = 0
    rejected_sweeps: int = 0
    rejected_readings: int = 0
    rejected_pongs: int = 0
    faults: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.__dict__.items()}


@dataclass
class _Channel:
    jpc: float | None = None  # joules per count (from the firmware's hello)
    ref_counts: int | None = None  # counts at the first sweep of this boot
    base_j: float = 0.0  # energy_j carried over from earlier boots
    last_energy_j: float = 0.0
    last_t_mono: int | None = None
    failures: FailureRun = field(default_factory=FailureRun)
    last_counts: int | None = None  # the last accepted cumulative counts of this boot
    last_t_us: int | None = None  # and when (MCU µs)
    rejects: int = 0  # readings rejected in a row (trust.counts_problem)
    rejected_since: tuple[int, int] | None = None  # the last accepted reading before them
    last_powers: list[float] = field(default_factory=list)  # its power and V·I, if read
    # the channel (re)started from counts read at or before its last row's time: until a
    # reading comes after that row, no reading may move energy_j (it would be written at a
    # time the trace has passed, its energy squeezed into the next row's interval)
    anchor_behind: bool = False


def _powers(r: ChannelReading) -> list[float]:
    """A reading's active power and V·I (apparent power), or [] when it carried none."""
    if r.fail is not None or r.power_w is None:
        return []
    apparent = r.voltage_v * r.current_a if r.voltage_v is not None and \
        r.current_a is not None else 0.0
    return [r.power_w, apparent]


class BridgeRecorder:
    """Reads the link, writes the trace. `run()` until `stop()` or the duration ends."""

    def __init__(
        self,
        link: Link,
        clock: Clock,
        writer: TraceWriter,
        *,
        baud: int,
        channels: list[int] | None = None,
        rate_hz: float | None = None,
        encoding: str | None = None,
        ping_interval_s: float = 1.0,
        refit_interval_s: float = 2.0,
        reconnect_s: float = 1.0,
        meta_interval_s: float = 5.0,
        wire_time: bool = True,
        log: Callable[[str], None] = lambda line: None,
        idle_until: Callable[[int], None] | None = None,
    ) -> None:
        self.link = link
        self.clock = clock
        self.writer = writer
        self.baud = baud
        # lines spend bytes × 10 / baud on a real UART; a pseudo-terminal delivers at once
        self.wire_time = wire_time
        self.only_channels = set(channels) if channels is not None else None
        self.rate_hz = rate_hz
        self.encoding = encoding
        self.ping_interval_ns = round(ping_interval_s * 1e9)
        self.refit_interval_ns = round(refit_interval_s * 1e9)
        self.reconnect_ns = round(reconnect_s * 1e9)
        self.meta_interval_ns = round(meta_interval_s * 1e9)
        self.log = log
        self.idle_hook = idle_until  # an emulated port: its MCU runs while the link is down
        self.stats = BridgeStats()
        self.hello: Hello | None = None
        self.boot: str | None = None
        self.mapper = ClockMapper()
        self.mapping: Mapping | None = None
        self.clock_history: list[dict[str, object]] = []
        self.channels: dict[int, _Channel] = {}
        self.last_seq: int | None = None
        self.last_sweep_t: tuple[int, int] | None = None
        self.seq_base = 0
        self.pending: list[tuple[Sweep, int]] = []
        self._pending_unmetered: list[tuple[dict[str, object], int]] = []
        self.outage: tuple[int, int, str] | None = None  # (t_mono, t_real, why) of a lost link
        self.connected = False
        self._waiting_logged = False
        self._buf = bytearray()
        self._skipping = False  # inside an over-long line, discarding up to its end
        self._ping_id = 0
        self._dense_until: int | None = None  # end of this boot's dense ping phase
        self._ping_req_bytes = 0
        self._pings: dict[int, int] = {}
        self._odd_pongs: list[tuple[int, int, int, int, int]] = []  # rejected, in a row
        self._next_ping = 0
        self._next_fit = 0
        self._next_meta = 0
        self._event_budget = EventBudget()
        self._stop = threading.Event()
        self.ready = threading.Event()  # set when the first sample row is written
        self.on_sample: Callable[[dict[str, object]], None] | None = None  # live state/stream
        self.on_fault: Callable[[int | None, str], None] | None = None  # /metrics, /status
        self.on_sweep: Callable[[], None] | None = None  # /metrics and /status sweeps_total
        self._next_storage = 0
        self._disk_full = DiskFullWatch()

    # ---- control ----------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def request_checkpoint(self) -> None:
        """SIGHUP: call the statistics callback at the next pass of the loop (safe from a
        signal handler: nothing is written here)."""
        self._next_meta = 0

    def _now(self) -> tuple[int, int]:
        return self.clock.monotonic_ns(), self.clock.realtime_ns()

    def _real_of(self, t_mono: int) -> int:
        m, r = self._now()
        return t_mono + (r - m)

    # ---- events -----------------------------------------------------------------------------
    def event(self, channel: int | None, kind: str, detail: str, t: tuple[int, int] | None = None,
              *, limit: bool = True) -> None:
        if kind not in EVENT_KINDS:
            detail = f"{kind}: {detail}"
            kind = "bus_error"
        t_mono, t_real = t if t is not None else self._now()
        if kind not in ("gap", "start", "stop", "late"):
            self.stats.faults[kind] = self.stats.faults.get(kind, 0) + 1
            if self.on_fault is not None:  # /status and /metrics, as the direct path's
                # (a reverse_energy here is what `epi doctor` reads as a reversed CT)
                self.on_fault(channel, kind)
        if limit:
            admitted = self._event_budget.admit(channel, kind, t_mono, detail)
            if admitted is None:
                self.stats.suppressed_events += 1
                return
            detail = admitted
        self.writer.write_event(t_mono, t_real, channel, kind, detail)

    # ---- link -------------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        try:
            self.link.write(data)
        except LinkLost as exc:
            self._lost(str(exc))

    def _lost(self, why: str) -> None:
        if self.connected:
            self.connected = False
            start = self.last_sweep_t or self._now()
            self.outage = (start[0], start[1], why)
            self.log(f"epi meter bridge: link lost: {why}")
        self._buf = bytearray()
        self._skipping = False
        self._pings.clear()

    def _connect(self) -> bool:
        try:
            self.link.open()
        except LinkLost as exc:
            if not self._waiting_logged:
                self._waiting_logged = True
                self.log(f"epi meter bridge: waiting for the port ({exc}); retrying every "
                         f"{self.reconnect_ns / 1e9:g} s")
            return False
        self._waiting_logged = False
        self.connected = True
        if self.outage is not None:
            self.stats.reconnects += 1
            self.log("epi meter bridge: link back")
        self._send(command("hello"))
        return True

    def _configure(self) -> None:
        """After a hello: the firmware streams with our rate and encoding."""
        hello = self.hello
        if hello is None:
            return
        if self.encoding is not None and hello.encoding != self.encoding:
            self._send(command("encoding", enc=self.encoding))
        if self.rate_hz is not None and abs((hello.rate_hz or 0.0) - self.rate_hz) > 1e-6:
            self._send(command("rate", hz=self.rate_hz))
        if not hello.streaming:
            self._send(command("start"))

    def _ping(self, now: int) -> None:
        self._ping_id += 1
        line = command("ping", id=self._ping_id)
        self._pings[self._ping_id] = now
        if len(self._pings) > 64:
            self._pings.pop(min(self._pings))
        self.stats.pings += 1
        self._ping_req_bytes = len(line)
        self._send(line)

    # ---- main loop --------------------------------------------------------------------------
    def run(self, duration_s: float | None = None, *,
            stats_callback: Callable[[BridgeRecorder], None] | None = None) -> BridgeStats:
        t_start = self.clock.monotonic_ns()
        end = t_start + round(duration_s * 1e9) if duration_s is not None else None
        next_try = t_start
        while not self._stop.is_set():
            now = self.clock.monotonic_ns()
            if end is not None and now >= end:
                break
            if now >= self._next_storage:  # connected or not
                self._next_storage = now + round(STORAGE_CHECK_S * 1e9)
                self._check_storage()
            if not self.connected:
                if now < next_try or not self._connect():
                    next_try = max(next_try, now) + self.reconnect_ns if now >= next_try \
                        else next_try
                    self._idle_until(min(next_try, end) if end else next_try)
                    continue
                self._next_ping = now
            timeout = 0.05
            if end is not None:
                timeout = max(0.0, min(timeout, (end - now) / 1e9))
            try:
                data = self.link.read(timeout)
            except LinkLost as exc:
                self._lost(str(exc))
                continue
            t_recv = self.clock.monotonic_ns()
            if data:
                self._feed(data, t_recv)
            self._housekeeping(t_recv, stats_callback)
        self._finish()
        return self.stats

    def _idle_until(self, t_mono_ns: int) -> None:
        """Wait for the next reconnect try (an emulated link keeps its MCU running)."""
        idle = self.idle_hook or getattr(self.link, "idle_until", None)
        if idle is not None:
            idle(t_mono_ns)
        else:
            self.clock.sleep_until(t_mono_ns)

    def _check_storage(self) -> None:
        """Count a full disk once per episode; raise TraceLostError when the trace directory
        was removed (the daemon stops with its one-line message)."""
        self._disk_full.check(self.writer, self.stats.faults, self.on_fault)

    def _housekeeping(self, now: int,
                      stats_callback: Callable[[BridgeRecorder], None] | None) -> None:
        if self.connected and self.boot is not None and now >= self._next_ping:
            self._ping(now)
            if self._dense_until is None:
                self._dense_until = now + round(DENSE_PINGS_S * 1e9)
            initial = self.mapper.mapping is None or len(self.mapper.pings) < INITIAL_PINGS \
                or now < self._dense_until
            self._next_ping = now + (self.ping_interval_ns // 10 if initial
                                     else self.ping_interval_ns)
        if now >= self._next_fit and self.mapper.pings:
            self._refit()
            self._next_fit = now + self.refit_interval_ns
        if now >= self._next_meta:
            self._next_meta = now + self.meta_interval_ns
            if stats_callback is not None:
                stats_callback(self)  # the session writes the statistics and `bridge`
            else:
                self.writer.update_meta(bridge=self.describe())

    def _feed(self, data: bytes, t_recv: int) -> None:
        """Split into lines; a line over MAX_LINE_BYTES is discarded as its bytes arrive (the
        buffer never holds more than MAX_LINE_BYTES plus one read), up to its line end."""
        self._buf.extend(data)
        while True:
            i = self._buf.find(b"\n")
            if self._skipping:  # the rest of an over-long line
                if i < 0:
                    self._buf = bytearray()
                    return
                del self._buf[: i + 1]
                self._skipping = False
                continue
            if i < 0:
                if len(self._buf) > MAX_LINE_BYTES:
                    self.stats.unparsable += 1
                    self.event(None, "bus_error", f"bridge: line over {MAX_LINE_BYTES} bytes "
                               "without a line end discarded up to its end")
                    self._buf = bytearray()
                    self._skipping = True
                return
            line = bytes(self._buf[: i + 1])
            del self._buf[: i + 1]
            if len(line) > MAX_LINE_BYTES:
                self.stats.unparsable += 1
                self.event(None, "bus_error", f"bridge: {len(line)}-byte line (over "
                           f"{MAX_LINE_BYTES}) discarded up to its end")
                continue
            self._line(line, t_recv)

    def _line(self, line: bytes, t_recv: int) -> None:
        self.stats.lines += 1
        try:
            msg = decode_line(line)
        except LineError as exc:
            if exc.kind == "crc":
                self.stats.bad_crc += 1
                self.event(None, "bus_error", f"bridge: telemetry line with a bad CRC dropped "
                           f"({len(line)} bytes)")
            else:
                self.stats.unparsable += 1
                self.event(None, "bus_error", f"bridge: unparsable line dropped: {exc.detail}")
            return
        if isinstance(msg, Sweep):
            self._sweep(msg, t_recv)
        else:
            self._message(msg, t_recv, len(line))

    # ---- messages ---------------------------------------------------------------------------
    def _message(self, msg: Message, t_recv: int, n_bytes: int = 0) -> None:
        f = msg.fields
        if msg.kind == "hello":
            self._hello(f)
        elif msg.kind == "pong":
            ping_id = f.get("id")
            t_send = self._pings.pop(ping_id, None) if isinstance(ping_id, int) else None
            t_us = f.get("t")
            if t_send is not None and isinstance(t_us, int) and not isinstance(t_us, bool):
                # both lines' wire times are known exactly: the request's from what was
                # sent, the answer's from its length (it was stamped before it was sent)
                wire = self.wire_time
                exchange = (t_send, t_us, t_recv,
                            wire_ns(self._ping_req_bytes, self.baud) if wire else 0,
                            wire_ns(n_bytes, self.baud) if wire else 0)
                if not self._pong_trusted(ping_id, exchange):
                    return
                self.stats.pongs += 1
                self.mapper.add(t_send, t_us, t_recv, wire_req_ns=exchange[3],
                                wire_reply_ns=exchange[4])
                if self.mapper.mapping is None or len(self.mapper.pings) <= INITIAL_PINGS or (
                        self._dense_until is not None and t_recv < self._dense_until):
                    self._refit()  # every pong while the mapping is young
        elif msg.kind == "ev":
            ch = f.get("n")
            kind = str(f.get("kind"))
            if kind == "late":
                self.event(None, "late", f"MCU: {f.get('d')}")
            elif kind == "unmetered":
                self._unmetered(f, t_recv)
            else:
                self.event(ch if isinstance(ch, int) else None, kind, f"MCU: {f.get('d')}")
        elif msg.kind == "err":
            self.stats.command_errors += 1
            self.log(f"epi meter bridge: firmware refused a command: {f.get('error')}")

    def _pong_trusted(self, ping_id: object, exchange: tuple[int, int, int, int, int]) -> bool:
        """Whether a pong may join the clock mapping (trust.pong_problem); one that may not is
        dropped with a `bus_error` event. PONG_REBASE_AFTER such pongs in a row that agree
        with each other are the MCU's clock itself having moved: the mapping starts again
        from them."""
        t_send, t_us, t_recv = exchange[:3]
        problem = pong_problem(t_send, t_us, t_recv, self.mapper.mapping)
        if problem is None:
            self._odd_pongs = []
            return True
        self.stats.rejected_pongs += 1
        if not 0 <= t_us <= MAX_MCU_US:
            self._odd_pongs = []  # never a clock to follow
        else:
            self._odd_pongs = [*self._odd_pongs, exchange][-PONG_REBASE_AFTER:]
        odd = self._odd_pongs
        # offsets (Pi receipt − MCU time) of the odd pongs: the same clock when they agree
        # within their round trips and the sweeps' tolerance
        offsets = [r - u * 1000 for _, u, r, _, _ in odd]
        rtt = max((r - s for s, _, r, _, _ in odd), default=0)
        if len(odd) == PONG_REBASE_AFTER and \
                max(offsets) - min(offsets) <= rtt + FUTURE_TOLERANCE_NS:
            self.mapper = ClockMapper()
            for s_ns, u, r, req, rep in odd:
                self.mapper.add(s_ns, u, r, wire_req_ns=req, wire_reply_ns=rep)
            self._odd_pongs = []
            self.stats.pongs += len(odd)
            self.event(None, "bus_error", f"bridge: pong {str(ping_id)[:20]}: {problem}; "
                       f"{PONG_REBASE_AFTER} pongs in a row agree with each other: the MCU's "
                       "clock moved, the clock mapping is refitted from them", limit=False)
            if self.mapping is not None:
                self.clock_history.append({"boot": self.boot, **self.mapping.describe(),
                                           "ended": "MCU clock moved"})
            self.mapping = None
            self._refit()
            return False
        self.event(None, "bus_error", f"bridge: pong {str(ping_id)[:20]} dropped: {problem}; "
                   "the clock mapping is not moved")
        return False

    def _unmetered(self, f: dict[str, object], t_recv: int) -> None:
        """The MCU's chip protocol could not meter an interval (its counts leave it out):
        declare it as the direct path does, a channel `gap` whose reason begins with
        UNMETERED_GAP_REASON, from the MCU times mapped onto CLOCK_MONOTONIC. Untrusted: times
        that are not a forward interval ending before the line arrived are a bus_error."""
        n, t0_us, t1_us, est = f.get("n"), f.get("t0"), f.get("t1"), f.get("est_j")
        m = self.mapping
        if m is None:  # before the first mapping: held until it is fitted
            if len(self._pending_unmetered) < 100:
                self._pending_unmetered.append((f, t_recv))
            return
        if not (isinstance(n, int) and isinstance(t0_us, int) and isinstance(t1_us, int)
                and not isinstance(n, bool) and 0 <= t0_us < t1_us):
            self.event(None, "bus_error", f"bridge: unusable unmetered interval from the MCU: "
                       f"channel {str(n)[:20]}, {str(t0_us)[:24]}..{str(t1_us)[:24]} µs")
            return
        t0, t1 = m.to_mono_ns(t0_us), m.to_mono_ns(t1_us)
        problem = time_problem(t1, t_recv, m.uncertainty_ns, None) or \
            time_problem(t0, t_recv, m.uncertainty_ns, None)
        if problem is not None:
            self.event(n, "bus_error", f"bridge: unmetered interval from the MCU dropped: "
                       f"{problem}")
            return
        est_text = f"≈{est:.3f} J at the last power" if isinstance(est, (int, float)) and \
            not isinstance(est, bool) and math.isfinite(est) else "unknown"
        reason = (f"{UNMETERED_GAP_REASON}: MCU: {str(f.get('d'))[:200]}; "
                  f"{(t1 - t0) / 1e9:.3f} s ({est_text}) not in energy_j")
        self.event(n, "gap", gap_detail(t1, self._real_of(t1), reason),
                   t=(t0, self._real_of(t0)), limit=False)

    def _hello(self, f: dict[str, object]) -> None:
        try:
            hello = parse_hello(f)
        except LineError as exc:
            # A hello passed its CRC, so the firmware means it: an MCU announcing impossible
            # channels or constants is misconfigured, and no count can become joules. Stop
            # with the reason (in the trace and on the console) rather than record a trace
            # whose energy cannot be known.
            self.stats.unparsable += 1
            self._refuse_hello(exc.detail[:300], "fix the firmware's configuration (epi meter "
                               "firmware console, `hello`)")
        missing = sorted(n for n in self.only_channels or () if hello.channel(n) is None)
        if missing:  # those channels would record nothing, silently, for the whole run
            detail = (f"hello: channels lists {[c.channel for c in hello.channels]!r:.80}, "
                      f"without the board's channel(s) {missing!r:.80}")
            self._refuse_hello(detail, "enable those channels in the firmware's "
                               "configuration, or disable them in the board file")
        boot = hello.boot
        if self.boot is not None and boot != self.boot:
            self._mcu_reset(f"new boot id {boot} (was {self.boot})")
        self.boot = boot
        self.hello = hello
        for c in hello.channels:
            ch = self.channels.setdefault(c.channel, _Channel())
            jpc = joules_per_count(c.meter_constant_imp_per_kwh)
            if ch.jpc is not None and jpc != ch.jpc and ch.ref_counts is not None:
                # never rescale energy already written: the new constant counts from here
                self.event(c.channel, "bus_error", f"bridge: hello changed the meter constant to "
                           f"{c.meter_constant_imp_per_kwh:g} imp/kWh within one boot; energy "
                           "already written stands, counts from here on use the new one")
                ch.base_j = ch.last_energy_j
                ch.ref_counts = ch.last_counts
            ch.jpc = jpc
        self._configure()
        # the trace's channel entries get what only the firmware knows (docs/formats.md §1)
        entries: list[object] = []
        listed = self.writer.meta.get("channels")
        for entry in listed if isinstance(listed, list) else []:
            fw = hello.channel(entry.get("channel")) if isinstance(entry, dict) else None
            if isinstance(entry, dict) and fw is not None:
                mc = fw.meter_constant_imp_per_kwh
                entry = {**entry, "meter_constant_imp_per_kwh": mc,
                         "calibration": {"source": f"MCU: {fw.calibration}",
                                         "joules_per_count": joules_per_count(mc)}}
            entries.append(entry)
        self.writer.update_meta(bridge=self.describe(), channels=entries)

    def _refuse_hello(self, detail: str, remedy: str) -> None:
        """Stop: a `bus_error` event in the trace, then the one-line UserError (exit 2)."""
        self.event(None, "bus_error", f"bridge: hello refused: {detail}", limit=False)
        raise UserError(f"bridge: the MCU's hello is refused ({detail}); the recorder stopped "
                        f"without converting a count: {remedy}")

    def _mcu_reset(self, why: str) -> None:
        """The MCU restarted: its counts and clock start again."""
        self.stats.mcu_resets += 1
        now = self._now()
        start = self.last_sweep_t or now
        self.event(None, "gap", gap_detail(now[0], now[1], f"MCU reset: {why}; energy between "
                                           "the last line before and the first line after is "
                                           "not metered"), t=start, limit=False)
        for ch in self.channels.values():
            ch.base_j = ch.last_energy_j
            ch.ref_counts = None
            ch.last_counts = ch.last_t_us = ch.rejected_since = None
            ch.rejects = 0
            ch.last_powers = []
        if self.mapping is not None:
            self.clock_history.append({"boot": self.boot, **self.mapping.describe(),
                                       "ended": "MCU reset"})
        self.mapper = ClockMapper()
        self._dense_until = None
        self.mapping = None
        self.last_seq = None
        self.pending = []
        self._pending_unmetered = []
        self._pings.clear()
        self.outage = None

    def _refit(self) -> None:
        old = self.mapping
        new = self.mapper.fit()
        if new is None:
            return
        self.mapping = new
        if old is None or abs(new.to_mono_ns(new.ref_us) - old.to_mono_ns(new.ref_us)) > \
                max(old.uncertainty_ns, new.uncertainty_ns):
            self.clock_history.append({"boot": self.boot, **new.describe()})
            if len(self.clock_history) > 500:
                del self.clock_history[1:100]
        if self.pending and len(self.mapper.pings) >= INITIAL_PINGS:
            pending, self.pending = self.pending, []
            for sweep, t_recv in pending:
                self._sweep(sweep, t_recv)
        held, self._pending_unmetered = self._pending_unmetered, []
        for fields, t_recv in held:
            self._unmetered(fields, t_recv)

    # ---- sweeps -----------------------------------------------------------------------------
    def _sweep(self, sw: Sweep, t_recv: int) -> None:
        if self.last_seq is not None and sw.seq <= self.last_seq:
            self._mcu_reset(f"sequence went back from {self.last_seq} to {sw.seq}")
            self.boot = None  # which boot is unknown until its hello
            self._send(command("hello"))
        # sweeps wait for the first mapping fitted from the initial burst of pings (the best
        # of INITIAL_PINGS exchanges, not the first one)
        if self.boot is None or self.mapping is None or (
                len(self.mapper.pings) < INITIAL_PINGS and len(self.pending) < MAX_PENDING_SWEEPS):
            if len(self.pending) < MAX_PENDING_SWEEPS:
                self.pending.append((sw, t_recv))
            if self.boot is None and len(self.pending) % 20 == 1:
                self._send(command("hello"))
            return
        m = self.mapping
        t_line = m.to_mono_ns(sw.t_us)
        last = self.last_sweep_t[0] if self.last_seq is not None and \
            self.last_sweep_t is not None else None
        offsets = [r.offset_us for r in sw.channels] or [0]
        # the latest and the earliest row of the sweep: neither in the future, before the
        # sweep before it, nor outside what a trace's t_mono_ns can hold
        problem = sweep_problem(sw) or time_problem(
            m.to_mono_ns(sw.t_us + max(offsets)), t_recv, m.uncertainty_ns, last) or \
            time_problem(m.to_mono_ns(sw.t_us + min(offsets)), t_recv, m.uncertainty_ns, last)
        if problem is not None:
            self.stats.rejected_sweeps += 1
            self.event(None, "bus_error", f"bridge: sweep seq {sw.seq} dropped: {problem}")
            return
        self.stats.sweeps += 1
        if self.on_sweep is not None:
            self.on_sweep()
        t_line_real = self._real_of(t_line)
        if self.outage is not None:
            o_mono, o_real, why = self.outage
            self.event(None, "gap", gap_detail(t_line, t_line_real, f"serial link lost ({why}) "
                       "and back; energy continuous across it (cumulative counts)"),
                       t=(o_mono, o_real), limit=False)
            self.outage = None
            if self.last_seq is not None and sw.seq > self.last_seq + 1:
                self.stats.lost_lines += sw.seq - self.last_seq - 1
        elif self.last_seq is not None and sw.seq > self.last_seq + 1:
            lost = sw.seq - self.last_seq - 1
            self.stats.lost_lines += lost
            start = self.last_sweep_t or (t_line, t_line_real)
            self.event(None, "gap", gap_detail(
                t_line, t_line_real, f"{lost} telemetry line(s) lost (seq {self.last_seq + 1}.."
                f"{sw.seq - 1}); energy continuous across it (cumulative counts)"),
                t=start, limit=False)
        self.last_seq = sw.seq
        self.last_sweep_t = (t_line, t_line_real)
        rows = []
        for r in sw.channels:
            if self.only_channels is not None and r.channel not in self.only_channels:
                continue
            ch = self.channels.setdefault(r.channel, _Channel())
            t_mono = m.to_mono_ns(sw.t_us + r.offset_us)
            behind = ch.last_t_mono is not None and t_mono <= ch.last_t_mono
            if ch.last_t_mono is not None and behind:
                t_mono = ch.last_t_mono + 1
            t_real = self._real_of(t_mono)
            if ch.jpc is None:
                continue  # no hello for this channel yet (cannot convert counts)
            if not self._counts_trusted(r, ch, sw.t_us + r.offset_us, (t_mono, t_real)):
                continue
            if ch.ref_counts is None:
                ch.ref_counts = r.counts
                ch.anchor_behind = ch.anchor_behind or behind
            if ch.anchor_behind:
                ch.base_j, ch.ref_counts = ch.last_energy_j, r.counts  # energy_j does not move
                if behind:
                    continue
                assert ch.last_t_mono is not None
                self.event(r.channel, "gap", gap_detail(
                    t_mono, t_real, "bridge: the channel continued from counts read at or "
                    "before its last row's time; energy until this reading not metered"),
                    t=(ch.last_t_mono, self._real_of(ch.last_t_mono)), limit=False)
                ch.anchor_behind = False
            energy_j = ch.base_j + (r.counts - ch.ref_counts) * ch.jpc
            if r.fail is not None:
                if r.fail == NOT_READY:
                    why = "measurements not ready"
                    self.stats.not_ready_readings += 1
                else:
                    why = f"reading failed ({r.fail})"
                    self.stats.failed_readings += 1
                ch.failures.book(t_mono, t_real, why)
                ch.last_energy_j = energy_j
                continue
            closed = ch.failures.close()
            if closed is not None:
                self.event(r.channel, "gap", gap_detail(t_mono, t_real, f"data resumed; no "
                           f"valid data: {closed.counts_text()}"),
                           t=(closed.start_mono_ns, closed.start_real_ns), limit=False)
            ch.last_energy_j = energy_j
            ch.last_t_mono = t_mono
            rows.append((self.seq_base + sw.seq, r.channel, t_mono, t_real, r.power_w,
                         r.voltage_v, r.current_a, r.power_factor, r.frequency_hz, energy_j,
                         r.status))
        if rows:
            self.stats.samples_written += self.writer.write_samples(rows)
            self.ready.set()
            if self.on_sample is not None:
                keys = ("seq", "channel", "t_mono_ns", "t_real_ns", "power_w", "voltage_v",
                        "current_a", "power_factor", "frequency_hz", "energy_j", "status")
                for row in rows:
                    self.on_sample({"type": StreamKind.SAMPLE, **dict(zip(keys, row, strict=True))})

    def _counts_trusted(self, r: ChannelReading, ch: _Channel, t_us: int,
                        t: tuple[int, int]) -> bool:
        """Whether a reading's cumulative counts may move energy_j (trust.counts_problem);
        a rejected one is an event. Counts that stay rejected REBASE_AFTER times are taken as
        the channel's new reference, with a gap declaring the energy between not metered."""
        n, counts, jpc = r.channel, r.counts, ch.jpc
        powers = _powers(r)
        problem = power_problem(r.power_w)
        if problem is None and ch.last_counts is not None and ch.last_t_us is not None \
                and jpc is not None:
            problem = counts_problem(ch.last_counts, counts, (t_us - ch.last_t_us) / 1e6, jpc,
                                     ch.last_powers + powers if ch.last_powers and powers
                                     else None)
        if problem is None:
            ch.last_counts, ch.last_t_us, ch.rejects = counts, t_us, 0
            ch.last_powers = powers
            ch.rejected_since = None
            return True
        self.stats.rejected_readings += 1
        ch.rejects += 1
        if ch.rejected_since is None:
            ch.rejected_since = (ch.last_t_mono, self._real_of(ch.last_t_mono)) \
                if ch.last_t_mono is not None else t
        if ch.rejects < REBASE_AFTER:
            kind = "counter_backwards" if problem.startswith("cumulative counts went back") \
                else "implausible"
            self.event(n, kind, f"bridge: {problem}; reading dropped, energy_j not moved")
            return False
        self.event(n, "gap", gap_detail(t[0], t[1], f"bridge: {problem} for {ch.rejects} "
                   "readings in a row; the channel continues from these counts, energy over "
                   "this interval not metered"), t=ch.rejected_since, limit=False)
        ch.base_j = ch.last_energy_j
        ch.ref_counts = None
        ch.last_counts, ch.last_t_us, ch.rejects = counts, t_us, 0
        ch.last_powers = powers
        ch.rejected_since = None
        return True

    def _finish(self) -> None:
        now = self._now()
        for n, ch in self.channels.items():
            closed = ch.failures.close()
            if closed is not None:
                self.event(n, "gap", gap_detail(now[0], now[1], f"recorder stopped while "
                           f"failing; no valid data: {closed.counts_text()}"),
                           t=(closed.start_mono_ns, closed.start_real_ns), limit=False)
        if self.outage is not None:
            o_mono, o_real, why = self.outage
            self.event(None, "gap", gap_detail(now[0], now[1], f"serial link lost ({why}) "
                       "until the recorder stopped"), t=(o_mono, o_real), limit=False)
        self.writer.update_meta(bridge=self.describe())

    def describe(self) -> dict[str, object]:
        return {
            "bridged": True,
            "link": self.link.describe(),
            "firmware": self.hello.fields if self.hello is not None else None,
            "boot": self.boot,
            "clock": self.mapping.describe() if self.mapping else None,
            "clock_history": list(self.clock_history),
            "stats": self.stats.as_dict(),
        }
