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

Chip selects, SPI and calibration live on the MCU (its flash file `epi_meter.json`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epi.core.errors import UserError

DEFAULT_BAUD = 115200
BAUDS = (9600, 19200, 38400, 57600, 115200, 230400, 460800, 921600, 1000000)


@dataclass(frozen=True)
class BridgeConfig:
    port: str
    baud: int = DEFAULT_BAUD
    encoding: str | None = None
    rate_hz: float | None = None

    def describe(self) -> dict:
        return {"bus": "bridge", "port": self.port, "baud": self.baud,
                "encoding": self.encoding, "rate_hz": self.rate_hz}


def parse_bridge_table(data: dict[str, Any], path: Path | None) -> BridgeConfig:
    """The `[bridge]` table of a board file; UserError naming the file and key."""
    where = path or "board"
    table = data.get("bridge")
    if not isinstance(table, dict):
        raise UserError(f"{where}: bridge: bus = \"bridge\" needs a [bridge] table with port")
    unknown = set(table) - {"port", "baud", "encoding", "rate_hz"}
    if unknown:
        raise UserError(f"{where}: bridge.{sorted(unknown)[0]}: unknown key")
    port = table.get("port")
    if not isinstance(port, str) or not port:
        raise UserError(f"{where}: bridge.port: missing (e.g. /dev/ttyAMA0)")
    baud = table.get("baud", DEFAULT_BAUD)
    if isinstance(baud, bool) or baud not in BAUDS:
        raise UserError(f"{where}: bridge.baud: {baud!r} is not one of {BAUDS}")
    enc = table.get("encoding")
    if enc is not None and enc not in ("json", "compact"):
        raise UserError(f"{where}: bridge.encoding: {enc!r}: expected \"json\" or \"compact\"")
    rate = table.get("rate_hz")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                             or not 0 < rate <= 1000):
        raise UserError(f"{where}: bridge.rate_hz: {rate!r}: expected a number in (0, 1000]")
    return BridgeConfig(port, int(baud), enc, float(rate) if rate is not None else None)


def load_bridge_board(data: dict[str, Any], path: Path | None) -> Any:
    """A BoardConfig for a bridge board (called by meter.board.load_board)."""
    from meter.board import BoardConfig, ChannelConfig

    where = path or "board"
    bridge = parse_bridge_table(data, path)
    raw = data.get("channel", [])
    if not isinstance(raw, list):
        raise UserError(f"{where}: channel: expected [[channel]] tables")
    channels = []
    for i, table in enumerate(raw or [{} for _ in range(4)]):
        if not isinstance(table, dict):
            raise UserError(f"{where}: channel[{i}]: expected a table")
        unknown = set(table) - {"name", "node", "enabled"}
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
