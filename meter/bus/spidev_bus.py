"""ATM90E26 over Linux spidev with the kernel driving chip-select (CE0/CE1).

Mode 3, 160 kHz by default (the datasheet maximum; gpiozero and spidev default to far more),
8-bit words, and exactly one `xfer2` per 24-bit frame so CS stays low for the whole frame and
goes high between frames (the chip needs CS high→low for every access). `delay_us` (default
5 µs) holds CS low after the last clock, honouring tCSD ≈ 3.7 µs.
"""

from __future__ import annotations

from typing import Protocol

from epi.formats.json_types import JSON
from meter.bus.base import MAX_SPEED_HZ, SpiFrameBus, check_spi_settings
from meter.errors import BusError


class SpiDevice(Protocol):
    """What the buses use of a `spidev.SpiDev` (or the emulator's stand-in)."""

    mode: int
    max_speed_hz: int
    bits_per_word: int
    no_cs: bool

    def open(self, bus: int, device: int) -> None: ...
    def xfer2(self, values: list[int], speed_hz: int = 0, delay_us: int = 0) -> list[int]: ...
    def close(self) -> None: ...


class SpidevModule(Protocol):
    """The `spidev` module (or `meter.emulation.emulated_bus.EmulatedSpidev`)."""

    def SpiDev(self) -> SpiDevice: ...  # spidev's name


def import_spidev(spidev_module: SpidevModule | None) -> SpidevModule:
    if spidev_module is not None:
        return spidev_module
    try:
        import spidev
    except ImportError as exc:
        raise BusError(
            "the Python module 'spidev' is missing: pip install -e '.[meter]' on the meter Pi"
        ) from exc
    module: SpidevModule = spidev
    return module


def open_spidev(module: SpidevModule, bus: int, device: int, speed_hz: int,
                mode: int) -> SpiDevice:
    """A `SpiDev` opened on /dev/spidev<bus>.<device> in `mode` at `speed_hz` with 8-bit
    words (the ATM90E26's frame settings); a BusError naming the device if that fails."""
    dev = module.SpiDev()
    try:
        dev.open(bus, device)
        dev.mode = mode
        dev.max_speed_hz = speed_hz
        dev.bits_per_word = 8
    except OSError as exc:
        raise BusError(f"cannot open /dev/spidev{bus}.{device}: {exc}") from exc
    return dev


class SpidevBus(SpiFrameBus):
    """One chip on /dev/spidev<bus>.<device>, chip-select driven by the kernel."""

    kind = "spidev"

    def __init__(
        self,
        bus: int = 0,
        device: int = 0,
        *,
        speed_hz: int = MAX_SPEED_HZ,
        mode: int = 3,
        delay_us: int = 5,
        spidev_module: SpidevModule | None = None,
    ) -> None:
        check_spi_settings(speed_hz, mode)
        module = import_spidev(spidev_module)
        self.bus, self.device = bus, device
        self.speed_hz, self.mode, self.delay_us = speed_hz, mode, delay_us
        self._dev = open_spidev(module, bus, device, speed_hz, mode)
        self._closed = False

    def transfer(self, frame: bytes) -> bytes:
        if self._closed:
            raise BusError(f"/dev/spidev{self.bus}.{self.device} is closed")
        try:
            rx = self._dev.xfer2(list(frame), self.speed_hz, self.delay_us)
        except OSError as exc:
            raise BusError(f"/dev/spidev{self.bus}.{self.device}: transfer failed: {exc}") from exc
        return bytes(rx)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._dev.close()

    def describe(self) -> dict[str, JSON]:
        return {
            "kind": self.kind,
            "device": f"/dev/spidev{self.bus}.{self.device}",
            "chip_select": f"CE{self.device}",
            "speed_hz": self.speed_hz,
            "mode": self.mode,
            "cs_hold_delay_us": self.delay_us,
        }
