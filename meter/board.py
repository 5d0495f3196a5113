"""Board configuration: which chips sit where, and opening them (real or emulated).

`load_board(path)` reads a board TOML file (see hardware/epi-meter.toml) into a
`BoardConfig`: the SPI bus (number, speed ≤ 160 kHz by default, mode 3, the spidev device
used for GPIO chip-selects), the analog front end, the sample period, and one entry per
channel (name, node, chip-select `CE0`/`CE1`/`GPIO<n>` or a UART port, CT model/ratio/burden,
meter constant, calibration file, enabled, N line wired). Every problem is a `UserError`
naming the file, the key and the problem.

`emulated_board(...)` builds a board of emulated channels; `open_channels(board, chips=...)`
turns either into started `Channel`s (driver ready to `read_sample()`) through a chip factory
(meter/chip_factory.py: real or emulated, by argument or EPI_METER_CHIPS), refusing a real
board whose chips do not answer.
"""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from epi.formats.fields import parse_json_bytes, read_bytes, read_toml_file
from meter.bus.base import ABS_MAX_SPEED_HZ, MAX_SPEED_HZ, Bus
from meter.chip.calibration import EMULATED_FRONTEND, Calibration, CalibrationError
from meter.chip_factory import ChipFactory, chip_factory, real_bus
from meter.clock import Clock, SystemClock
from meter.driver.atm90e26 import ATM90E26Driver
from meter.errors import BusError

if TYPE_CHECKING:
    from meter.emulation.chip_emulator import EmulatedChip

BOARD_FORMAT = "epi-board"
BOARD_FORMAT_VERSION = 1
# imp/kWh: 3.6 mJ per energy-register LSB, fine enough for per-phase energy of a 5–15 W node
# over 0.5 s phases (the PL constant is then 456 for the default front end, which the chip holds).
DEFAULT_METER_CONSTANT = 100_000_000.0
DEFAULT_SAMPLE_PERIOD_S = 0.2
DEFAULT_REFRESH_PERIOD_S = 0.2

_CS_RE = re.compile(r"^(CE(\d)|GPIO(\d{1,2}))$")


@dataclass
class ChannelConfig:
    """One channel of a board as configured."""

    index: int
    name: str
    node: str | None = None
    chip_select: str | None = None  # "CE<n>" (kernel) or "GPIO<n>"; None for UART channels
    uart_port: str | None = None
    uart_baudrate: int = 9600
    ct: dict = field(default_factory=dict)
    meter_constant_imp_per_kwh: float = DEFAULT_METER_CONSTANT
    calibration_path: Path | None = None
    calibration: Calibration | None = None  # loaded when the file exists
    enabled: bool = True
    n_line: bool = False
    frontend: dict = field(default_factory=lambda: dict(EMULATED_FRONTEND))
    power_model: object | None = None  # emulated boards only

    @property
    def kernel_cs(self) -> int | None:
        m = _CS_RE.match(self.chip_select or "")
        return int(m.group(2)) if m and m.group(2) is not None else None

    @property
    def gpio_cs(self) -> int | None:
        m = _CS_RE.match(self.chip_select or "")
        return int(m.group(3)) if m and m.group(3) is not None else None

    def design_calibration(self) -> Calibration:
        return Calibration.default(self.meter_constant_imp_per_kwh, self.frontend)


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
    bridge: object | None = None  # meter.bridge.board.BridgeConfig for bus = "bridge"

    def channel(self, key: str | int) -> ChannelConfig:
        """A channel by index or name; UserError naming the known ones if there is none."""
        for ch in self.channels:
            if str(ch.index) == str(key) or ch.name == key:
                return ch
        known = ", ".join(f"{c.index}={c.name}" for c in self.channels)
        where = self.path or "emulated board"
        raise UserError(f"{where}: channel {key!r} not found (channels: {known})")

    def describe(self) -> dict:
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

    def describe(self) -> dict:
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


# ---- loading ------------------------------------------------------------------------------
def _err(path: Path | None, key: str, problem: str) -> UserError:
    return UserError(f"{path or 'board'}: {key}: {problem}")


_T = TypeVar("_T")
_D = TypeVar("_D")


def _get(table: dict[str, Any], key: str, kind: type[_T], default: _D, path: Path | None,
         where: str) -> _T | _D:
    """``table[key]`` checked to be a `kind` (a bool is not an int here), else `default`."""
    return cast("_T | _D", _get_any(table, key, (kind,), default, path, where))


def _get_any(table: dict[str, Any], key: str, kinds: tuple[type, ...], default: object,
             path: Path | None, where: str) -> Any:
    if key not in table:
        return default
    value = table[key]
    if isinstance(value, bool) and bool not in kinds:
        raise _err(path, where + key, f"expected {kinds[0].__name__}, got {value!r}")
    if not isinstance(value, kinds):
        raise _err(path, where + key, f"expected {kinds[0].__name__}, got {value!r}")
    return value


def _positive(value: object, path: Path | None, key: str) -> float:
    """A finite number in the key's documented range (RANGES), else a UserError naming it."""
    lo, hi = RANGES.get(key.rsplit(".", 1)[-1], (0.0, math.inf))
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or not lo < value <= hi):
        raise _err(path, key, f"must be a finite number > {lo:g} and <= {hi:g}, got {value!r}")
    return float(value)


# spidev numbers (/dev/spidev<bus>.<device>): a Pi 5 has buses 0..6; 31 leaves room for others.
MAX_SPI_BUS = 31
MAX_SPI_DEVICE = 9  # the GPIO-CS device is chosen among 0..9 (see load_board)
# Documented ranges of the board file's numbers (docs/meter.md): (exclusive low, inclusive high)
RANGES: dict[str, tuple[float, float]] = {
    "period_s": (0.0005, 3600.0),
    "refresh_period_s": (0.001, 60.0),
    "un_v": (1.0, 1000.0),
    "ib_a": (0.0, 100.0),
    "v_l_mv": (0.0, 1000.0),
    "v_u_mv": (0.0, 1000.0),
    "ratio": (0.0, 1e6),
    "burden_ohm": (0.0, 1e6),
    "meter_constant_imp_per_kwh": (0.0, 1e12),
}
# Keys each table may hold: anything else is a typo that must not be dropped silently.
_KNOWN_KEYS: dict[str, frozenset[str]] = {
    "": frozenset({"format", "format_version", "name", "bus", "spi", "bridge", "sampling",
                   "emulator", "frontend", "channel"}),
    "spi": frozenset({"bus", "speed_hz", "mode", "gpio_cs_device"}),
    "sampling": frozenset({"period_s"}),
    "emulator": frozenset({"refresh_period_s"}),
    "frontend": frozenset({"un_v", "ib_a", "v_l_mv", "v_u_mv"}),
    "ct": frozenset({"model", "ratio", "burden_ohm"}),
    "uart": frozenset({"port", "baudrate"}),
}


def _refuse_unknown(table: object, kind: str, where: str, path: Path | None) -> None:
    if isinstance(table, dict):
        unknown = sorted(set(table) - _KNOWN_KEYS[kind])
        if unknown:
            known = ", ".join(sorted(_KNOWN_KEYS[kind]))
            raise _err(path, where + unknown[0], f"unknown key (known here: {known})")


def load_calibration_file(path: Path) -> Calibration:
    """A calibration JSON file; UserError naming the file and field on any problem
    (missing, unreadable, not UTF-8, not JSON, nested too deep, bad values)."""
    data = parse_json_bytes(read_bytes(path, "calibration file not found"), str(path))
    try:
        return Calibration.from_dict(data)
    except CalibrationError as exc:
        raise UserError(f"{path}: {exc}") from None


def save_calibration_file(path: Path, cal: Calibration) -> None:
    """Write a calibration file atomically (a reader sees the old or the new file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, cal.to_dict())


def load_board(path: str | Path) -> BoardConfig:
    """Read and validate a board TOML file."""
    path = Path(path)
    data = read_toml_file(path, "board file")

    _refuse_unknown(data, "", "", path)
    for table in ("spi", "sampling", "emulator", "frontend"):
        _refuse_unknown(data.get(table), table, f"{table}.", path)
    fmt = data.get("format")
    if fmt != BOARD_FORMAT:
        raise _err(path, "format", f"expected {BOARD_FORMAT!r}, got {fmt!r}")
    version = data.get("format_version")
    if not isinstance(version, int) or not 1 <= version <= BOARD_FORMAT_VERSION:
        raise _err(path, "format_version", f"{version!r} is not a version this epi reads")
    name = _get(data, "name", str, path.stem, path, "")
    bus = data.get("bus", "spi")
    if bus not in ("spi", "bridge"):
        raise _err(path, "bus", f"{bus!r}: expected \"spi\" (the Pi reads the chips) or "
                   "\"bridge\" (the board's MCU does)")
    if bus == "bridge":  # issue 14: the chips sit behind the board's MCU
        from meter.bridge.board import load_bridge_board

        return load_bridge_board(data, path)  # type: ignore[no-any-return]
    if "bridge" in data:
        raise _err(path, "bridge", "a [bridge] table needs bus = \"bridge\"")

    spi = _get(data, "spi", dict, {}, path, "")
    spi_bus = _get(spi, "bus", int, 0, path, "spi.")
    if not 0 <= spi_bus <= MAX_SPI_BUS:
        raise _err(path, "spi.bus", f"{spi_bus}: expected an SPI bus number 0..{MAX_SPI_BUS} "
                   "(/dev/spidev<bus>.<device>)")
    speed = _get(spi, "speed_hz", int, MAX_SPEED_HZ, path, "spi.")
    if not 200 <= speed <= ABS_MAX_SPEED_HZ:
        raise _err(path, "spi.speed_hz", f"{speed} Hz: the ATM90E26 takes 200..{MAX_SPEED_HZ} Hz "
                   f"(datasheet; {ABS_MAX_SPEED_HZ} Hz at most as many drivers run it)")
    mode = _get(spi, "mode", int, 3, path, "spi.")
    if mode != 3:
        raise _err(path, "spi.mode", f"{mode}: the ATM90E26 works in SPI mode 3 only")
    gpio_dev = _get(spi, "gpio_cs_device", int, None, path, "spi.")
    if gpio_dev is not None and not 0 <= gpio_dev <= MAX_SPI_DEVICE:
        raise _err(path, "spi.gpio_cs_device", f"{gpio_dev}: expected a spidev device number "
                   f"0..{MAX_SPI_DEVICE}")

    sampling = _get(data, "sampling", dict, {}, path, "")
    period = _positive(sampling.get("period_s", DEFAULT_SAMPLE_PERIOD_S), path,
                       "sampling.period_s")
    emu = _get(data, "emulator", dict, {}, path, "")
    refresh = _positive(emu.get("refresh_period_s", DEFAULT_REFRESH_PERIOD_S), path,
                        "emulator.refresh_period_s")

    fe_table = _get(data, "frontend", dict, {}, path, "")
    frontend = dict(EMULATED_FRONTEND)
    for key in ("un_v", "ib_a", "v_l_mv", "v_u_mv"):
        if key in fe_table:
            frontend[key] = _positive(fe_table[key], path, f"frontend.{key}")

    raw_channels = data.get("channel")
    if not isinstance(raw_channels, list) or not raw_channels:
        raise _err(path, "channel", "needs at least one [[channel]] table")
    channels: list[ChannelConfig] = []
    seen_names: set[str] = set()
    seen_cs: set[str] = set()
    for i, table in enumerate(raw_channels):
        where = f"channel[{i}]."
        if not isinstance(table, dict):
            raise _err(path, f"channel[{i}]", "expected a table")
        unknown = set(table) - {"name", "node", "chip_select", "uart", "ct",
                                "meter_constant_imp_per_kwh", "calibration", "enabled",
                                "n_line"}
        if unknown:
            raise _err(path, where + sorted(unknown)[0], "unknown key")
        ch_name = _get(table, "name", str, f"ch{i}", path, where)
        if ch_name in seen_names:
            raise _err(path, where + "name", f"{ch_name!r} used twice")
        seen_names.add(ch_name)
        node = _get(table, "node", str, None, path, where)
        cs = _get_any(table, "chip_select", (str, int), None, path, where)
        uart = _get(table, "uart", dict, None, path, where)
        if (cs is None) == (uart is None):
            raise _err(path, where + "chip_select",
                       "give exactly one of chip_select (CE0, CE1, GPIO<n>) or uart")
        uart_port, baud = None, 9600
        if cs is not None:
            cs = f"GPIO{cs}" if isinstance(cs, int) else str(cs).upper()
            m = _CS_RE.match(cs)
            if not m or (m.group(3) is not None and int(m.group(3)) > 27):
                raise _err(path, where + "chip_select",
                           f"{cs!r}: expected CE<n> (kernel) or GPIO<0..27>")
            if cs in seen_cs:
                raise _err(path, where + "chip_select", f"{cs} used by two channels")
            seen_cs.add(cs)
        else:
            assert uart is not None  # exactly one of chip_select and uart (checked above)
            uart_port = _get(uart, "port", str, None, path, where + "uart.")
            if not uart_port:
                raise _err(path, where + "uart.port", "missing (e.g. /dev/ttyAMA0)")
            baud = _get(uart, "baudrate", int, 9600, path, where + "uart.")
            if baud not in (2400, 9600):
                raise _err(path, where + "uart.baudrate", f"{baud}: the chip talks 2400 or 9600")
        ct = _get(table, "ct", dict, {}, path, where)
        _refuse_unknown(ct, "ct", where + "ct.", path)
        _refuse_unknown(uart, "uart", where + "uart.", path)
        ch_frontend = dict(frontend)
        if ct:
            ratio = ct.get("ratio")
            burden = ct.get("burden_ohm")
            if ratio is not None or burden is not None:
                r = _positive(ratio, path, where + "ct.ratio")
                b = _positive(burden, path, where + "ct.burden_ohm")
                ch_frontend["v_l_mv"] = frontend["ib_a"] / r * b * 1000.0
        mc = _positive(table.get("meter_constant_imp_per_kwh", DEFAULT_METER_CONSTANT), path,
                       where + "meter_constant_imp_per_kwh")
        try:  # the chip must be able to hold the PL constant these values give
            Calibration.default(mc, ch_frontend)
        except (CalibrationError, ValueError, OverflowError) as exc:
            fe = ", ".join(f"{k} {v:g}" for k, v in sorted(ch_frontend.items()))
            raise _err(path, where + "meter_constant_imp_per_kwh",
                       f"{mc:g} imp/kWh with the front end ({fe}; from frontend.un_v, ib_a, "
                       f"v_u_mv and ct.ratio/ct.burden_ohm) cannot be held by the chip: "
                       f"{exc}") from None
        cal_path = None
        cal = None
        cal_value = _get(table, "calibration", str, None, path, where)
        if cal_value:
            cal_path = path.parent / cal_value
            if cal_path.exists():
                cal = load_calibration_file(cal_path)
                if abs(cal.meter_constant_imp_per_kwh - mc) > 1e-9 * mc:
                    raise _err(path, where + "meter_constant_imp_per_kwh",
                               f"{mc:g} but {cal_path.name} was made for "
                               f"{cal.meter_constant_imp_per_kwh:g} imp/kWh")
        channels.append(
            ChannelConfig(
                index=i,
                name=ch_name,
                node=node,
                chip_select=cs,
                uart_port=uart_port,
                uart_baudrate=baud,
                ct=dict(ct),
                meter_constant_imp_per_kwh=mc,
                calibration_path=cal_path,
                calibration=cal,
                enabled=bool(_get(table, "enabled", bool, True, path, where)),
                n_line=bool(_get(table, "n_line", bool, False, path, where)),
                frontend=ch_frontend,
            )
        )
    kernel_used = {c.kernel_cs for c in channels if c.kernel_cs is not None}
    if any(c.gpio_cs is not None for c in channels):
        if gpio_dev is None:
            free = [d for d in range(10) if d not in kernel_used]
            if not free:
                raise _err(path, "spi.gpio_cs_device",
                           "every spidev device carries a chip: none left for GPIO CS")
            gpio_dev = free[0]
        elif gpio_dev in kernel_used:
            raise _err(path, "spi.gpio_cs_device",
                       f"{gpio_dev}: CE{gpio_dev} carries a chip, so its spidev device cannot "
                       "also serve GPIO chip-selects")
    return BoardConfig(
        name=name,
        channels=channels,
        path=path,
        spi_bus=spi_bus,
        speed_hz=speed,
        mode=mode,
        gpio_cs_device=gpio_dev,
        sample_period_s=period,
        refresh_period_s=refresh,
        period_explicit="period_s" in sampling,
    )


def _default_models(n: int, clock: Clock) -> list[object]:
    """Channel 0 follows CPU activity (the inference process tree when EPI_METER_FOLLOW names
    a follow file, else the whole machine); the others idle at Pi-5-like powers."""
    from meter.emulation.power_models import ConstantPower, default_activity_model

    models: list[object] = []
    for i in range(n):
        if i == 0:
            try:
                models.append(default_activity_model(clock))
                continue
            except (OSError, ValueError):
                pass  # no /proc/stat here: a constant load instead
        models.append(ConstantPower(2.7 + 0.45 * i, power_factor=0.6))
    return models


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
    models = list(power_models) if power_models is not None else _default_models(n_channels, clock)
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


# ---- opening ------------------------------------------------------------------------------
def _real_bus(board: BoardConfig, ch: ChannelConfig, clock: Clock) -> Bus:
    """The bus to a real channel's chip (see meter.chip_factory.real_bus)."""
    return real_bus(board, ch, clock)


def open_channels(
    board: BoardConfig,
    chips: ChipFactory | str | None = None,
    *,
    clock: Clock | None = None,
    power_model: object | Sequence[object] | None = None,
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
    if board.bridge is not None:  # issue 14: the chips answer the MCU, not this machine
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
            extra = {} if chip.first_measurement_s is None else {
                "first_measurement_s": chip.first_measurement_s}
            driver = ATM90E26Driver(chip.bus, chip.calibration, on_event=handler, clock=clock,
                                    n_line=ch.n_line, **extra)
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
