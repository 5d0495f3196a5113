"""pyserial URL handler `emumcu://NAME`: a serial port wired to an emulated board's MCU.

The bridge's one way to fake a serial link, in the style of `emuchip://` (protocol_emuchip.py):
`meter.bridge.link.SerialLink` opens every port with `serial.serial_for_url`, so the daemon,
`epi meter firmware console`, the probe and the tests read the emulated firmware through the
same pyserial calls as a real `/dev/ttyAMA0`. The far end is registered with `register_port`
(`meter.bridge.emulate.serve_board` does it): an `McuEnd` that moves bytes with 8N1 wire
timing on the board's clock (the firmware runs as the port is read: on a SimulatedClock time
jumps, on the system clock it sleeps) and injects the UART faults. A lost far end
(`unplug@…`) is a `SerialException` on open, read and write, as a vanished USB adapter is.
"""

from __future__ import annotations

from typing import Protocol

from serial.serialutil import PortNotOpenError, SerialException

from meter.emulation.serial_port import EmulatedSerial
from meter.errors import LinkLost

SCHEME = "emumcu://"


class McuEnd(Protocol):
    """The far end of an `emumcu://` port (a `Link` whose reads run the firmware)."""

    def open(self) -> None: ...

    def read(self, timeout_s: float) -> bytes: ...

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


PORTS: dict[str, McuEnd] = {}


def register_port(name: str, end: McuEnd) -> str:
    """Wire `end` to `emumcu://NAME`; returns the URL."""
    PORTS[name] = end
    return SCHEME + name


def unregister_port(name: str) -> None:
    PORTS.pop(name, None)


class Serial(EmulatedSerial):
    """A pyserial port whose far end is `PORTS[NAME]`."""

    SCHEME = SCHEME

    def open(self) -> None:
        name = self._far_end_name()
        url = self.SCHEME + name
        end = PORTS.get(name)
        if end is None:
            raise SerialException(f"{url}: no emulated MCU registered there")
        try:
            end.open()
        except LinkLost as exc:
            raise SerialException(f"{url}: {exc}") from None
        self._end = end
        self._rx = bytearray()
        self.is_open = True

    def close(self) -> None:
        if self.is_open:
            self._end.close()
        self.is_open = False

    def _pull(self, timeout_s: float) -> None:
        try:
            self._rx += self._end.read(timeout_s)
        except LinkLost as exc:
            self.is_open = False
            raise SerialException(str(exc)) from None

    @property
    def in_waiting(self) -> int:
        if not self.is_open:
            raise PortNotOpenError()
        if not self._rx:
            self._pull(0.0)
        return len(self._rx)

    def read(self, size: int = 1) -> bytes:
        if not self.is_open:
            raise PortNotOpenError()
        if len(self._rx) < size:
            self._pull(0.0 if self.timeout is None and self._rx else float(self.timeout or 0.0))
        out = bytes(self._rx[:size])
        del self._rx[:size]
        return out

    def write(self, data: bytes) -> int:
        if not self.is_open:
            raise PortNotOpenError()
        try:
            self._end.write(bytes(data))
        except LinkLost as exc:
            self.is_open = False
            raise SerialException(str(exc)) from None
        return len(data)

    def reset_input_buffer(self) -> None:
        self._rx.clear()
