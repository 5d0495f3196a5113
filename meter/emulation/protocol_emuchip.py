"""pyserial URL handler `emuchip://NAME`: a serial port wired to an emulated chip's UART.

`meter.bus.uart_bus` adds `meter.emulation` to `serial.protocol_handler_packages`, so
`serial.serial_for_url("emuchip://ch0", baudrate=9600, timeout=0.05)` finds this module.
Ports are registered with `uart_emulator.register_port`. Byte timing follows the chip's
clock: a write takes 10 bit-times per byte on the wire, and `read` waits (or, on a
`SimulatedClock`, jumps) until the reply's bytes have arrived or the timeout has passed.
"""

from __future__ import annotations

from serial.serialutil import PortNotOpenError, SerialException

from meter.clock import Clock
from meter.emulation import uart_emulator as emulator_uart
from meter.emulation.serial_port import EmulatedSerial


class Serial(EmulatedSerial):
    """A pyserial port whose far end is `emulator_uart.PORTS[NAME]`."""

    SCHEME = "emuchip://"

    def open(self) -> None:
        name = self._far_end_name()
        chip_uart = emulator_uart.PORTS.get(name)
        if chip_uart is None:
            raise SerialException(f"no emulated chip registered as {name!r}")
        self._chip_uart = chip_uart
        self._rx: list[tuple[int, int]] = []
        self.is_open = True

    def close(self) -> None:
        self.is_open = False

    @property
    def _clock(self) -> Clock:
        return self._chip_uart.clock

    @property
    def in_waiting(self) -> int:
        now = self._clock.monotonic_ns()
        return sum(1 for t, _ in self._rx if t <= now)

    def write(self, data: bytes) -> int:
        if not self.is_open:
            raise PortNotOpenError()
        data = bytes(data)
        clock = self._clock
        t0 = clock.monotonic_ns()
        self._rx += self._chip_uart.receive(data, t0, int(self.baudrate))
        self._rx.sort()
        clock.sleep_until(t0 + len(data) * emulator_uart.byte_time_ns(int(self.baudrate)))
        return len(data)

    def read(self, size: int = 1) -> bytes:
        if not self.is_open:
            raise PortNotOpenError()
        clock = self._clock
        now = clock.monotonic_ns()
        timeout_ns = None if self.timeout is None else int(self.timeout * 1e9)
        deadline = None if timeout_ns is None else now + timeout_ns
        got = [(t, b) for t, b in self._rx if deadline is None or t <= deadline][:size]
        self._rx = self._rx[len(got) :]
        if len(got) == size and got:
            clock.sleep_until(got[-1][0])
        elif deadline is not None:
            clock.sleep_until(deadline)
        return bytes(b for _, b in got)

    def reset_input_buffer(self) -> None:
        now = self._clock.monotonic_ns()
        self._rx = [(t, b) for t, b in self._rx if t > now]
