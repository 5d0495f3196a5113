"""Board data: what a board file (or the emulator) says about the bus, sampling and channels.

Plain dataclasses with no I/O, below everything that reads or opens a board:
`meter/board/file.py` parses a TOML file into them, `meter/chip_factory.py` opens their chips,
`meter/board/channels.py` turns them into started channels. Keeping the data below the factory
is what lets those three import each other in one direction only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from epi.core.errors import UserError
from epi.formats.json_types import JSON
from meter.bus.base import MAX_SPEED_HZ
from meter.chip.calibration import EMULATED_FRONTEND, Calibration
from meter.clock import Clock

BOARD_FORMAT = "epi-board"
BOARD_FORMAT_VERSION = 1
# imp/kWh: 3.6 mJ per energy-register LSB, fine enough for per-phase energy of a 5–15 W node
# over 0.5 s phases (the PL constant is then 456 for the default front end, which the chip holds).
DEFAULT_METER_CONSTANT = 100_000_000.0
DEFAULT_SAMPLE_PERIOD_S = 0.2
DEFAULT_REFRESH_PERIOD_S = 0.2
DEFAULT_BRIDGE_BAUD = 115200

CS_RE = re.compile(r"^(CE(\d)|GPIO(\d{1,2}))$")


@dataclass
class ChannelConfig:
    """One channel of a board as configured."""

    index: int
    name: str
    node: str | None = None
    chip_select: str | None = None  # "CE<n>" (kernel) or "GPIO<n>"; None for UART channels
    uart_port: str | None = None
    uart_baudrate: int = 9600
    ct: dict[str, JSON] = field(default_factory=dict)  # the board file's ct table
    meter_constant_imp_per_kwh: float = DEFAULT_METER_CONSTANT
    calibration_path: Path | None = None
    calibration: Calibration | None = None  # loaded when the file exists
    enabled: bool = True
    n_line: bool = False
    expected_load_w: tuple[float, float] | None = None  # (min, max) W; meter/load_check.py
    frontend: dict[str, float] = field(default_factory=lambda: dict(EMULATED_FRONTEND))
    power_model: object | None = None  # emulated boards only

    @property
    def kernel_cs(self) -> int | None:
        m = CS_RE.match(self.chip_select or "")
        return int(m.group(2)) if m and m.group(2) is not None else None

    @property
    def gpio_cs(self) -> int | None:
        m = CS_RE.match(self.chip_select or "")
        return int(m.group(3)) if m and m.group(3) is not None else None

    def design_calibration(self) -> Calibration:
        return Calibration.default(self.meter_constant_imp_per_kwh, self.frontend)


@dataclass(frozen=True)
class BridgeConfig:
    """The `[bridge]` table of a board whose chips sit behind its MCU (docs/bridge.md)."""

    port: str
    baud: int = DEFAULT_BRIDGE_BAUD
    encoding: str | None = None
    rate_hz: float | None = None

    def describe(self) -> dict[str, JSON]:
        return {"bus": "bridge", "port": self.port, "baud": self.baud,
                "encoding": self.encoding, "rate_hz": self.rate_hz}


@dataclass
class BoardConfig:
    """A board: bus settings, sampling, channels."""

    name: str
    channels: list[ChannelConfig]
    path: Path | None = None
    spi_bus: int = 0
    speed_hz: int = MAX_SPEED_HZ
    mode: int = 3
    gpio_cs_device: int | None = None
    sample_period_s: float = DEFAULT_SAMPLE_PERIOD_S
    refresh_period_s: float = DEFAULT_REFRESH_PERIOD_S
    emulated: bool = False
    clock: Clock | None = None
    period_explicit: bool = False  # the board file sets sampling.period_s (else the daemon picks)
    bridge: BridgeConfig | None = None  # bus = "bridge": the MCU reads the chips

    def channel(self, key: str | int) -> ChannelConfig:
        """A channel by index or name; UserError naming the known ones if there is none."""
        for ch in self.channels:
            if str(ch.index) == str(key) or ch.name == key:
                return ch
        known = ", ".join(f"{c.index}={c.name}" for c in self.channels)
        where = self.path or "emulated board"
        raise UserError(f"{where}: channel {key!r} not found (channels: {known})")

    def describe(self) -> dict[str, JSON]:
        return {
            "name": self.name,
            "path": str(self.path) if self.path else None,
            "emulated": self.emulated,
            "spi": {
                "bus": self.spi_bus,
                "speed_hz": self.speed_hz,
                "mode": self.mode,
                "gpio_cs_device": self.gpio_cs_device,
            },
            "sample_period_s": self.sample_period_s,
            "refresh_period_s": self.refresh_period_s if self.emulated else None,
            "channels": [
                {
                    "channel": c.index,
                    "name": c.name,
                    "chip_select": c.chip_select,
                    "uart_port": c.uart_port,
                    "enabled": c.enabled,
                }
                for c in self.channels
            ],
        }
