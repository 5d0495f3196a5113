"""Board configuration: which chips sit where, and opening them (real or emulated).

`load_board(path)` reads a board TOML file (see hardware/epi-meter.toml) into a
`BoardConfig`: the SPI bus (number, speed ≤ 160 kHz by default, mode 3, the spidev device
used for GPIO chip-selects), the analog front end, the sample period, and one entry per
channel (name, node, chip-select `CE0`/`CE1`/`GPIO<n>` or a UART port, CT model/ratio/burden,
meter constant, calibration file, enabled, N line wired). Every problem is a `UserError`
naming the file, the key and the problem.

`emulated_board(...)` builds a board of emulated channels; `open_channels(board, emulate=...)`
turns either into started `Channel`s (driver ready to `read_sample()`), refusing a real board
whose chips do not answer.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epi.core.errors import UserError
from meter.bus.base import ABS_MAX_SPEED_HZ, MAX_SPEED_HZ, BusError
from meter.chip.calibration import EMULATED_FRONTEND, Calibration, CalibrationError
from meter.clock import SystemClock
from meter.driver.atm90e26 import ATM90E26Driver

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
    clock: object | None = None
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
        emulator: object | None = None,
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
            "power_model": model.describe() if model is not None else None,  # type: ignore[attr-defined]
        }

    def close(self) -> None:
        self.driver.close()


# ---- loading ------------------------------------------------------------------------------
def _err(path: Path | None, key: str, problem: str) -> UserError:
    return UserError(f"{path or 'board'}: {key}: {problem}")


def _get(table: dict, key: str, kind: type | tuple, default: object, path: Path | None,
         where: str) -> object:
    if key not in table:
        return default
    value = table[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise _err(path, where + key, f"expected {kinds[0].__name__}, got {value!r}")
    if not isinstance(value, kinds):
        raise _err(path, where + key, f"expected {kinds[0].__name__}, got {value!r}")
    return value


def _positive(value: object, path: Path | None, key: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise _err(path, key, f"must be a number > 0, got {value!r}")
    return float(value)


def load_calibration_file(path: Path) -> Calibration:
    """A calibration JSON file; UserError naming the file and field on any problem."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: calibration file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: line {exc.lineno}: not valid JSON: {exc.msg}") from None
    try:
        return Calibration.from_dict(data)
    except CalibrationError as exc:
        raise UserError(f"{path}: {exc}") from None


def save_calibration_file(path: Path, cal: Calibration) -> None:
    """Write a calibration file atomically (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(cal.to_dict(), indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def load_board(path: str | Path) -> BoardConfig:
    """Read and validate a board TOML file."""
    path = Path(path)
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise UserError(f"{path}: reading TOML needs Python 3.11+ or tomli") from None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: board file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML: {exc}") from None

    fmt = data.get("format")
    if fmt != BOARD_FORMAT:
        raise _err(path, "format", f"expected {BOARD_FORMAT!r}, got {fmt!r}")
    version = data.get("format_version")
    if not isinstance(version, int) or not 1 <= version <= BOARD_FORMAT_VERSION:
        raise _err(path, "format_version", f"{version!r} is not a version this epi reads")
    name = _get(data, "name", str, path.stem, path, "")
    if data.get("bus", "spi") == "bridge":  # issue 14: the chips sit behind the board's MCU
        from meter.bridge.board import load_bridge_board

        return load_bridge_board(data, path)  # type: ignore[no-any-return]

    spi = _get(data, "spi", dict, {}, path, "")
    spi_bus = _get(spi, "bus", int, 0, path, "spi.")
    speed = _get(spi, "speed_hz", int, MAX_SPEED_HZ, path, "spi.")
    if not 200 <= speed <= ABS_MAX_SPEED_HZ:  # type: ignore[operator]
        raise _err(path, "spi.speed_hz", f"{speed} Hz: the ATM90E26 takes 200..{MAX_SPEED_HZ} Hz "
                   f"(datasheet; {ABS_MAX_SPEED_HZ} Hz at most as many drivers run it)")
    mode = _get(spi, "mode", int, 3, path, "spi.")
    if mode != 3:
        raise _err(path, "spi.mode", f"{mode}: the ATM90E26 works in SPI mode 3 only")
    gpio_dev = _get(spi, "gpio_cs_device", int, None, path, "spi.")

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
        seen_names.add(ch_name)  # type: ignore[arg-type]
        node = _get(table, "node", str, None, path, where)
        cs = _get(table, "chip_select", (str, int), None, path, where)
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
            uart_port = _get(uart, "port", str, None, path, where + "uart.")  # type: ignore[arg-type]
            if not uart_port:
                raise _err(path, where + "uart.port", "missing (e.g. /dev/ttyAMA0)")
            baud = _get(uart, "baudrate", int, 9600, path, where + "uart.")  # type: ignore[arg-type]
            if baud not in (2400, 9600):
                raise _err(path, where + "uart.baudrate", f"{baud}: the chip talks 2400 or 9600")
        ct = _get(table, "ct", dict, {}, path, where)
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
                name=ch_name,  # type: ignore[arg-type]
                node=node,  # type: ignore[arg-type]
                chip_select=cs,  # type: ignore[arg-type]
                uart_port=uart_port,
                uart_baudrate=baud,  # type: ignore[arg-type]
                ct=dict(ct),  # type: ignore[arg-type]
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
        name=name,  # type: ignore[arg-type]
        channels=channels,
        path=path,
        spi_bus=spi_bus,  # type: ignore[arg-type]
        speed_hz=speed,  # type: ignore[arg-type]
        mode=mode,  # type: ignore[arg-type]
        gpio_cs_device=gpio_dev,  # type: ignore[arg-type]
        sample_period_s=period,
        refresh_period_s=refresh,
    )


def _default_models(n: int, clock: object) -> list[object]:
    """Channel 0 follows this machine's CPU activity; the others idle at Pi-5-like powers."""
    from meter.emulation.power_models import ActivityModel, ConstantPower

    models: list[object] = []
    for i in range(n):
        if i == 0:
            try:
                models.append(ActivityModel(clock))
                continue
            except (OSError, ValueError):
                pass  # no /proc/stat here: a constant load instead
        models.append(ConstantPower(2.7 + 0.45 * i, power_factor=0.6))
    return models


def emulated_board(
    n_channels: int = 4,
    power_models: Sequence[object] | None = None,
    clock: object | None = None,
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
def _real_bus(board: BoardConfig, ch: ChannelConfig, clock: object) -> object:
    if ch.uart_port is not None:
        from meter.bus.uart_bus import UartBus

        return UartBus(ch.uart_port, baudrate=ch.uart_baudrate, clock=clock)
    if ch.kernel_cs is not None:
        from meter.bus.spidev_bus import SpidevBus

        return SpidevBus(board.spi_bus, ch.kernel_cs, speed_hz=board.speed_hz, mode=board.mode)
    from meter.bus.gpio_cs_bus import GpioCsSpiBus

    return GpioCsSpiBus(
        ch.gpio_cs,  # type: ignore[arg-type]
        bus=board.spi_bus,
        device=board.gpio_cs_device or 0,
        speed_hz=board.speed_hz,
        mode=board.mode,
    )


def open_channels(
    board: BoardConfig,
    *,
    emulate: bool,
    clock: object | None = None,
    power_model: object | Sequence[object] | None = None,
    on_event: Callable[[int, str, str], None] | None = None,
    allow_uncalibrated: bool = False,
    model_bus_timing: bool = True,
    seed: int = 0,
) -> list[Channel]:
    """Open and start every enabled channel of `board`.

    Args:
        emulate: use emulated chips (always true for an `emulated_board`); each gets the
            channel's power model, else `power_model` (one for all, or one per channel),
            else the defaults of `emulated_board`, and the design calibration.
        clock: shared by drivers and emulators (default: the board's, else SystemClock).
        on_event: `on_event(channel_index, kind, detail)` for driver events. (A per-channel
            `(kind, detail)` handler can also be set later as `channel.driver.on_event`.)
        allow_uncalibrated: a real channel without a calibration file uses design values
            (for `epi meter calibrate`); otherwise that is a UserError.
        model_bus_timing: emulated frames take 24 bits at the board's SPI speed.

    A real chip that does not answer is a UserError naming the board file and channel.
    """
    from meter.emulation.chip_emulator import EmulatedChip
    from meter.emulation.emulated_bus import EmulatedSpiBus

    if board.bridge is not None:  # issue 14: the chips answer the MCU, not this machine
        raise UserError(f"{board.path}: bus = \"bridge\": the chips are read by the board's MCU; "
                        "use `epi meter run` or `epi meter firmware console`")
    emulate = emulate or board.emulated
    clock = clock if clock is not None else (board.clock or SystemClock())
    enabled = [c for c in board.channels if c.enabled]
    if not enabled:
        raise UserError(f"{board.path or 'board'}: channel: every channel is disabled")
    models: list[object | None]
    if power_model is None:
        models = [c.power_model for c in enabled]
        if any(m is None for m in models):
            defaults = _default_models(len(enabled), clock)
            models = [m if m is not None else d for m, d in zip(models, defaults, strict=True)]
    elif isinstance(power_model, (list, tuple)):
        if len(power_model) != len(enabled):
            raise UserError(f"{len(power_model)} power models for {len(enabled)} channels")
        models = list(power_model)
    else:
        models = [power_model] * len(enabled)

    opened: list[Channel] = []
    try:
        for ch, model in zip(enabled, models, strict=True):
            handler = None
            if on_event is not None:
                handler = _channel_handler(on_event, ch.index)
            if emulate:
                chip = EmulatedChip(
                    model,
                    clock,
                    meter_constant_imp_per_kwh=ch.meter_constant_imp_per_kwh,
                    refresh_period_s=board.refresh_period_s,
                    frontend=ch.frontend,
                    n_line=ch.n_line,
                    seed=seed + ch.index,
                )
                frame_s = 24.0 / board.speed_hz if model_bus_timing else None
                bus: object = EmulatedSpiBus(chip, frame_time_s=frame_s)
                cal = ch.design_calibration()
                source = "design values for the emulated front end"
            else:
                chip = None
                if ch.calibration is not None:
                    cal = ch.calibration
                    source = str(ch.calibration_path)
                elif allow_uncalibrated:
                    cal = ch.design_calibration()
                    source = "design values (uncalibrated)"
                else:
                    missing = ch.calibration_path or "(no calibration key)"
                    raise UserError(
                        f"{board.path}: channel[{ch.index}].calibration: {missing} not found; "
                        f"run `epi meter calibrate {ch.name} ...` or copy "
                        f"hardware/calibration.example.json"
                    )
                try:
                    bus = _real_bus(board, ch, clock)
                except (BusError, ValueError) as exc:
                    raise UserError(f"{board.path}: channel {ch.name}: {exc}") from None
            driver = ATM90E26Driver(
                bus,  # type: ignore[arg-type]
                cal,
                on_event=handler,
                clock=clock,
                n_line=ch.n_line,
            )
            channel = Channel(ch, driver, emulator=chip, calibration_source=source)
            opened.append(channel)
            try:
                driver.start()
            except BusError as exc:
                where = ch.chip_select or ch.uart_port or "emulated"
                raise UserError(
                    f"{board.path or 'board'}: channel {ch.name} ({where}): chip not reachable: "
                    f"{exc}"
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
