"""The emulated ATM90E26's UART side, a pyserial URL for it, and a pty server.

`ChipUart` is the chip's UART mode (datasheet §4.2): every transaction starts with 0xFE; a
read is FE, 0x80|addr, checksum and is answered with MSB, LSB, (MSB+LSB) mod 256; a write is
FE, addr, MSB, LSB, (addr+MSB+LSB) mod 256 and is answered with the same checksum. Baud must
be 2400 or 9600 (±2 %); the chip answers 1 ms after the last byte (the datasheet allows 5 ms);
a gap of more than 20 ms between host bytes aborts the transaction; a bad checksum or a stray
byte gets no answer, and after any failure the chip ignores the line until it has been quiet
for 20 ms. `set_noise(rate)` flips bits on the wire in both directions.

Two ways to connect a host-side `UartBus` to it:
- `register_port(name, chip_uart)` -> URL `emuchip://name` for `serial.serial_for_url`
  (handler in `meter.emulation.protocol_emuchip`; byte timing follows the chip's clock, so with a
  `SimulatedClock` it is deterministic and instant);
- `PtyChipServer`: a real pseudo-terminal pair served by a thread, for the real serial path.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import termios
import threading
import tty

from meter.chip.frames import UART_START, uart_read_reply
from meter.clock import Clock
from meter.emulation.chip_emulator import EmulatedChip

ABORT_GAP_NS = 20_000_000
REPLY_DELAY_NS = 1_000_000
SUPPORTED_BAUDS = (2400, 9600)

PORTS: dict[str, ChipUart] = {}


def register_port(name: str, chip_uart: ChipUart) -> str:
    """Make `chip_uart` reachable as the pyserial URL `emuchip://<name>`; returns the URL."""
    PORTS[name] = chip_uart
    return f"emuchip://{name}"


def unregister_port(name: str) -> None:
    PORTS.pop(name, None)


def byte_time_ns(baud: int) -> int:
    return int(10 * 1_000_000_000 / baud)  # start + 8 data + stop bits


class ChipUart:
    """The UART transaction engine of one `EmulatedChip`."""

    def __init__(self, chip: EmulatedChip, *, seed: int = 0) -> None:
        self.chip = chip
        self.noise_rate = 0.0
        self._rng = random.Random(seed)
        self._buf: list[int] = []
        self._last_ns: int | None = None
        self._recovering = False
        self.stats = {"transactions": 0, "failures": 0, "noise_bits": 0}

    @property
    def clock(self) -> Clock:
        return self.chip.clock

    def set_noise(self, rate: float, seed: int | None = None) -> None:
        """Fault: flip each bit on the line (both directions) with probability `rate`."""
        self.noise_rate = float(rate)
        if seed is not None:
            self._rng.seed(seed)

    def _noisy(self, b: int) -> int:
        if self.noise_rate > 0:
            for bit in range(8):
                if self._rng.random() < self.noise_rate:
                    b ^= 1 << bit
                    self.stats["noise_bits"] += 1
        return b

    def _fail(self) -> list[tuple[int, int]]:
        self.stats["failures"] += 1
        self._buf = []
        self._recovering = True
        return []

    def receive(self, data: bytes, t_first_ns: int, baud: int) -> list[tuple[int, int]]:
        """Host bytes on the line, the first starting at `t_first_ns`, at `baud`.

        Returns the chip's reply as [(t_end_of_byte_ns, byte), ...] (possibly empty).
        """
        bt = byte_time_ns(baud)
        out: list[tuple[int, int]] = []
        for i, b in enumerate(data):
            out += self._byte(self._noisy(b), t_first_ns + (i + 1) * bt, baud)
        return [(t, self._noisy(b)) for t, b in out]

    def _byte(self, b: int, t_ns: int, baud: int) -> list[tuple[int, int]]:
        chip = self.chip
        if chip.absent:
            return []
        gap = None if self._last_ns is None else t_ns - self._last_ns
        self._last_ns = t_ns
        if not any(abs(baud - ok) <= 0.02 * ok for ok in SUPPORTED_BAUDS):
            return self._fail()  # the chip cannot decode this baud: framing errors
        if self._recovering:
            if gap is not None and gap <= ABORT_GAP_NS:
                return []
            self._recovering = False
        if self._buf and gap is not None and gap > ABORT_GAP_NS:
            self.stats["failures"] += 1
            self._buf = []  # aborted; this byte may start a new transaction
        if not self._buf:
            if b != UART_START:
                return self._fail()
            self._buf = [b]
            return []
        self._buf.append(b)
        rw = self._buf[1]
        address = rw & 0x7F
        t_reply = t_ns + REPLY_DELAY_NS
        bt = byte_time_ns(baud)
        stuck = chip.stuck_word
        if rw & 0x80 and len(self._buf) == 3:
            if self._buf[2] != rw:
                return self._fail()
            self._buf = []
            self.stats["transactions"] += 1
            if stuck is not None:
                value = stuck
            else:
                value = chip.read_register(address)
            return [(t_reply + (j + 1) * bt, x) for j, x in enumerate(uart_read_reply(value))]
        if not rw & 0x80 and len(self._buf) == 5:
            msb, lsb, chk = self._buf[2], self._buf[3], self._buf[4]
            self._buf = []
            if (rw + msb + lsb) & 0xFF != chk:
                return self._fail()
            self.stats["transactions"] += 1
            if stuck is not None:
                return []
            chip.write_register(address, (msb << 8) | lsb)
            return [(t_reply + bt, chk)]
        return []


_BAUD_CONSTANTS = {
    getattr(termios, f"B{b}"): b for b in (1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200)
}


class PtyChipServer:
    """Serve a `ChipUart` on a pseudo-terminal; `port` is the path for pyserial to open.

    Arrival times come from the chip's clock (use `SystemClock` here); the baud the host set
    on the tty is read back with termios, so a wrong baud gets no answer, as on a real line.
    """

    def __init__(self, chip_uart: ChipUart) -> None:
        self.chip_uart = chip_uart
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)
        self.port = os.ttyname(self._slave)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="pty-chip", daemon=True)

    def start(self) -> PtyChipServer:
        self._thread.start()
        return self

    def _baud(self) -> int:
        speed = termios.tcgetattr(self._slave)[5]
        return _BAUD_CONSTANTS.get(speed, 0)

    def _serve(self) -> None:
        clock = self.chip_uart.clock
        while not self._stop.is_set():
            ready, _, _ = select.select([self._master], [], [], 0.02)
            if not ready:
                continue
            try:
                data = os.read(self._master, 256)
            except OSError:
                return
            now = clock.monotonic_ns()
            baud = self._baud()
            t_first = now - len(data) * byte_time_ns(baud or 9600)
            reply = self.chip_uart.receive(data, t_first, baud)
            if reply:  # the first reply byte starts one byte time before it ends
                start = reply[0][0] - byte_time_ns(baud or 9600)
                clock.sleep_until(start)
                os.write(self._master, bytes(b for _, b in reply))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        for fd in (self._master, self._slave):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> PtyChipServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
