"""Reading a board TOML file (hardware/epi-meter.toml) into `BoardConfig`: one small parser
per table, each refusing what it does not know with one line naming the file, key and problem.

`load_board(path)` reads the SPI bus (number, speed ≤ 160 kHz by default, mode 3, the spidev
device used for GPIO chip-selects), the analog front end, the sample period and one entry per
channel (name, node, chip-select `CE0`/`CE1`/`GPIO<n>` or a UART port, CT model/ratio/burden,
meter constant, calibration file, enabled, N line wired) — or, for `bus = "bridge"`, the
`[bridge]` table and the MCU's channel names (docs/bridge.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast

from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from epi.formats.fields import parse_json_bytes, read_bytes, read_toml_file
from epi.formats.json_types import JSON
from meter.board.config import (
    BOARD_FORMAT,
    BOARD_FORMAT_VERSION,
    CS_RE,
    DEFAULT_BRIDGE_BAUD,
    DEFAULT_METER_CONSTANT,
    DEFAULT_REFRESH_PERIOD_S,
    DEFAULT_SAMPLE_PERIOD_S,
    BoardConfig,
    BridgeConfig,
    ChannelConfig,
)
from meter.bus.base import ABS_MAX_SPEED_HZ, MAX_SPEED_HZ
from meter.chip.calibration import EMULATED_FRONTEND, Calibration, CalibrationError

# spidev numbers (/dev/spidev<bus>.<device>): a Pi 5 has buses 0..6; 31 leaves room for others.
MAX_SPI_BUS = 31
MAX_SPI_DEVICE = 9  # the GPIO-CS device is chosen among 0..9 (see _gpio_cs_device)
MAX_GPIO = 27
UART_BAUDS = (2400, 9600)  # the chip's own UART
BRIDGE_BAUDS = (9600, 19200, 38400, 57600, 115200, 230400, 460800, 921600, 1000000)
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
    "turns": (0.0, 100.0),
    "max_current_a": (0.0, 1e4),
    "accuracy_class_pct": (0.0, 10.0),
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
    "ct": frozenset({"model", "ratio", "burden_ohm", "turns", "max_current_a",
                     "accuracy_class_pct"}),
    "uart": frozenset({"port", "baudrate"}),
    "channel": frozenset({"name", "node", "chip_select", "uart", "ct",
                          "meter_constant_imp_per_kwh", "calibration", "enabled", "n_line",
                          "expected_load_w"}),
    "bridge": frozenset({"port", "baud", "encoding", "rate_hz"}),
    "bridge_channel": frozenset({"name", "node", "enabled"}),
}

Table = dict[str, object]
_T = TypeVar("_T")
_D = TypeVar("_D")


def _err(path: Path | None, key: str, problem: str) -> UserError:
    return UserError(f"{path or 'board'}: {key}: {problem}")


def _get(table: Table, key: str, kind: type[_T], default: _D, path: Path | None,
         where: str) -> _T | _D:
    """``table[key]`` checked to be a `kind` (a bool is not an int here), else `default`."""
    return cast("_T | _D", _get_any(table, key, (kind,), default, path, where))


def _get_any(table: Table, key: str, kinds: tuple[type, ...], default: object,
             path: Path | None, where: str) -> object:
    if key not in table:
        return default
    value = table[key]
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise _err(path, where + key, f"expected {kinds[0].__name__}, got {value!r}")
    return value


def _table(data: Table, key: str, path: Path | None, where: str = "") -> Table:
    """A sub-table (``{}`` when absent), its keys checked against the documented ones."""
    table = _get(data, key, dict, {}, path, where)
    _refuse_unknown(table, key, where + key + ".", path)
    return cast(Table, table)


def _positive(value: object, path: Path | None, key: str) -> float:
    """A finite number in the key's documented range (RANGES), else a UserError naming it."""
    lo, hi = RANGES.get(key.rsplit(".", 1)[-1], (0.0, math.inf))
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or not lo < value <= hi):
        raise _err(path, key, f"must be a finite number > {lo:g} and <= {hi:g}, got {value!r}")
    return float(value)


def _refuse_unknown(table: object, kind: str, where: str, path: Path | None) -> None:
    if isinstance(table, dict):
        unknown = sorted(set(table) - _KNOWN_KEYS[kind])
        if unknown:
            known = ", ".join(sorted(_KNOWN_KEYS[kind]))
            raise _err(path, where + unknown[0], f"unknown key (known here: {known})")


# ---- calibration files ----------------------------------------------------------------------
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


# ---- the file -------------------------------------------------------------------------------
def load_board(path: str | Path) -> BoardConfig:
    """Read and validate a board TOML file."""
    path = Path(path)
    data = cast(Table, read_toml_file(path, "board file"))
    _refuse_unknown(data, "", "", path)
    _check_format(data, path)
    name = _get(data, "name", str, path.stem, path, "")
    bus = data.get("bus", "spi")
    if bus not in ("spi", "bridge"):
        raise _err(path, "bus", f"{bus!r}: expected \"spi\" (the Pi reads the chips) or "
                   "\"bridge\" (the board's MCU does)")
    if bus == "bridge":  # the chips sit behind the board's MCU
        return load_bridge_board(data, path)
    if "bridge" in data:
        raise _err(path, "bridge", "a [bridge] table needs bus = \"bridge\"")
    spi = _parse_spi(_table(data, "spi", path), path)
    sampling = _table(data, "sampling", path)
    period = _positive(sampling.get("period_s", DEFAULT_SAMPLE_PERIOD_S), path,
                       "sampling.period_s")
    refresh = _positive(_table(data, "emulator", path).get(
        "refresh_period_s", DEFAULT_REFRESH_PERIOD_S), path, "emulator.refresh_period_s")
    frontend = _parse_frontend(_table(data, "frontend", path), path)
    channels = _parse_channels(data, frontend, path)
    return BoardConfig(
        name=name,
        channels=channels,
        path=path,
        spi_bus=spi.bus,
        speed_hz=spi.speed_hz,
        mode=spi.mode,
        gpio_cs_device=_gpio_cs_device(spi.gpio_cs_device, channels, path),
        sample_period_s=period,
        refresh_period_s=refresh,
        period_explicit="period_s" in sampling,
    )


def _check_format(data: Table, path: Path) -> None:
    fmt = data.get("format")
    if fmt != BOARD_FORMAT:
        raise _err(path, "format", f"expected {BOARD_FORMAT!r}, got {fmt!r}")
    version = data.get("format_version")
    if not isinstance(version, int) or not 1 <= version <= BOARD_FORMAT_VERSION:
        raise _err(path, "format_version", f"{version!r} is not a version this epi reads")


@dataclass(frozen=True)
class SpiSettings:
    bus: int
    speed_hz: int
    mode: int
    gpio_cs_device: int | None


def _parse_spi(spi: Table, path: Path) -> SpiSettings:
    """The `[spi]` table: bus number, speed within the chip's range, mode 3, GPIO-CS device."""
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
    return SpiSettings(spi_bus, speed, mode, gpio_dev)


def _parse_frontend(table: Table, path: Path) -> dict[str, float]:
    frontend = dict(EMULATED_FRONTEND)
    for key in ("un_v", "ib_a", "v_l_mv", "v_u_mv"):
        if key in table:
            frontend[key] = _positive(table[key], path, f"frontend.{key}")
    return frontend


def _parse_channels(data: Table, frontend: dict[str, float], path: Path) -> list[ChannelConfig]:
    raw = data.get("channel")
    if not isinstance(raw, list) or not raw:
        raise _err(path, "channel", "needs at least one [[channel]] table")
    channels: list[ChannelConfig] = []
    for i, table in enumerate(raw):
        if not isinstance(table, dict):
            raise _err(path, f"channel[{i}]", "expected a table")
        ch = _parse_channel(cast(Table, table), i, frontend, path)
        if any(c.name == ch.name for c in channels):
            raise _err(path, f"channel[{i}].name", f"{ch.name!r} used twice")
        if ch.chip_select is not None and any(c.chip_select == ch.chip_select for c in channels):
            raise _err(path, f"channel[{i}].chip_select", f"{ch.chip_select} used by two channels")
        channels.append(ch)
    return channels


def _parse_channel(table: Table, i: int, frontend: dict[str, float], path: Path
                   ) -> ChannelConfig:
    """One `[[channel]]` table of an SPI board."""
    where = f"channel[{i}]."
    _refuse_unknown(table, "channel", where, path)
    cs = _parse_chip_select(table, where, path)
    uart_port, baud = _parse_uart(table, where, path) if cs is None else (None, 9600)
    ct = _table(table, "ct", path, where)
    ch_frontend = _ct_frontend(ct, frontend, where, path)
    mc = _positive(table.get("meter_constant_imp_per_kwh", DEFAULT_METER_CONSTANT), path,
                   where + "meter_constant_imp_per_kwh")
    _check_pl_constant(mc, ch_frontend, where, path)
    cal_path, cal = _parse_calibration(table, mc, where, path)
    return ChannelConfig(
        index=i,
        name=_get(table, "name", str, f"ch{i}", path, where),
        node=_get(table, "node", str, None, path, where),
        chip_select=cs,
        uart_port=uart_port,
        uart_baudrate=baud,
        ct=_ct_fields(ct, where, path),
        meter_constant_imp_per_kwh=mc,
        calibration_path=cal_path,
        calibration=cal,
        enabled=bool(_get(table, "enabled", bool, True, path, where)),
        n_line=bool(_get(table, "n_line", bool, False, path, where)),
        frontend=ch_frontend,
        expected_load_w=_expected_load(table.get("expected_load_w"), where, path),
    )


def _expected_load(value: object, where: str, path: Path) -> tuple[float, float] | None:
    """`expected_load_w = [MIN, MAX]` (W at the wall, 0 < MIN <= MAX), or None."""
    if value is None:
        return None
    key = where + "expected_load_w"
    if not isinstance(value, list) or len(value) != 2:
        raise _err(path, key, f"expected [MIN, MAX] in watts, got {value!r}")
    lo, hi = (_positive(v, path, key) for v in value)
    if lo > hi:
        raise _err(path, key, f"MIN {lo:g} W is above MAX {hi:g} W")
    return lo, hi


def _parse_chip_select(table: Table, where: str, path: Path) -> str | None:
    """`chip_select` as "CE<n>" or "GPIO<n>" (an integer n means GPIO<n>); None for UART."""
    cs = _get_any(table, "chip_select", (str, int), None, path, where)
    if (cs is None) == ("uart" not in table):
        raise _err(path, where + "chip_select",
                   "give exactly one of chip_select (CE0, CE1, GPIO<n>) or uart")
    if cs is None:
        return None
    name = f"GPIO{cs}" if isinstance(cs, int) else str(cs).upper()
    m = CS_RE.match(name)
    if not m or (m.group(3) is not None and int(m.group(3)) > MAX_GPIO):
        raise _err(path, where + "chip_select",
                   f"{name!r}: expected CE<n> (kernel) or GPIO<0..{MAX_GPIO}>")
    return name


def _parse_uart(table: Table, where: str, path: Path) -> tuple[str, int]:
    """The `uart` table of a channel read in the chip's own UART mode: port and baud rate."""
    uart = cast(Table, _get(table, "uart", dict, {}, path, where))
    _refuse_unknown(uart, "uart", where + "uart.", path)
    port = _get(uart, "port", str, None, path, where + "uart.")
    if not port:
        raise _err(path, where + "uart.port", "missing (e.g. /dev/ttyAMA0)")
    baud = _get(uart, "baudrate", int, 9600, path, where + "uart.")
    if baud not in UART_BAUDS:
        raise _err(path, where + "uart.baudrate", f"{baud}: the chip talks 2400 or 9600")
    return port, baud


def _ct_fields(ct: Table, where: str, path: Path) -> dict[str, JSON]:
    """The ``ct`` table as the trace's meta.json repeats it: numbers and text only (a TOML
    date or table there could not be written as JSON)."""
    out: dict[str, JSON] = {}
    for key, value in ct.items():
        if not isinstance(value, (str, int, float)):
            raise _err(path, f"{where}ct.{key}", f"expected a number or text, got {value!r}")
        out[key] = value
    return out


def _ct_frontend(ct: Table, frontend: dict[str, float], where: str, path: Path
                 ) -> dict[str, float]:
    """The board's front end with V_L from the channel's CT ratio and burden, when given."""
    out = dict(frontend)
    ratio, burden = ct.get("ratio"), ct.get("burden_ohm")
    # the feed looped `turns` times through the clamp; V_L (hence the PL constant)
    # includes them, so the chip meters the conductor's own energy (docs/meter.md)
    turns = _positive(ct.get("turns", 1), path, where + "ct.turns")
    if turns != int(turns):
        raise _err(path, where + "ct.turns", f"a whole number of turns, got {turns:g}")
    if ratio is not None or burden is not None:
        r = _positive(ratio, path, where + "ct.ratio")
        b = _positive(burden, path, where + "ct.burden_ohm")
        out["v_l_mv"] = frontend["ib_a"] / r * b * 1000.0 * turns
    return out


def _check_pl_constant(mc: float, frontend: dict[str, float], where: str, path: Path) -> None:
    """The chip must be able to hold the PL constant these values give."""
    try:
        Calibration.default(mc, frontend)
    except (CalibrationError, ValueError, OverflowError) as exc:
        fe = ", ".join(f"{k} {v:g}" for k, v in sorted(frontend.items()))
        raise _err(path, where + "meter_constant_imp_per_kwh",
                   f"{mc:g} imp/kWh with the front end ({fe}; from frontend.un_v, ib_a, "
                   f"v_u_mv and ct.ratio/ct.burden_ohm) cannot be held by the chip: "
                   f"{exc}") from None


def _parse_calibration(table: Table, mc: float, where: str, path: Path
                       ) -> tuple[Path | None, Calibration | None]:
    """The calibration file named by the channel (loaded when it exists), checked against the
    channel's meter constant."""
    value = _get(table, "calibration", str, None, path, where)
    if not value:
        return None, None
    cal_path = path.parent / value
    if not cal_path.exists():
        return cal_path, None
    cal = load_calibration_file(cal_path)
    if abs(cal.meter_constant_imp_per_kwh - mc) > 1e-9 * mc:
        raise _err(path, where + "meter_constant_imp_per_kwh",
                   f"{mc:g} but {cal_path.name} was made for "
                   f"{cal.meter_constant_imp_per_kwh:g} imp/kWh")
    return cal_path, cal


def _gpio_cs_device(gpio_dev: int | None, channels: list[ChannelConfig], path: Path
                    ) -> int | None:
    """The spidev device whose transfers GPIO chip-selects frame: the one given, else the first
    that no kernel chip-select uses."""
    if not any(c.gpio_cs is not None for c in channels):
        return gpio_dev
    kernel_used = {c.kernel_cs for c in channels if c.kernel_cs is not None}
    if gpio_dev is None:
        free = [d for d in range(MAX_SPI_DEVICE + 1) if d not in kernel_used]
        if not free:
            raise _err(path, "spi.gpio_cs_device",
                       "every spidev device carries a chip: none left for GPIO CS")
        return free[0]
    if gpio_dev in kernel_used:
        raise _err(path, "spi.gpio_cs_device",
                   f"{gpio_dev}: CE{gpio_dev} carries a chip, so its spidev device cannot "
                   "also serve GPIO chip-selects")
    return gpio_dev


# ---- bridge boards --------------------------------------------------------------------------
def parse_bridge_table(data: Table, path: Path | None) -> BridgeConfig:
    """The `[bridge]` table of a board file; UserError naming the file and key."""
    where = path or "board"
    table = data.get("bridge")
    if not isinstance(table, dict):
        raise UserError(f"{where}: bridge: bus = \"bridge\" needs a [bridge] table with port")
    unknown = set(table) - _KNOWN_KEYS["bridge"]
    if unknown:
        raise UserError(f"{where}: bridge.{sorted(unknown)[0]}: unknown key")
    port = table.get("port")
    if not isinstance(port, str) or not port:
        raise UserError(f"{where}: bridge.port: missing (e.g. /dev/ttyAMA0)")
    baud = table.get("baud", DEFAULT_BRIDGE_BAUD)
    if isinstance(baud, bool) or baud not in BRIDGE_BAUDS:
        raise UserError(f"{where}: bridge.baud: {baud!r} is not one of {BRIDGE_BAUDS}")
    enc = table.get("encoding")
    if enc is not None and enc not in ("json", "compact"):
        raise UserError(f"{where}: bridge.encoding: {enc!r}: expected \"json\" or \"compact\"")
    rate = table.get("rate_hz")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                             or not 0 < rate <= 1000):
        raise UserError(f"{where}: bridge.rate_hz: {rate!r}: expected a number in (0, 1000]")
    return BridgeConfig(port, int(baud), enc, float(rate) if rate is not None else None)


def load_bridge_board(data: Table, path: Path | None) -> BoardConfig:
    """A BoardConfig for a bridge board: the `[bridge]` table and the MCU's channel names."""
    where = path or "board"
    if "spi" in data:  # the Pi does not talk SPI to a bridge board's chips: never ignore it
        raise UserError(f"{where}: spi: a [spi] table is for bus = \"spi\"; a bridge board's "
                        "chips are read by its MCU (remove [spi], or set bus = \"spi\")")
    bridge = parse_bridge_table(data, path)
    raw = data.get("channel", [])
    if not isinstance(raw, list):
        raise UserError(f"{where}: channel: expected [[channel]] tables")
    channels = []
    for i, table in enumerate(raw or [{} for _ in range(4)]):
        if not isinstance(table, dict):
            raise UserError(f"{where}: channel[{i}]: expected a table")
        unknown = set(table) - _KNOWN_KEYS["bridge_channel"]
        if unknown:
            raise UserError(f"{where}: channel[{i}].{sorted(unknown)[0]}: unknown key for a "
                            "bridge board (chip selects and calibration live on the MCU)")
        name = table.get("name", f"ch{i}")
        node = table.get("node")
        if not isinstance(name, str) or (node is not None and not isinstance(node, str)):
            raise UserError(f"{where}: channel[{i}]: name and node must be strings")
        enabled = table.get("enabled", True)
        if not isinstance(enabled, bool):
            raise UserError(f"{where}: channel[{i}].enabled: expected true or false")
        channels.append(ChannelConfig(index=i, name=name, node=node, enabled=enabled))
    return BoardConfig(name=str(data.get("name", Path(str(where)).stem)), channels=channels,
                       path=path, bridge=bridge)
