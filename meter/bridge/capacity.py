"""How many sweep lines per second a serial link carries: the bridge's rate limit.

A UART at `baud` moves baud / 10 bytes a second (8N1: start, 8 data, stop bits). A sweep line's
length depends on its values, so the limit uses the widest line the firmware's own encoder
(meter/firmware/telemetry.py) writes for the channel count: every field at its widest (sequence
and time at 10 and 14 digits, 6-byte energy counts, every register word at full scale). A rate
under the limit can never queue lines in the MCU's transmit buffer, whatever the readings.
At 115200 baud that is 24 JSON lines/s for four channels (a typical line of ~357 bytes would
allow ~32) and 80 compact lines/s.
"""

from __future__ import annotations

from meter.firmware.telemetry import ENCODINGS, sweep_compact, sweep_json

UART_BITS_PER_BYTE = 10
_WIDE_RAW = (0x7FFF, 0xFF, 0xFFFF, 0xFFFF, 0x8FFF, 0xFFFF)  # full-scale register words
_WIDE_COUNTS = 2**40 + 12345  # 13 digits: years of energy at the default meter constant
_WIDE_SEQ = 10**9
_WIDE_T_US = 10**13  # 115 days of MCU time in µs


def widest_sweep_line_bytes(encoding: str, n_channels: int) -> int:
    """Bytes of the longest sweep line the firmware sends for `n_channels` (line end included)."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding {encoding!r}: expected one of {ENCODINGS}")
    channels = [(i, _WIDE_COUNTS, (0xFFFF, 99999, _WIDE_RAW)) for i in range(n_channels)]
    encode = sweep_json if encoding == "json" else sweep_compact
    return len(encode(_WIDE_SEQ, _WIDE_T_US, channels))


def link_capacity_hz(baud: int, encoding: str, n_channels: int) -> float:
    """Sweep lines per second a UART at `baud` carries at most (widest lines back to back)."""
    return baud / UART_BITS_PER_BYTE / widest_sweep_line_bytes(encoding, n_channels)
