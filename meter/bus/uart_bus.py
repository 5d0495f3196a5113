"""ATM90E26 in UART mode (USEL high) over pyserial.

Each register access is one transaction (datasheet §4.2): read = FE, 0x80|addr, addr-checksum
answered by MSB, LSB, (MSB+LSB) mod 256; write = FE, addr, MSB, LSB, checksum answered by the
same checksum. 8N1 at 2400 or 9600 baud. The chip answers within 5 ms or not at all (bad
checksum), so a missing or malformed answer raises `BusTimeout`/`BusError`; after any failure
the line is left quiet for 20 ms, as the chip requires before the next transaction.

`port` is a device path (/dev/ttyAMA0) or any pyserial URL, including `emuchip://NAME` for an
emulated chip (see `meter.emulation.uart_emulator`).
"""

from __future__ import annotations

from types import ModuleType

from epi.formats.json_types import JSON
from meter.bus.base import Bus
from meter.chip.frames import uart_parse_read_reply, uart_read_request, uart_write_request
from meter.clock import Clock, SystemClock
from meter.errors import BusError, BusTimeout

QUIET_AFTER_FAILURE_NS = 20_000_000
REPLY_WINDOW_S = 0.005


def _serial_module() -> ModuleType:
    try:
        import serial
    except ImportError as exc:
        raise BusError("the module 'pyserial' is missing: pip install -e '.[meter]'") from exc
    if "meter.emulation" not in serial.protocol_handler_packages:
        serial.protocol_handler_packages.append("meter.emulation")
    return serial


class UartBus(Bus):
    """One chip on a serial port in the chip's UART mode."""

    kind = "uart"

    def __init__(
        self,
        port: str,
        *,
        baudrate: int = 9600,
        timeout_s: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        if baudrate not in (2400, 9600):
            raise ValueError(f"UART baud {baudrate}: the ATM90E26 talks 2400 or 9600")
        serial = _serial_module()
        self.port_name = port
        self.baudrate = baudrate
        # reply within 5 ms, then 3 bytes of 10 bits, plus scheduling slack
        default_timeout_s = REPLY_WINDOW_S + 30 / baudrate + 0.02
        self.timeout_s = timeout_s if timeout_s is not None else default_timeout_s
        self.clock: Clock = clock if clock is not None else SystemClock()
        try:
            self._port = serial.serial_for_url(
                port, baudrate=baudrate, bytesize=8, parity="N", stopbits=1,
                timeout=self.timeout_s, write_timeout=1.0,
            )
        except (serial.SerialException, ValueError, OSError) as exc:
            raise BusError(f"cannot open serial port {port}: {exc}") from exc
        self._quiet_until_ns = 0
        self.stats = {"transactions": 0, "timeouts": 0, "checksum_errors": 0}

    def _transaction(self, request: bytes, reply_len: int) -> bytes:
        now = self.clock.monotonic_ns()
        if now < self._quiet_until_ns:
            self.clock.sleep_until(self._quiet_until_ns)
        self.stats["transactions"] += 1
        try:
            self._port.reset_input_buffer()
            self._port.write(request)
            reply = self._port.read(reply_len)
        except OSError as exc:
            self._failed()
            raise BusError(f"{self.port_name}: {exc}") from exc
        if len(reply) < reply_len:
            self.stats["timeouts"] += 1
            self._failed()
            raise BusTimeout(
                f"{self.port_name}: {len(reply)} of {reply_len} reply bytes within "
                f"{self.timeout_s * 1000:.0f} ms"
            )
        return reply

    def _failed(self) -> None:
        self._quiet_until_ns = self.clock.monotonic_ns() + QUIET_AFTER_FAILURE_NS

    def read_register(self, address: int) -> int:
        reply = self._transaction(uart_read_request(address), 3)
        try:
            return uart_parse_read_reply(reply)
        except ValueError as exc:
            self.stats["checksum_errors"] += 1
            self._failed()
            raise BusError(f"{self.port_name}: {exc}") from exc

    def write_register(self, address: int, value: int) -> None:
        request = uart_write_request(address, value)
        echo = self._transaction(request, 1)
        if echo[0] != request[-1]:
            self.stats["checksum_errors"] += 1
            self._failed()
            raise BusError(
                f"{self.port_name}: write echo 0x{echo[0]:02X}, expected 0x{request[-1]:02X}"
            )

    def close(self) -> None:
        port = getattr(self, "_port", None)
        if port is not None and port.is_open:
            port.close()

    def describe(self) -> dict[str, JSON]:
        return {"kind": self.kind, "port": self.port_name, "baudrate": self.baudrate}
