"""Board files with `bus = "bridge"`: the chips sit behind the board's MCU, reached over a UART.

    format = "epi-board"
    format_version = 1
    name = "epi-meter (bridge)"
    bus = "bridge"

    [bridge]
    port = "/dev/ttyAMA0"   # Pi 5 UART0 on GPIO14 (TXD) / GPIO15 (RXD)
    baud = 115200
    encoding = "json"       # or "compact" (fits the SPI-limited rate at 115200 baud)
    rate_hz = 10            # sweeps per second over all channels

    [[channel]]              # optional: names and nodes of the MCU's channels 0..3
    name = "node0"
    node = "pi5-node0"

Chip selects, SPI and calibration live on the MCU (its flash file `epi_meter.json`). The data
class lives in meter/board/config.py and the parser in meter/board/file.py, below the chip
factory; this module names them for the bridge's readers.
"""

from __future__ import annotations

from meter.board.config import DEFAULT_BRIDGE_BAUD as DEFAULT_BAUD
from meter.board.config import BridgeConfig
from meter.board.file import BRIDGE_BAUDS as BAUDS
from meter.board.file import load_bridge_board, parse_bridge_table

__all__ = ["BAUDS", "DEFAULT_BAUD", "BridgeConfig", "load_bridge_board", "parse_bridge_table"]
