"""The firmware's main loop: steady sweeps on the MCU clock, commands on the same UART.

`Firmware(hw, config).poll()` does one step without blocking: reads and answers the commands
that arrived, and runs the sweep that is due; it returns the microseconds until the next
sweep. `run()` loops for ever (the MCU's `main.py`). The emulated bridge calls `poll()`
from its own loop, with a simulated clock, so an hour of firmware runs in seconds.

Schedule: sweep slots at `t0 + k·period` on the MCU's own 64-bit microsecond clock; a sweep
that overran its period skips the slots that are over and runs the latest one that has begun
at once (skips counted, reported by a `late` event from boot on, at most every 10 s).
`seq` counts sweeps sent, so a gap in `seq` on the Pi means lost lines.

`hw` is what the board provides (see meter.firmware.hw for the real one): `ticks_us`,
`ticks_diff`, `sleep_us`, `uart` (any/read/write), `spi` (write_readinto), `pin(n)`,
`read_file(name)`, `write_file(name, text)`, `boot_id()`, `info()`.
MicroPython subset.
"""

import json

from meter.chip import registers as regs
from meter.chip.calibration import Calibration, CalibrationError
from meter.chip.errors import ChipFault
from meter.firmware import telemetry
from meter.firmware.chip import Chip
from meter.firmware.config import CONFIG_FILE, channel_calibration
from meter.firmware.crc import unseal
from meter.firmware.mcutime import TickExtender
from meter.firmware.telemetry import NOT_READY

FIRMWARE_VERSION = "1.0.0"
MAX_COMMAND_BYTES = 2048
ABSENT_RETRY_US = 1000000
LATE_REPORT_US = 10000000
MAX_RATE_HZ = 1000.0


class Firmware:
    """The board's firmware (one instance per boot)."""

    def __init__(self, hw, config, config_error=None):
        self.hw = hw
        self.config = config
        self.config_error = config_error
        self.clock = TickExtender(hw.ticks_us, hw.ticks_diff)
        self.boot_id = hw.boot_id()
        self.encoding = config.get("encoding", "json")
        if self.encoding not in telemetry.ENCODINGS:
            self.encoding = "json"
        self.period_us = int(1000000 / float(config.get("rate_hz", 10.0)))
        self.streaming = True
        self.seq = 0
        self.next_due = None
        self.skipped = 0
        self.late_reported_us = None  # type: int | None  # when `late` was last sent
        self.commands = 0
        self.errors = 0
        self._rx = bytearray()
        self._discarding = False
        self.chips = []
        self.sources = []
        self.failing = []  # type: list  # fault kind per channel, None when delivering
        self.retry_at = []
        first_us = int(float(config.get("first_measurement_ms", 2000)) * 1000)
        for n, entry in enumerate(config["channels"]):
            cal, source = channel_calibration(entry)
            self.chips.append(Chip(hw.spi, hw.pin(entry["cs"]), cal, hw.sleep_us, self.now_us,
                                   first_us, self._chip_event(n)))
            self.sources.append(source)
            self.failing.append(None)
            self.retry_at.append(0)
        self.send(self.hello_message())
        for n in range(len(self.chips)):
            self._start_chip(n)

    # ---- output -----------------------------------------------------------------------------
    def send(self, line):
        self.hw.uart.write(line)

    def now_us(self):
        return self.clock.now_us()

    def hello_message(self):
        return telemetry.message("hello", {
            "fw": FIRMWARE_VERSION,
            "proto": telemetry.PROTOCOL_VERSION,
            "boot": self.boot_id,
            "board": self.config.get("board", "epi-meter"),
            "hw": self.hw.info(),
            "channels": [
                {"n": n, "cs": e["cs"], "cal": self.sources[n],
                 "meter_constant_imp_per_kwh": self.chips[n].calibration.meter_constant_imp_per_kwh}
                for n, e in enumerate(self.config["channels"])
            ],
            "spi_baud": self.config["spi"]["baud"],
            "uart_baud": self.config["uart"]["baud"],
            "rate_hz": 1000000.0 / self.period_us,
            "enc": self.encoding,
            "streaming": self.streaming,
            "config_error": self.config_error,
            "t": self.now_us(),
        })

    def _event(self, channel, kind, detail):
        self.send(telemetry.event(self.seq, self.now_us(), channel, kind, detail))

    # ---- chips ------------------------------------------------------------------------------
    def _chip_event(self, n):
        def on_event(kind, detail):
            self._event(n, kind, detail)
        return on_event

    def _fault(self, n, exc):
        if self.failing[n] != exc.kind or exc.kind == "implausible":
            self._event(n, exc.kind, exc.detail)  # each rejected reading says why
        self.failing[n] = exc.kind
        if exc.kind == "absent":
            self.retry_at[n] = self.now_us() + ABSENT_RETRY_US

    def _start_chip(self, n):
        """(Re-)start a chip; True when it runs. A re-start after a fault declares the
        energy from the last good energy read to the restart of metering as not metered
        (the chip's counter was lost or stopped): the counts leave it out, `unmetered` tells
        the Pi (`_send_unmetered`), as the direct path's driver does."""
        p = self.chips[n].protocol
        t_from = p.t_energy
        try:
            self.chips[n].start()
        except ChipFault as exc:
            self._fault(n, exc)
            return False
        if t_from is not None and p.t_energy is not None and p.t_energy > t_from:
            p.note_unmetered(t_from, p.t_energy, "re-start after %s" % (
                self.failing[n] or "a fault"))
        return True

    def _read_channel(self, n, t0):
        chip = self.chips[n]
        if self.failing[n] == "absent" and self.now_us() < self.retry_at[n]:
            return "absent"
        if not chip.ready and not self._start_chip(n):
            return self.failing[n] or "failed"
        try:
            status, t_energy, raw = chip.read_sample(self.now_us)
        except ChipFault as exc:
            self._fault(n, exc)
            if not chip.ready and exc.kind != "absent":
                # re-start at once: the chip meters again from now, not from the next sweep
                self._start_chip(n)
            return exc.kind
        if raw is None:  # before the chip's first complete measurement: counts, no values
            return NOT_READY
        if self.failing[n] is not None:
            if self.failing[n] != "implausible":
                self._event(n, "reinit", "channel %d delivers again" % n)
            self.failing[n] = None
        return (status, t_energy - t0, raw)

    def sweep(self):
        """Read every channel and send one telemetry line."""
        t0 = self.now_us()
        out = []
        for n in range(len(self.chips)):
            reading = self._read_channel(n, t0)
            out.append((n, self.chips[n].counts, reading))
        if self.encoding == "compact":
            line = telemetry.sweep_compact(self.seq, t0, out)
        else:
            line = telemetry.sweep_json(self.seq, t0, out)
        self.send(line)
        self.seq += 1
        for n in range(len(self.chips)):
            self._send_unmetered(n)

    def _send_unmetered(self, n):
        """Tell the Pi every interval the chip protocol could not meter (a reset, an absent
        or stuck chip, a checksum error: from the last good energy read to the restart of
        metering), as the direct path's driver does: the counts leave that energy out, the
        recorder declares it as an `energy not metered` gap. Sent once, then forgotten (the
        MCU's memory is small)."""
        lost = self.chips[n].protocol.unmetered
        for t_from, t_to, reason, est in lost:
            self.send(telemetry.message("ev", {
                "q": self.seq, "t": self.now_us(), "n": n, "kind": "unmetered",
                "t0": t_from, "t1": t_to, "d": reason, "est_j": est}))
        del lost[:]

    # ---- schedule ---------------------------------------------------------------------------
    def poll(self):
        """One step: answer commands, run a due sweep. Returns µs until the next sweep."""
        self._read_commands()
        now = self.now_us()
        if not self.streaming:
            self.next_due = None
            return 10000
        if self.next_due is None:
            self.next_due = now
        if now >= self.next_due:
            self.sweep()
            self.next_due += self.period_us
            now = self.now_us()
            if now >= self.next_due + self.period_us:  # overran: skip the slots that are
                # over, keep the latest one that has begun (it runs at once)
                missed = (now - self.next_due) // self.period_us
                self.skipped += missed
                self.next_due += missed * self.period_us
            # the first overrun is reported at once (from boot on), later ones at most every
            # LATE_REPORT_US; skips held back are reported with the next sweep after it
            if self.skipped and (self.late_reported_us is None
                                 or now - self.late_reported_us >= LATE_REPORT_US):
                self._event(None, "late", "%d sweep slot(s) skipped (sweep longer than "
                            "the period)" % self.skipped)
                self.late_reported_us = now
                self.skipped = 0
        return self.next_due - now

    def run(self):
        """The MCU's main loop (never returns)."""
        while True:
            wait = self.poll()
            if wait > 0:
                self.hw.sleep_us(min(wait, 2000))

    # ---- commands ---------------------------------------------------------------------------
    def _read_commands(self):
        uart = self.hw.uart
        if not uart.any():
            return
        data = uart.read()
        if not data:
            return
        for b in data:
            if b == 10:  # newline
                if not self._discarding and self._rx:
                    self.handle_line(bytes(self._rx))
                self._rx = bytearray()
                self._discarding = False
            elif not self._discarding:
                self._rx.append(b)
                if len(self._rx) > MAX_COMMAND_BYTES:
                    self._rx = bytearray()
                    self._discarding = True
                    self._error(None, "command longer than %d bytes" % MAX_COMMAND_BYTES)

    def _error(self, ident, text):
        self.errors += 1
        self.send(telemetry.message("err", {"id": ident, "error": text}))

    def _reply(self, ident, fields):
        fields["id"] = ident
        self.send(telemetry.message("r", fields))

    def handle_line(self, line):
        """Parse and execute one command line; a malformed one gets an `err` line."""
        text = line.strip()
        if not text:
            return
        if len(text) >= 5 and text[-5:-4] == b"*":
            payload = unseal(text)
            if payload is None:
                self._error(None, "bad CRC on command")
                return
            text = payload
        try:
            cmd = json.loads(text)
        except ValueError:
            self._error(None, "not a JSON command: %r" % (bytes(text[:40]),))
            return
        if not isinstance(cmd, dict) or not isinstance(cmd.get("cmd"), str):
            self._error(None, "a command is a JSON object with a \"cmd\" string")
            return
        self.commands += 1
        ident = cmd.get("id")
        name = cmd["cmd"]
        handler = getattr(self, "_cmd_" + name, None)
        if handler is None:
            self._error(ident, "unknown command %r" % name)
            return
        try:
            handler(ident, cmd)
        except ChipFault as exc:
            self._error(ident, "%s: %s" % (exc.kind, exc.detail))
        except (KeyError, TypeError, ValueError, CalibrationError, IndexError) as exc:
            self._error(ident, "%s: %s %s" % (name, type(exc).__name__, exc))

    def _cmd_ping(self, ident, cmd):
        self.send(telemetry.message("pong", {"id": ident, "t": self.now_us(), "q": self.seq}))

    def _cmd_hello(self, ident, cmd):
        self.send(self.hello_message())

    _cmd_version = _cmd_hello
    _cmd_info = _cmd_hello

    def _cmd_start(self, ident, cmd):
        self.streaming = True
        self._reply(ident, {"streaming": True})

    def _cmd_stop(self, ident, cmd):
        self.streaming = False
        self._reply(ident, {"streaming": False})

    def _cmd_rate(self, ident, cmd):
        hz = float(cmd["hz"])
        if not 0 < hz <= MAX_RATE_HZ:
            raise ValueError("hz must be in (0, %g]" % MAX_RATE_HZ)
        self.period_us = int(1000000 / hz)
        self.next_due = None
        self._reply(ident, {"rate_hz": 1000000.0 / self.period_us})

    def _cmd_encoding(self, ident, cmd):
        enc = cmd["enc"]
        if enc not in telemetry.ENCODINGS:
            raise ValueError("enc must be one of %s" % (telemetry.ENCODINGS,))
        self.encoding = enc
        self._reply(ident, {"enc": enc})

    def _channel(self, cmd):
        n = cmd["ch"]
        if not isinstance(n, int) or not 0 <= n < len(self.chips):
            raise ValueError("ch must be 0..%d" % (len(self.chips) - 1))
        return n

    @staticmethod
    def _register(cmd):
        r = cmd["reg"]
        if isinstance(r, str):
            return regs.reg(r)
        if isinstance(r, int) and r in regs.BY_ADDRESS:
            return regs.BY_ADDRESS[r]
        raise ValueError("unknown register %r" % (r,))

    def _cmd_read(self, ident, cmd):
        n = self._channel(cmd)
        r = self._register(cmd)
        chip = self.chips[n]
        value = chip.read_clear(r.address) if r.read_clear else chip.read(r.address)
        self._reply(ident, {"ch": n, "reg": r.name, "value": value})

    def _cmd_write(self, ident, cmd):
        n = self._channel(cmd)
        r = self._register(cmd)
        value = regs.check_u16(cmd["value"])
        if not r.writable:
            raise ValueError("%s is read-only" % r.name)
        self.chips[n].write(r.address, value)
        self._reply(ident, {"ch": n, "reg": r.name, "value": value})

    def _cmd_cal(self, ident, cmd):
        """Load a calibration record into a channel, re-start the chip, save it to flash."""
        n = self._channel(cmd)
        cal = Calibration.from_dict(cmd["calibration"])
        self.chips[n].calibration = cal
        self.sources[n] = "flash"
        self.config["channels"][n]["calibration"] = cal.to_dict()
        self.config["channels"][n]["meter_constant_imp_per_kwh"] = cal.meter_constant_imp_per_kwh
        saved = True
        try:
            self.hw.write_file(CONFIG_FILE, json.dumps(self.config))
        except OSError:
            saved = False
        self.chips[n].ready = False
        self._start_chip(n)
        self._reply(ident, {"ch": n, "cs1": cal.cs1(), "cs2": cal.cs2(), "saved": saved})
