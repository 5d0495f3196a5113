"""The serial link to the board's MCU (pyserial), and what a lost link looks like.

`SerialLink.read(timeout_s)` returns the bytes that arrived (b"" on timeout) and raises
`LinkLost` when the port fails (an unplugged USB adapter, a pty whose other end closed);
`open()` raises `LinkLost` while the port is missing or held by another process (the port is
opened exclusively), so the recorder can keep retrying.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from meter.errors import LinkLost


class Link(Protocol):
    def open(self) -> None: ...
    def read(self, timeout_s: float) -> bytes: ...
    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def describe(self) -> dict: ...


class SerialLink:
    """A pyserial port, 8N1, no flow control."""

    def __init__(self, port: str, baud: int) -> None:
        self.port = port
        self.baud = baud
        self.ser: Any = None  # a serial.Serial: pyserial ships no type information

    def open(self) -> None:
        import serial

        self.close()
        if "meter.emulation" not in serial.protocol_handler_packages:  # emumcu://, emuchip://
            serial.protocol_handler_packages.append("meter.emulation")
        try:
            # exclusive: a second reader (`firmware console` beside the daemon) would steal
            # lines; pyserial locks the device (flock) and the second open fails
            self.ser = serial.serial_for_url(self.port, self.baud, timeout=0.05,
                                             write_timeout=1.0, exclusive=True)
        except (serial.SerialException, OSError, ValueError) as exc:
            self.ser = None
            raise LinkLost(f"{self.port}: {exc}") from None

    def read(self, timeout_s: float) -> bytes:
        import serial

        if self.ser is None:
            raise LinkLost(f"{self.port}: not open")
        try:
            self.ser.timeout = timeout_s
            first = self.ser.read(1)
            if not first:
                return b""
            waiting = self.ser.in_waiting
            return first + (self.ser.read(waiting) if waiting else b"")
        except (serial.SerialException, OSError, TypeError) as exc:
            self.close()
            raise LinkLost(f"{self.port}: {exc}") from None

    def write(self, data: bytes) -> None:
        import serial

        if self.ser is None:
            raise LinkLost(f"{self.port}: not open")
        try:
            self.ser.write(data)
        except (serial.SerialException, OSError) as exc:
            self.close()
            raise LinkLost(f"{self.port}: {exc}") from None

    def close(self) -> None:
        if self.ser is not None:
            with contextlib.suppress(Exception):  # closing a port that already failed
                self.ser.close()
            self.ser = None

    def describe(self) -> dict:
        return {"kind": "serial", "port": self.port, "baud": self.baud}


def wire_ns(n_bytes: int, baud: int) -> int:
    """Time n bytes take on an 8N1 UART (10 bits each)."""
    return round(n_bytes * 10 * 1e9 / baud)
