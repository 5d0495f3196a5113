"""Buses onto emulated chips: direct (`EmulatedSpiBus`) and a spidev look-alike.

`EmulatedSpiBus` hands each 3-byte frame to an `EmulatedChip`; with `frame_time_s` it also
lets the chip's clock advance by one frame's time on the wire (24 bits at 160 kHz = 150 µs),
which models real bus timing for benchmarks and for the time stamps of a simulated run.

`EmulatedSpidev` is a stand-in for the `spidev` module: `SpiDev().open(bus, device)`,
`mode`, `max_speed_hz`, `no_cs`, `xfer2`. Frames go to the chip wired to that kernel
chip-select, or — when the device is opened with `no_cs` — to whichever chip has its GPIO
chip-select line low (read from gpiozero pins, so the mock pin factory can drive it). This
runs the real `SpidevBus` / `GpioCsSpiBus` code paths without hardware.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from epi.formats.json_types import JSON
from meter.bus.base import MAX_SPEED_HZ, SpiFrameBus
from meter.clock import is_simulated
from meter.emulation.chip_emulator import EmulatedChip

FRAME_TIME_160K_S = 24 / 160e3
BATCH_NS = 2_000_000



class _SpiDevState(Protocol):
    """What a transfer reads of the fake `spidev.SpiDev` it came through."""

    bus: int | None
    device: int | None
    mode: int
    no_cs: bool
    closed: bool

class EmulatedSpiBus(SpiFrameBus):
    """SPI straight into an `EmulatedChip`."""

    kind = "emulated-spi"

    def __init__(self, chip: EmulatedChip, frame_time_s: float | None = None) -> None:
        self.chip = chip
        self.frame_time_ns = int(frame_time_s * 1e9) if frame_time_s else 0
        self.frames = 0
        self._wire_free_ns = 0  # when the (emulated) wire is free again

    def transfer(self, frame: bytes) -> bytes:
        self.frames += 1
        clock = self.chip.clock
        if self.frame_time_ns:
            if is_simulated(clock):
                clock.sleep_until(clock.monotonic_ns() + self.frame_time_ns)
            else:
                # Real time: frames queue on the wire; wait only once the wire is more than
                # BATCH_NS behind. A sleep per 150 µs frame would add the OS's wake-up latency
                # to every frame, which no real SPI transfer has. The wait ends while half a
                # batch is still queued (as a driver refills its transfer queue before it
                # drains): waking when the wire is already free left it idle for every
                # wake-up's latency, an emulator cost the sweep rate was charged.
                now = clock.monotonic_ns()
                self._wire_free_ns = max(self._wire_free_ns, now) + self.frame_time_ns
                if self._wire_free_ns - now > BATCH_NS:
                    clock.sleep_until(self._wire_free_ns - BATCH_NS // 2)
        return self.chip.spi_transfer(bytes(frame))

    def describe(self) -> dict[str, JSON]:
        return {"kind": self.kind, "frame_time_s": self.frame_time_ns / 1e9 or None}


class EmulatedSpidev:
    """A `spidev`-module stand-in wired to emulated chips.

    Args:
        kernel_cs: {(bus, device): chip} for chips on kernel chip-selects CE<device>.
        gpio_cs: [(is_selected, chip)] for chips on GPIO chip-selects; `is_selected()` says
            whether that chip's CS line is low now.
        idle_level: what MISO reads when no chip drives it.
    """

    def __init__(
        self,
        kernel_cs: dict[tuple[int, int], EmulatedChip] | None = None,
        gpio_cs: Sequence[tuple[Callable[[], bool], EmulatedChip]] = (),
        idle_level: int = 0xFF,
    ) -> None:
        self.kernel_cs = dict(kernel_cs or {})
        self.gpio_cs = list(gpio_cs)
        self.idle_level = idle_level
        self.log: list[dict] = []  # every xfer2: device, settings, frame, selected chips
        outer = self

        class SpiDev:
            def __init__(self) -> None:
                self.bus: int | None = None
                self.device: int | None = None
                self.mode = 0
                self.max_speed_hz = 500_000  # the kernel/gpiozero default the chip can't take
                self.bits_per_word = 8
                self.no_cs = False
                self.closed = False

            def open(self, bus: int, device: int) -> None:
                self.bus, self.device = bus, device

            def close(self) -> None:
                self.closed = True

            def xfer2(
                self, values: list[int], speed_hz: int = 0, delay_usecs: int = 0,
                bits_per_word: int = 0,
            ) -> list[int]:
                return outer._xfer(self, list(values), speed_hz or self.max_speed_hz, delay_usecs)

        self.SpiDev = SpiDev

    def _xfer(self, dev: _SpiDevState, values: list[int], speed_hz: int, delay_us: int
              ) -> list[int]:
        if dev.closed or dev.bus is None or dev.device is None:  # never opened, or closed
            raise OSError(9, "Bad file descriptor")
        selected = []
        if not dev.no_cs:
            chip = self.kernel_cs.get((dev.bus, dev.device))
            if chip is not None:
                selected.append(chip)
        selected += [chip for is_low, chip in self.gpio_cs if is_low()]
        entry = {
            "bus": dev.bus,
            "device": dev.device,
            "mode": dev.mode,
            "speed_hz": speed_hz,
            "no_cs": dev.no_cs,
            "delay_us": delay_us,
            "frame": bytes(values),
            "selected": len(selected),
        }
        self.log.append(entry)
        if dev.mode != 3 or speed_hz > MAX_SPEED_HZ:
            # wrong clock phase or too fast: the chip samples garbage; model it as all ones
            return [0xFF] * len(values)
        out = [self.idle_level] * len(values)
        for chip in selected:  # several chips driving MISO at once: wired-AND of the outputs
            reply = chip.spi_transfer(bytes(values))
            out = [a & b for a, b in zip(out, reply, strict=True)]
        return out
