"""The board's MCU emulated on this machine: the real firmware on CPython at the far end of a
simulated UART wire, which the bridge recorder reads through pyserial (`emumcu://`).

* `EmulatedBoard` builds the register-level chips (meter.emulation.chip_emulator), the MCU
  (`EmulatedMcu`: machine stand-in, drifting crystal, 30-bit ticks) and boots the firmware;
  `reset_mcu()` reboots it mid-stream (new boot id, counts and seq from 0, chips re-set).
* `SimLink` is the wire: reading runs the firmware's `poll()` and delivers bytes after their
  time on an 8N1 wire at `baud` (the MCU's transmit buffer and host latency modelled), on
  the system clock or a SimulatedClock (hours in seconds). `meter/bridge/emulated_port.py`
  puts it behind an `emumcu://` port URL, so the recorder opens it with `SerialLink` exactly
  as it opens /dev/ttyAMA0 on a Pi.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from meter.bridge.link import wire_ns
from meter.clock import Clock
from meter.emulation.mcu import EmulatedMcu, McuClock
from meter.emulation.power_models import PowerModel
from meter.errors import LinkLost
from meter.firmware.app import Firmware
from meter.firmware.config import default_config


class EmulatedBoard:
    """Chips + MCU + firmware of one emulated epi-meter board."""

    def __init__(self, clock: Clock, power_models: list[PowerModel], *,
                 meter_constant: float = 1e8,
                 baud: int = 115200, rate_hz: float = 10.0, encoding: str = "json",
                 drift_ppm: float = 30.0, model_spi_time: bool = True, tick_bits: int = 30,
                 refresh_period_s: float = 0.2, seed: int = 0) -> None:
        from meter.emulation.chip_emulator import EmulatedChip

        self.clock = clock
        self.config = default_config()
        self.config["uart"]["baud"] = baud
        self.config["rate_hz"] = rate_hz
        self.config["encoding"] = encoding
        # the emulated chips' first complete measurement comes one refresh after start-up
        self.config["first_measurement_ms"] = refresh_period_s * 1000.0
        pins = list(self.config["channels"])
        if len(power_models) > len(pins):
            pins += [{"cs": 6 + i} for i in range(len(power_models) - len(pins))]
        self.config["channels"] = [
            {"cs": pins[i]["cs"], "meter_constant_imp_per_kwh": meter_constant}
            for i in range(len(power_models))
        ]
        self.chips = {
            self.config["channels"][i]["cs"]: EmulatedChip(
                m, clock, meter_constant_imp_per_kwh=meter_constant,
                refresh_period_s=refresh_period_s, seed=seed + i)
            for i, m in enumerate(power_models)
        }
        self.models = list(power_models)
        self.drift_ppm = drift_ppm
        self.tick_bits = tick_bits
        self.model_spi_time = model_spi_time
        self.files: dict[str, str] = {}
        self.sink: Callable[[bytes], None] | None = None
        self.boots = 0
        self.firmware: Firmware
        self.hw: EmulatedMcu
        self.boot()

    def boot(self) -> None:
        """Power the MCU up: a fresh firmware instance (new boot id, clock origin, counts)."""
        self.boots += 1
        start_us = (0x2F00_0000 + 7_777_777 * self.boots) % (1 << self.tick_bits)
        mcu_clock = McuClock(self.clock, drift_ppm=self.drift_ppm, start_us=start_us,
                             tick_bits=self.tick_bits)
        self.hw = EmulatedMcu(self.clock, self.chips, uart_sink=self._out, mcu_clock=mcu_clock,
                              spi_baud=self.config["spi"]["baud"],
                              model_spi_time=self.model_spi_time, files=self.files)
        self.firmware = Firmware(self.hw, self.config)

    reset_mcu = boot

    def _out(self, data: bytes) -> None:
        if self.sink is not None:
            self.sink(data)

    def describe(self) -> dict:
        return {"kind": "emulated-mcu", "drift_ppm": self.drift_ppm,
                "tick_bits": self.tick_bits, "channels": len(self.chips),
                "power_models": [m.describe() for m in self.models],
                "note": "firmware on CPython with a machine stand-in; chips emulated"}


class SimLink:
    """The recorder's link to an EmulatedBoard on a SimulatedClock, through an 8N1 wire."""

    def __init__(self, board: EmulatedBoard, baud: int, *, tx_buffer: int = 4096,
                 jitter_mean_ns: int = 0, seed: int = 0) -> None:
        self.board = board
        self.clock = board.clock
        self.baud = baud
        self.tx_buffer = tx_buffer  # the MCU's UART transmit buffer (hw.UART_TXBUF)
        self.jitter_mean_ns = jitter_mean_ns  # host-side latency (USB, kernel), exponential
        self.rng = random.Random(seed)
        self.to_pi: deque[tuple[int, bytes]] = deque()
        self.to_mcu: deque[tuple[int, bytes]] = deque()
        self._busy_up = 0
        self._busy_down = 0
        self._last_up = 0
        self._last_down = 0
        self.is_open = False
        self.bytes_up = 0
        self.tx_stall_ns = 0
        board.sink = self._from_mcu

    def _jitter(self) -> int:
        return round(self.rng.expovariate(1.0 / self.jitter_mean_ns)) if self.jitter_mean_ns else 0

    def _from_mcu(self, data: bytes) -> None:
        now = self.clock.monotonic_ns()
        # a full transmit buffer blocks the firmware's write until the wire drains it
        backlog_ns = self._busy_up - now
        room_ns = wire_ns(max(0, self.tx_buffer - len(data)), self.baud)
        if backlog_ns > room_ns:
            self.tx_stall_ns += backlog_ns - room_ns
            self.clock.sleep_until(now + backlog_ns - room_ns)
            now = self.clock.monotonic_ns()
        start = max(now, self._busy_up)
        self._busy_up = start + wire_ns(len(data), self.baud)
        self.bytes_up += len(data)
        self._last_up = max(self._last_up, self._busy_up + self._jitter())
        self.to_pi.append((self._last_up, data))

    def open(self) -> None:
        self.is_open = True
        self.to_pi.clear()  # a re-opened port starts without what was sent while it was gone

    def idle_until(self, t_mono_ns: int) -> None:
        """Let the MCU run (its output unread) until host time `t_mono_ns`."""
        while self.clock.monotonic_ns() < t_mono_ns:
            nxt = self.step()
            self.clock.sleep_until(min(nxt, t_mono_ns))

    def close(self) -> None:
        self.is_open = False

    def write(self, data: bytes) -> None:
        now = self.clock.monotonic_ns()
        start = max(now, self._busy_down)
        self._busy_down = start + wire_ns(len(data), self.baud)
        self._last_down = max(self._last_down, self._busy_down + self._jitter())
        self.to_mcu.append((self._last_down, data))

    def step(self) -> int:
        """Deliver due bytes to the MCU, run one firmware step; host ns of its next wake-up."""
        now = self.clock.monotonic_ns()
        while self.to_mcu and self.to_mcu[0][0] <= now:
            self.board.hw.uart.feed(self.to_mcu.popleft()[1])
        wait_us = self.board.firmware.poll()
        nxt = now + self.board.hw.mcu_clock.host_ns_for(max(wait_us, 1))
        if self.to_mcu:
            nxt = min(nxt, self.to_mcu[0][0])
        return nxt

    def read(self, timeout_s: float) -> bytes:
        if not self.is_open:
            raise LinkLost("simulated link closed")
        deadline = self.clock.monotonic_ns() + round(timeout_s * 1e9)
        while True:
            now = self.clock.monotonic_ns()
            out = b""
            while self.to_pi and self.to_pi[0][0] <= now:
                out += self.to_pi.popleft()[1]
            if out:
                return out
            if now >= deadline:
                return b""
            nxt = self.step()
            if self.to_pi:
                nxt = min(nxt, self.to_pi[0][0])
            if nxt > self.clock.monotonic_ns():
                self.clock.sleep_until(min(nxt, deadline))

    def describe(self) -> dict:
        return {"kind": "simulated-uart", "baud": self.baud}
