"""The RP2350 of the epi-meter board, emulated on CPython: its clock, peripherals and flash.

`EmulatedMcu` is the `hw` object the firmware (`meter.firmware.app.Firmware`) runs on:
`machine_stub` SPI/Pin wired to register-level `EmulatedChip`s, a UART whose bytes go to a
pseudo-terminal or a simulated wire, a flash dictionary, and an MCU clock that drifts
against the host's (`McuClock`: a crystal `drift_ppm` off, started at an arbitrary count,
with `ticks_us` wrapping at 2**tick_bits like MicroPython's 30-bit rp2 ticks).

All of it runs on the host's clock object (SystemClock or SimulatedClock), so a simulated
run keeps every chip, the MCU and the Pi on one consistent time line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from meter.clock import Clock
from meter.emulation import machine_stub

if TYPE_CHECKING:
    from meter.emulation.chip_emulator import EmulatedChip


class McuClock:
    """MCU microseconds as a function of host CLOCK_MONOTONIC: linear with a drift."""

    def __init__(self, clock: Clock, *, drift_ppm: float = 0.0, start_us: int = 0,
                 tick_bits: int = 30) -> None:
        self.clock = clock
        self.rate = 1.0 + drift_ppm * 1e-6
        self.drift_ppm = drift_ppm
        self.origin_ns = clock.monotonic_ns()
        self.start_us = start_us
        self.mask = (1 << tick_bits) - 1
        self.half = 1 << (tick_bits - 1)

    def mcu_us_at(self, t_mono_ns: int) -> float:
        """The true (unwrapped) MCU microsecond count at a host time (for tests' truth)."""
        return self.start_us + (t_mono_ns - self.origin_ns) * self.rate / 1000.0

    def ticks_us(self) -> int:
        return int(self.mcu_us_at(self.clock.monotonic_ns())) & self.mask

    def ticks_diff(self, a: int, b: int) -> int:
        return ((a - b + self.half) & self.mask) - self.half

    def host_ns_for(self, mcu_us: float) -> int:
        """Host nanoseconds that `mcu_us` MCU microseconds take."""
        return max(0, round(mcu_us * 1000.0 / self.rate))


class EmulatedMcu:
    """`hw` for the firmware: peripherals on machine_stub, chips from the emulator."""

    def __init__(
        self,
        clock: Clock,
        chips: dict[int, EmulatedChip],
        *,
        uart_sink: Callable[[bytes], None] | None = None,
        mcu_clock: McuClock | None = None,
        spi_baud: int = 160_000,
        model_spi_time: bool = True,
        files: dict[str, str] | None = None,
        boot_id: str | None = None,
    ) -> None:
        self.clock = clock
        self.mcu_clock = mcu_clock or McuClock(clock)
        self.pins: dict[int, machine_stub.Pin] = {}
        self.chips = dict(chips)
        self.uart = machine_stub.UART(0, baudrate=115200)
        self.uart.sink = uart_sink
        self.spi = machine_stub.SPI(0, baudrate=spi_baud, polarity=1, phase=1,
                                    pins=self.pins, chips=self.chips)
        if model_spi_time:
            self.spi.on_transfer = self._wire_time
        self.files = files if files is not None else {}
        self._boot_id = boot_id or os.urandom(4).hex()
        self.ticks_diff = self.mcu_clock.ticks_diff

    def _wire_time(self, seconds: float) -> None:
        self.clock.sleep_until(self.clock.monotonic_ns() + round(seconds / self.mcu_clock.rate
                                                                  * 1e9))

    def ticks_us(self) -> int:
        return self.mcu_clock.ticks_us()

    def sleep_us(self, us: int) -> None:
        self.clock.sleep_until(self.clock.monotonic_ns() + self.mcu_clock.host_ns_for(us))

    def pin(self, number: int) -> machine_stub.Pin:
        p = machine_stub.Pin(number, machine_stub.Pin.OUT, value=1)
        self.pins[number] = p
        return p

    def read_file(self, name: str) -> str:
        if name not in self.files:
            raise OSError(2, "ENOENT")
        return self.files[name]

    def write_file(self, name: str, text: str) -> None:
        self.files[name] = text

    def boot_id(self) -> str:
        return self._boot_id

    def info(self) -> dict:
        return {"mcu": "RP2350 (emulated on CPython)", "freq_hz": machine_stub.freq(),
                "uid": machine_stub.unique_id().hex(), "emulated": True,
                "drift_ppm": self.mcu_clock.drift_ppm}
