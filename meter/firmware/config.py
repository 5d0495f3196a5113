"""The board configuration file on the MCU's flash (`epi_meter.json`), with its defaults.

    {"format": "epi-bridge-config", "format_version": 1, "board": "epi-meter",
     "uart": {"id": 0, "tx": 0, "rx": 1, "baud": 115200},
     "spi": {"id": 0, "sck": 18, "mosi": 19, "miso": 16, "baud": 160000},
     "channels": [{"cs": 17, "meter_constant_imp_per_kwh": 1e8, "calibration": {...}}, ...],
     "rate_hz": 10, "encoding": "json", "first_measurement_ms": 2000}

`calibration` is the epi calibration record (meter.chip.calibration, the same JSON as
`epi meter calibrate` writes); a channel without one runs on design values (and says so in
`hello`). A file that cannot be read, parsed or that has a wrong type anywhere (`check_config`)
changes nothing: the last good configuration (LAST_GOOD_FILE, kept each time a file passes)
or the defaults stay in force and the problem is reported in `hello` (`config_error`), so a
bad file never bricks the board.
`first_measurement_ms` is how long after start-up (or a re-start) a chip's measurement
registers hold their first complete measurement (2 s for real chips, as the Pi's driver
waits; the emulator's refresh period for emulated ones); readings before are sent as
`fail: "not_ready"` (counts, no values).
MicroPython subset.
"""

import json

from meter.chip.calibration import Calibration, CalibrationError

CONFIG_FILE = "epi_meter.json"
CONFIG_FORMAT = "epi-bridge-config"
MAX_SPI_BAUD = 160000
DEFAULT_METER_CONSTANT = 100000000.0
DEFAULT_CS_PINS = (17, 20, 21, 22)


def default_config():
    return {
        "format": CONFIG_FORMAT,
        "format_version": 1,
        "board": "epi-meter",
        "uart": {"id": 0, "tx": 0, "rx": 1, "baud": 115200},
        "spi": {"id": 0, "sck": 18, "mosi": 19, "miso": 16, "baud": MAX_SPI_BAUD},
        "channels": [{"cs": pin} for pin in DEFAULT_CS_PINS],
        "rate_hz": 10.0,
        "encoding": "json",
        "first_measurement_ms": 2000,
    }


MAX_CHANNELS = 8  # chip-select lines the board routes (and what one sweep carries in time)
MAX_RATE_HZ = 1000.0


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x):
    return (isinstance(x, (int, float)) and not isinstance(x, bool) and x == x
            and x not in (float("inf"), float("-inf")))


def _check_bus(data, key, fields):
    """Why data[key] (a bus: an object of integer pins and a baud) is not one, or None."""
    bus = data[key]
    if not isinstance(bus, dict):
        return "%s is not an object" % key
    for name in fields:
        if name in bus and (not _is_int(bus[name]) or bus[name] < 0):
            return "%s.%s is not a non-negative integer: %r" % (key, name, bus[name])
    if "baud" in bus and bus["baud"] <= 0:
        return "%s.baud is not above 0: %r" % (key, bus["baud"])
    return None


def check_config(data):
    """Why a parsed configuration file cannot run the board (one line), or None.

    The same check runs on the board (load_config) and before `epi meter firmware deploy`
    copies anything (meter.bridge.firmware_tools), so a file deploy accepts is one the board
    runs."""
    if not isinstance(data, dict) or data.get("format") != CONFIG_FORMAT:
        return "format is not %r" % CONFIG_FORMAT
    for key, fields in (("uart", ("id", "tx", "rx", "baud")),
                        ("spi", ("id", "sck", "mosi", "miso", "baud"))):
        if key in data:
            problem = _check_bus(data, key, fields)
            if problem is not None:
                return problem
    if "channels" in data:
        chans = data["channels"]
        if not isinstance(chans, list) or not 1 <= len(chans) <= MAX_CHANNELS:
            return "channels is not a list of 1..%d channel objects" % MAX_CHANNELS
        for i, c in enumerate(chans):
            if not isinstance(c, dict):
                return "channels[%d] is not an object" % i
            if not _is_int(c.get("cs")) or c["cs"] < 0:
                return "channels[%d].cs is not a pin number: %r" % (i, c.get("cs"))
            mc = c.get("meter_constant_imp_per_kwh", DEFAULT_METER_CONSTANT)
            if not _is_number(mc) or mc <= 0:
                return "channels[%d].meter_constant_imp_per_kwh is not a number > 0: %r" % (
                    i, mc)
            if "calibration" in c and not isinstance(c["calibration"], dict):
                return "channels[%d].calibration is not an object" % i
    if "rate_hz" in data and (not _is_number(data["rate_hz"])
                              or not 0 < data["rate_hz"] <= MAX_RATE_HZ):
        return "rate_hz is not a number in (0, %g]: %r" % (MAX_RATE_HZ, data["rate_hz"])
    if "encoding" in data and data["encoding"] not in ("json", "compact"):
        return "encoding is not json or compact: %r" % (data["encoding"],)
    if "first_measurement_ms" in data and (not _is_number(data["first_measurement_ms"])
                                           or data["first_measurement_ms"] < 0):
        return "first_measurement_ms is not a number >= 0: %r" % (data["first_measurement_ms"],)
    if "board" in data and not isinstance(data["board"], str):
        return "board is not a string"
    return None


def parse_config(text):
    """(config, error): the defaults overlaid with the file's keys; error is None or why.

    A file that is not JSON or fails `check_config` changes nothing (the defaults stand,
    never half of a bad file); a spi.baud above MAX_SPI_BAUD is clamped and said so."""
    cfg = default_config()
    try:
        data = json.loads(text)
    except ValueError as exc:
        return cfg, "%s: not valid JSON (%s)" % (CONFIG_FILE, exc)
    problem = check_config(data)
    if problem is not None:
        return cfg, "%s: %s" % (CONFIG_FILE, problem)
    for key in ("board", "uart", "spi", "channels", "rate_hz", "encoding",
                "first_measurement_ms"):
        if key in data:
            cfg[key] = data[key]
    for key, defaults in (("uart", default_config()["uart"]), ("spi", default_config()["spi"])):
        merged = dict(defaults)
        merged.update(cfg[key])
        cfg[key] = merged
    if cfg["spi"]["baud"] > MAX_SPI_BAUD:
        cfg["spi"]["baud"] = MAX_SPI_BAUD
        return cfg, "%s: spi.baud above %d Hz, clamped" % (CONFIG_FILE, MAX_SPI_BAUD)
    return cfg, None


def channel_calibration(channel):
    """(Calibration, source) of one channel entry of the configuration."""
    mc = channel.get("meter_constant_imp_per_kwh", DEFAULT_METER_CONSTANT)
    record = channel.get("calibration")
    if record is not None:
        try:
            return Calibration.from_dict(record), "flash"
        except CalibrationError as exc:
            return Calibration.default(mc), "design values (flash record rejected: %s)" % exc
    return Calibration.default(mc), "design values"


LAST_GOOD_FILE = "epi_meter.last-good.json"


def load_config(read_file, write_file=None):
    """Read CONFIG_FILE through `read_file(name) -> str` (OSError when absent).

    A file that passes is kept as LAST_GOOD_FILE through `write_file(name, text)`; a bad one
    leaves the last good configuration in force (the defaults when there is none), and the
    error (for `hello`'s config_error) says which."""
    try:
        text = read_file(CONFIG_FILE)
    except OSError:
        return default_config(), None
    cfg, error = parse_config(text)
    if error is None or error.endswith("clamped"):
        if write_file is not None:
            try:  # noqa: SIM105  # MicroPython has no contextlib on every port
                write_file(LAST_GOOD_FILE, text)
            except OSError:
                pass  # a full or read-only flash: the board still runs this configuration
        return cfg, error
    try:
        good, good_error = parse_config(read_file(LAST_GOOD_FILE))
    except OSError:
        return cfg, error + "; defaults in force"
    if good_error is not None and not good_error.endswith("clamped"):
        return default_config(), error + "; defaults in force"
    return good, error + "; the last good configuration is in force"
