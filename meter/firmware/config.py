"""The board configuration file on the MCU's flash (`epi_meter.json`), with its defaults.

    {"format": "epi-bridge-config", "format_version": 1, "board": "epi-meter",
     "uart": {"id": 0, "tx": 0, "rx": 1, "baud": 115200},
     "spi": {"id": 0, "sck": 18, "mosi": 19, "miso": 16, "baud": 160000},
     "channels": [{"cs": 17, "meter_constant_imp_per_kwh": 1e8, "calibration": {...}}, ...],
     "rate_hz": 10, "encoding": "json", "first_measurement_ms": 2000}

`calibration` is the epi calibration record (meter.chip.calibration, the same JSON as
`epi meter calibrate` writes); a channel without one runs on design values (and says so in
`hello`). A file that cannot be read or parsed leaves the defaults in force and the problem
is reported in `hello` (`config_error`), so a bad file never bricks the board.
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


def parse_config(text):
    """(config, error): the defaults overlaid with the file's keys; error is None or why."""
    cfg = default_config()
    try:
        data = json.loads(text)
    except ValueError as exc:
        return cfg, "%s: not valid JSON (%s)" % (CONFIG_FILE, exc)
    if not isinstance(data, dict) or data.get("format") != CONFIG_FORMAT:
        return cfg, "%s: format is not %r" % (CONFIG_FILE, CONFIG_FORMAT)
    for key in ("board", "uart", "spi", "channels", "rate_hz", "encoding",
                "first_measurement_ms"):
        if key in data:
            cfg[key] = data[key]
    if cfg["spi"].get("baud", MAX_SPI_BAUD) > MAX_SPI_BAUD:
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


def load_config(read_file):
    """Read CONFIG_FILE through `read_file(name) -> str` (OSError when absent)."""
    try:
        text = read_file(CONFIG_FILE)
    except OSError:
        return default_config(), None
    return parse_config(text)
