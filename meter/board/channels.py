"""Opening a board: its channels as started drivers, on real or emulated chips.

The board's data (`BoardConfig`, `ChannelConfig`, `BridgeConfig`) lives in
`meter/board/config.py` and its file reader in `meter/board/file.py` (both re-exported here);
`emulated_board(...)` builds a board of emulated channels; `open_channels(board, chips=...)`
turns either into started `Channel`s (driver ready to `read_sample()`) through a chip factory
(meter/chip_factory.py: real or emulated, by argument or EPI_METER_CHIPS), refusing a real
board whose chips do not answer. Every problem is a `UserError` naming the file, the key and
the problem.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from epi.core.errors import UserError
from epi.formats.json_types import JSON
from meter.board.config import (
    BOARD_FORMAT,
    BOARD_FORMAT_VERSION,
    DEFAULT_METER_CONSTANT,
    DEFAULT_REFRESH_PERIOD_S,
    DEFAULT_SAMPLE_PERIOD_S,
    BoardConfig,
    BridgeConfig,
    ChannelConfig,
)
from meter.board.file import RANGES, load_board, load_calibration_file, save_calibration_file
from meter.chip_factory import ChipFactory, PowerModels, chip_factory, default_power_models
from meter.clock import Clock, SystemClock
from meter.driver.atm90e26 import ATM90E26Driver
from meter.errors import BusError

if TYPE_CHECKING:
    from meter.emulation.chip_emulator import EmulatedChip

__all__ = [
    "BOARD_FORMAT", "BOARD_FORMAT_VERSION", "DEFAULT_METER_CONSTANT", "DEFAULT_REFRESH_PERIOD_S",
    "DEFAULT_SAMPLE_PERIOD_S", "RANGES", "BoardConfig", "BridgeConfig", "Channel",
    "ChannelConfig", "emulated_board", "load_board", "load_calibration_file", "open_channels",
    "save_calibration_file",
]

class Channel:
    """An opened channel: its driver is started and ready for `read_sample()`."""

    def __init__(
        self,
        config: ChannelConfig,
        driver: ATM90E26Driver,
        *,
        emulator: EmulatedChip | None = None,
        calibration_source: str = "",
    ) -> None:
        self.config = config
        self.index = config.index
        self.name = config.name
        self.node = config.node
        self.driver = driver
        self.meter_constant_imp_per_kwh = config.meter_constant_imp_per_kwh
        self.emulator = emulator
        self.calibration_source = calibration_source

    def describe(self) -> dict[str, JSON]:
        """The trace-metadata entry of this channel (docs/formats.md `channels`)."""
        cal = self.driver.calibration
        model = getattr(self.emulator, "model", None)
        return {
            "channel": self.index,
            "name": self.name,
            "node": self.node,
            "meter_constant_imp_per_kwh": self.meter_constant_imp_per_kwh,
            "ct": dict(self.config.ct) or None,
            "calibration": {
                "source": self.calibration_source,
                "note": cal.note,
                "registers": cal.to_dict()["registers"],
                "joules_per_count": cal.joules_per_count(),
            },
            "bus": self.driver.bus.describe(),
            "emulated": self.emulator is not None,
            "power_model": model.describe() if model is not None else None,
        }

    def close(self) -> None:
        self.driver.close()


def emulated_board(
    n_channels: int = 4,
    power_models: Sequence[object] | None = None,
    clock: Clock | None = None,
    *,
    meter_constant_imp_per_kwh: float = DEFAULT_METER_CONSTANT,
    sample_period_s: float = DEFAULT_SAMPLE_PERIOD_S,
    refresh_period_s: float = DEFAULT_REFRESH_PERIOD_S,
) -> BoardConfig:
    """A board of `n_channels` emulated chips (names ch0.., one power model each)."""
    if n_channels < 1:
        raise UserError(f"emulated board: n_channels must be >= 1, got {n_channels}")
    clock = clock if clock is not None else SystemClock()
    models = (list(power_models) if power_models is not None
              else default_power_models(n_channels, clock))
    if len(models) != n_channels:
        raise UserError(
            f"emulated board: {len(models)} power models for {n_channels} channels"
        )
    channels = [
        ChannelConfig(
            index=i,
            name=f"ch{i}",
            # channel 0 follows this machine's activity by default: it meters this node
            node=socket.gethostname() if i == 0 and power_models is None else None,
            meter_constant_imp_per_kwh=meter_constant_imp_per_kwh,
            power_model=models[i],
        )
        for i in range(n_channels)
    ]
    return BoardConfig(
        name="emulated",
        channels=channels,
        sample_period_s=sample_period_s,
        refresh_period_s=refresh_period_s,
        emulated=True,
        clock=clock,
    )


def open_channels(
    board: BoardConfig,
    chips: ChipFactory | str | None = None,
    *,
    clock: Clock | None = None,
    power_model: PowerModels = None,
    on_event: Callable[[int, str, str], None] | None = None,
    allow_uncalibrated: bool = False,
    model_bus_timing: bool = True,
    seed: int = 0,
) -> list[Channel]:
    """Open and start every enabled channel of `board`.

    Args:
        chips: which chips (meter/chip_factory.py): a `ChipFactory`, ``"real"`` or
            ``"emulated"``; default: emulated for an `emulated_board`, else the
            ``EPI_METER_CHIPS`` environment variable, else real.
        clock: shared by drivers and emulators (default: the board's, else SystemClock).
        power_model, model_bus_timing, seed: options of an emulated factory built here.
        on_event: `on_event(channel_index, kind, detail)` for driver events. (A per-channel
            `(kind, detail)` handler can also be set later as `channel.driver.on_event`.)
        allow_uncalibrated: a real channel without a calibration file uses design values
            (for `epi meter calibrate`); otherwise that is a UserError.

    A real chip that does not answer is a UserError naming the board file and channel, and
    what to check.
    """
    if board.bridge is not None:  # the chips answer the MCU, not this machine
        raise UserError(f"{board.path}: bus = \"bridge\": the chips are read by the board's MCU; "
                        "use `epi meter run` or `epi meter firmware console`")
    if chips is None and board.emulated:
        chips = "emulated"
    factory = chip_factory(chips, power_model=power_model, model_bus_timing=model_bus_timing,
                           seed=seed, allow_uncalibrated=allow_uncalibrated)
    clock = clock if clock is not None else (board.clock or SystemClock())
    enabled = [c for c in board.channels if c.enabled]
    if not enabled:
        raise UserError(f"{board.path or 'board'}: channel: every channel is disabled")
    factory.prepare(board, enabled, clock)
    opened: list[Channel] = []
    try:
        for position, ch in enumerate(enabled):
            handler = None
            if on_event is not None:
                handler = _channel_handler(on_event, ch.index)
            chip = factory.open(board, ch, position, clock)
            make = functools.partial(ATM90E26Driver, chip.bus, chip.calibration,
                                     on_event=handler, clock=clock, n_line=ch.n_line)
            # an emulated chip's first measurement time is known; a real one keeps the
            # driver's default
            driver = (make() if chip.first_measurement_s is None
                      else make(first_measurement_s=chip.first_measurement_s))
            channel = Channel(ch, driver, emulator=chip.emulator,
                              calibration_source=chip.calibration_source)
            opened.append(channel)
            try:
                driver.start()
            except BusError as exc:
                where = ch.chip_select or ch.uart_port or "emulated"
                raise UserError(
                    f"{board.path or 'board'}: channel {ch.name} ({where}): chip not reachable: "
                    f"{exc}. Check: the board is powered, the chip's CS line is {where}, SPI "
                    f"mode 3 at <= 160 kHz (spi.speed_hz), USEL low for SPI / high for UART"
                ) from None
    except BaseException:
        for c in opened:
            c.close()
        raise
    return opened


def _channel_handler(
    on_event: Callable[[int, str, str], None], index: int
) -> Callable[[str, str], None]:
    def handler(kind: str, detail: str) -> None:
        on_event(index, kind, detail)

    return handler
