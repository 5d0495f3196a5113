"""Ask a serial port whether the board's firmware answers (`hello`), for `epi doctor` and
`epi meter firmware console`.

The port is the one given, else `EPI_BRIDGE_PORT`, else the first that exists of the Pi 5's
UART0 (/dev/ttyAMA0), /dev/serial0, and a Pico's USB serial (/dev/ttyACM0).
"""

from __future__ import annotations

import os
import time

from meter.bridge.link import SerialLink
from meter.bridge.protocol import LineError, Message, command, decode_line
from meter.errors import LinkLost

CANDIDATE_PORTS = ("/dev/ttyAMA0", "/dev/serial0", "/dev/ttyACM0")


def default_port() -> str | None:
    env = os.environ.get("EPI_BRIDGE_PORT")
    if env:
        return env
    return next((p for p in CANDIDATE_PORTS if os.path.exists(p)), None)


def hello(port: str, baud: int = 115200, timeout_s: float = 2.0) -> dict[str, object] | None:
    """The firmware's hello fields, or None when nothing on `port` answers in time.

    Raises LinkLost when the port cannot be opened.
    """
    link = SerialLink(port, baud)
    link.open()
    try:
        link.write(command("hello"))
        buf = b""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            buf += link.read(0.1)
            *lines, buf = buf.split(b"\n")
            for ln in lines:
                try:
                    msg = decode_line(ln + b"\n")
                except LineError:
                    continue
                if isinstance(msg, Message) and msg.kind == "hello":
                    return msg.fields
        return None
    finally:
        link.close()


def doctor_rows(port: str | None = None, baud: int | None = None) -> list[tuple]:
    """(item, ok, detail, fix) rows for `epi doctor`."""
    port = port or default_port()
    baud = baud or int(os.environ.get("EPI_BRIDGE_BAUD", "115200"))
    if port is None:
        return [("bridge port", None, "none found (" + ", ".join(CANDIDATE_PORTS) + "; or set "
                 "EPI_BRIDGE_PORT)", "")]
    try:
        info = hello(port, baud, timeout_s=1.5)
    except LinkLost as exc:
        return [("bridge port", False, f"{port}: cannot open: {exc}",
                 "enable the UART (dtparam=uart0=on) and add yourself to the dialout group")]
    if info is None:
        return [("bridge port", True, f"{port} at {baud} baud", ""),
                ("bridge firmware", False, "no epi firmware answers hello",
                 "epi meter firmware deploy --port <the Pico's USB port>; wiring: docs/bridge.md")]
    chans = info.get("channels")
    hw = info.get("hw")
    mcu = hw.get("mcu", "?") if isinstance(hw, dict) else "?"
    return [("bridge port", True, f"{port} at {baud} baud", ""),
            ("bridge firmware", True,
             f"epi firmware {info.get('fw')} (protocol {info.get('proto')}) on "
             f"{mcu}, board {info.get('board')}, "
             f"{len(chans) if isinstance(chans, list) else 0} channel(s), "
             f"boot {info.get('boot')}", "")]
