"""Which chips a board's channels talk to: real ATM90E26s or emulated ones.

Chosen like gpiozero's pin factory: by argument (``open_channels(board, chips=...)``, a name or
a factory object) or by the environment variable ``EPI_METER_CHIPS`` (``real`` or
``emulated``), default ``real`` — except for a board built by ``emulated_board()``, which is
emulated by definition. A factory turns one channel's configuration into an ``OpenedChip``:
the bus, the calibration to load and where it came from, and (emulated only) the emulator
object. The real factory never imports the emulator; the emulated one ships in the library
and behaves like the chip (meter/emulation/chip_emulator.py).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from epi.core.errors import UserError
from meter.board.config import BoardConfig, ChannelConfig
from meter.bus.base import Bus
from meter.chip.calibration import Calibration
from meter.clock import Clock
from meter.errors import BusError

if TYPE_CHECKING:
    from meter.emulation.chip_emulator import EmulatedChip
    from meter.emulation.power_models import PowerModel

# what `power_model` options accept: one model for every channel, or one per enabled channel
PowerModels = Union["PowerModel", Sequence["PowerModel"], None]

ENV_VAR = "EPI_METER_CHIPS"
KINDS = ("real", "emulated")


@dataclass
class OpenedChip:
    """One channel's chip, ready for a driver."""

    bus: Bus
    calibration: Calibration
    calibration_source: str
    emulator: EmulatedChip | None = None  # the chip behind an emulated bus
    first_measurement_s: float | None = None  # None: the driver's default for real chips


class ChipFactory(ABC):
    """Opens the chip of each enabled channel of a board."""

    emulated: bool = False

    def prepare(self, board: BoardConfig, enabled: Sequence[ChannelConfig], clock: Clock) -> None:
        """Called once before the channels are opened (default: nothing to do)."""
        return None

    @abstractmethod
    def open(self, board: BoardConfig, ch: ChannelConfig, position: int,
             clock: Clock) -> OpenedChip:
        """The chip of `ch` (the `position`-th enabled channel)."""


class RealChips(ChipFactory):
    """ATM90E26s on the board's SPI/UART buses, with each channel's calibration file."""

    emulated = False

    def __init__(self, *, allow_uncalibrated: bool = False) -> None:
        self.allow_uncalibrated = allow_uncalibrated

    def open(self, board: BoardConfig, ch: ChannelConfig, position: int,
             clock: Clock) -> OpenedChip:
        if ch.calibration is not None:
            cal, source = ch.calibration, str(ch.calibration_path)
        elif self.allow_uncalibrated:
            cal, source = ch.design_calibration(), "design values (uncalibrated)"
        else:
            missing = ch.calibration_path or "(no calibration key)"
            raise UserError(
                f"{board.path}: channel[{ch.index}].calibration: {missing} not found; "
                f"run `epi meter calibrate {ch.name} ...` or copy "
                f"hardware/calibration.example.json"
            )
        try:
            bus = real_bus(board, ch, clock)
        except (BusError, ValueError) as exc:
            check = ("the serial port exists and is free (no login console on it)"
                     if ch.uart_port is not None else
                     "SPI is enabled (dtparam=spi=on), the user is in groups spi and gpio, "
                     "spi.bus and chip_select match the wiring")
            raise UserError(f"{board.path}: channel {ch.name}: {exc}. Check: {check}") from None
        return OpenedChip(bus, cal, source)


class EmulatedChips(ChipFactory):
    """Register-level emulated chips, each on a power model (labelled as modelled).

    Each channel gets its configured power model, else `power_model` (one for all, or one
    per enabled channel), else the defaults of `emulated_board`; and the design calibration.
    """

    emulated = True

    def __init__(self, *, power_model: PowerModels = None, model_bus_timing: bool = True,
                 seed: int = 0) -> None:
        self.power_model = power_model
        self.model_bus_timing = model_bus_timing
        self.seed = seed
        self._models: list[PowerModel] = []

    def prepare(self, board: BoardConfig, enabled: Sequence[ChannelConfig], clock: Clock) -> None:
        configured = [c.power_model for c in enabled]
        self._models = power_models_for(self.power_model, configured, clock)

    def open(self, board: BoardConfig, ch: ChannelConfig, position: int,
             clock: Clock) -> OpenedChip:
        from meter.emulation.chip_emulator import EmulatedChip
        from meter.emulation.emulated_bus import EmulatedSpiBus

        chip = EmulatedChip(
            self._models[position],
            clock,
            meter_constant_imp_per_kwh=ch.meter_constant_imp_per_kwh,
            refresh_period_s=board.refresh_period_s,
            frontend=ch.frontend,
            n_line=ch.n_line,
            seed=self.seed + ch.index,
        )
        frame_s = 24.0 / board.speed_hz if self.model_bus_timing else None
        return OpenedChip(
            EmulatedSpiBus(chip, frame_time_s=frame_s),
            ch.design_calibration(),
            "design values for the emulated front end",
            emulator=chip,
            # the emulator's refresh period is known; a real chip's is not
            first_measurement_s=board.refresh_period_s,
        )


def default_power_models(n: int, clock: Clock) -> list[PowerModel]:
    """Channel 0 follows CPU activity (the inference process tree when EPI_METER_FOLLOW names
    a follow file, else the whole machine); the others idle at Pi-5-like powers."""
    from meter.emulation.power_models import ConstantPower, default_activity_model

    models: list[PowerModel] = []
    for i in range(n):
        if i == 0:
            try:
                models.append(default_activity_model(clock))
                continue
            except (OSError, ValueError):
                pass  # no /proc/stat here: a constant load instead
        models.append(ConstantPower(2.7 + 0.45 * i, power_factor=0.6))
    return models


def power_models_for(given: PowerModels, configured: Sequence[object | None], clock: Clock
                     ) -> list[PowerModel]:
    """One power model per channel: `given` (one for all, or one each), else each channel's
    configured model, else the defaults (`default_power_models`) where a channel has none."""
    from meter.emulation.power_models import PowerModel

    n = len(configured)
    if given is None:
        chosen = [m for m in configured if isinstance(m, PowerModel)]
        if len(chosen) == n:
            # every channel has its own: no defaults built (channel 0's default makes a
            # private follow directory that only the process's exit removes)
            return chosen
        defaults = default_power_models(n, clock)
        return [m if isinstance(m, PowerModel) else d
                for m, d in zip(configured, defaults, strict=True)]
    if isinstance(given, PowerModel):
        return [given] * n
    if len(given) != n:
        raise UserError(f"{len(given)} power models for {n} channels")
    return list(given)


def chip_factory(kind: str | ChipFactory | None = None, *, power_model: PowerModels = None,
                 model_bus_timing: bool = True, seed: int = 0,
                 allow_uncalibrated: bool = False) -> ChipFactory:
    """A factory by name (``real``/``emulated``), else from ``EPI_METER_CHIPS``, else real."""
    if isinstance(kind, ChipFactory):
        return kind
    name = kind or os.environ.get(ENV_VAR) or "real"
    if name == "real":
        return RealChips(allow_uncalibrated=allow_uncalibrated)
    if name == "emulated":
        return EmulatedChips(power_model=power_model, model_bus_timing=model_bus_timing,
                             seed=seed)
    source = "chips" if kind else ENV_VAR
    raise UserError(f"{source} {name!r}: expected one of {', '.join(KINDS)}")


def real_bus(board: BoardConfig, ch: ChannelConfig, clock: Clock) -> Bus:
    """The bus to one real channel's chip: UART, kernel chip-select or GPIO chip-select."""
    if ch.uart_port is not None:
        from meter.bus.uart_bus import UartBus

        return UartBus(ch.uart_port, baudrate=ch.uart_baudrate, clock=clock)
    if ch.kernel_cs is not None:
        from meter.bus.spidev_bus import SpidevBus

        return SpidevBus(board.spi_bus, ch.kernel_cs, speed_hz=board.speed_hz, mode=board.mode)
    from meter.bus.gpio_cs_bus import GpioCsSpiBus

    assert ch.gpio_cs is not None  # load_board: a channel has a UART, a CE<n> or a GPIO CS
    return GpioCsSpiBus(
        ch.gpio_cs,
        bus=board.spi_bus,
        device=board.gpio_cs_device or 0,
        speed_hz=board.speed_hz,
        mode=board.mode,
    )
