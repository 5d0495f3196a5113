"""ATM90E26 over spidev with chip-select lines driven by gpiozero.

The epi-meter carries four chips but SPI0 on a Pi has two kernel chip-selects, so chips can
sit on plain GPIO lines instead. Each `GpioCsSpiBus` owns one CS line: it is claimed as an
output driven HIGH (inactive) the moment the bus is constructed — before the SPI device is
opened — so no chip ever sees a stray select at start-up. A frame is CS low, one `xfer2` of
3 bytes, CS high.

All GPIO-CS chips on a bus share one spidev handle, opened with `no_cs` so the kernel does not
toggle its own CE line; where the controller refuses `no_cs`, that CE must be left unwired
(see docs/meter.md).
"""

from __future__ import annotations

import threading

from epi.formats.json_types import JSON
from meter.bus.base import MAX_SPEED_HZ, SpiFrameBus, check_spi_settings
from meter.bus.spidev_bus import SpidevModule, import_spidev, open_spidev
from meter.errors import BusError


class _SharedSpidev:
    """One spidev handle shared by the GPIO-CS buses on a device, with a lock and refcount."""

    def __init__(self, module: SpidevModule, bus: int, device: int, speed_hz: int,
                 mode: int) -> None:
        self.dev = open_spidev(module, bus, device, speed_hz, mode)
        self.key: tuple[object, int, int] = (module, bus, device)
        try:
            self.dev.no_cs = True
            self.no_cs = True
        except (OSError, AttributeError):
            self.no_cs = False
        self.lock = threading.Lock()
        self.users = 0


_SHARED: dict[tuple[object, int, int], _SharedSpidev] = {}
_SHARED_LOCK = threading.Lock()


class GpioCsSpiBus(SpiFrameBus):
    """One chip whose chip-select is GPIO `cs_pin` (BCM number or gpiozero pin name)."""

    kind = "spidev-gpio-cs"

    def __init__(
        self,
        cs_pin: int | str,
        *,
        bus: int = 0,
        device: int = 0,
        speed_hz: int = MAX_SPEED_HZ,
        mode: int = 3,
        pin_factory: object | None = None,
        spidev_module: SpidevModule | None = None,
    ) -> None:
        check_spi_settings(speed_hz, mode)
        try:
            from gpiozero import DigitalOutputDevice
        except ImportError as exc:
            raise BusError(
                "the Python module 'gpiozero' is missing: pip install -e '.[meter]'"
            ) from exc
        # CS first, idle high: active_high=False makes "off" drive the line high.
        try:
            self.cs = DigitalOutputDevice(
                cs_pin, active_high=False, initial_value=False, pin_factory=pin_factory
            )
        except Exception as exc:  # gpiozero raises many types (BadPinFactory, GPIOPinInUse...)
            raise BusError(f"cannot claim chip-select GPIO {cs_pin}: {exc}") from exc
        self.cs_pin = cs_pin
        self.bus, self.device, self.speed_hz, self.mode = bus, device, speed_hz, mode
        module = import_spidev(spidev_module)
        key = (module, bus, device)
        with _SHARED_LOCK:
            shared = _SHARED.get(key)
            if shared is None:
                try:
                    shared = _SharedSpidev(module, bus, device, speed_hz, mode)
                except BusError:
                    self.cs.close()
                    raise
                _SHARED[key] = shared
            shared.users += 1
        self._shared: _SharedSpidev | None = shared

    def transfer(self, frame: bytes) -> bytes:
        shared = self._shared
        if shared is None:
            raise BusError(f"GPIO-CS bus on GPIO {self.cs_pin} is closed")
        with shared.lock:
            self.cs.on()  # CS low
            try:
                rx = shared.dev.xfer2(list(frame), self.speed_hz, 0)
            except OSError as exc:
                raise BusError(f"/dev/spidev{self.bus}.{self.device}: {exc}") from exc
            finally:
                self.cs.off()  # CS high
        return bytes(rx)

    def close(self) -> None:
        shared, self._shared = self._shared, None
        if shared is None:
            return
        self.cs.close()
        with _SHARED_LOCK:
            shared.users -= 1
            if shared.users == 0:
                _SHARED.pop(shared.key, None)
                shared.dev.close()

    def describe(self) -> dict[str, JSON]:
        return {
            "kind": self.kind,
            "device": f"/dev/spidev{self.bus}.{self.device}",
            "chip_select": f"GPIO{self.cs_pin}",
            "kernel_cs_disabled": bool(self._shared and self._shared.no_cs),
            "speed_hz": self.speed_hz,
            "mode": self.mode,
        }
