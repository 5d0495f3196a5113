"""Decode the firmware's telemetry lines (docs/formats.md §8) and encode commands.

`decode_line(raw)` turns one line into a `Sweep`, or a `Message` (hello, pong, reply, error,
event), or raises `LineError` (bad CRC, not JSON, unknown kind, truncated compact record).
The compact record's register words are decoded with meter.chip.registers, the same codecs
the firmware and the direct-SPI driver use.
"""

from __future__ import annotations

import binascii
import json
import math
from dataclasses import dataclass, field

from meter.chip import registers as regs
from meter.firmware.crc import seal, unseal
from meter.firmware.telemetry import FAILED, NOT_READY, NOT_READY_FLAG, PROTOCOL_VERSION

__all__ = ["PROTOCOL_VERSION", "ChannelReading", "LineError", "Message", "Sweep", "command",
           "decode_line"]


class LineError(ValueError):
    """A line that cannot be used: `kind` is `crc` or `parse`."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


@dataclass(frozen=True)
class ChannelReading:
    """One channel of a sweep. `fail` is the fault kind when the reading failed (values None)."""

    channel: int
    counts: int
    offset_us: int = 0
    status: int | None = None
    power_w: float | None = None
    voltage_v: float | None = None
    current_a: float | None = None
    power_factor: float | None = None
    frequency_hz: float | None = None
    fail: str | None = None


@dataclass(frozen=True)
class Sweep:
    seq: int
    t_us: int
    channels: tuple[ChannelReading, ...]
    encoding: str


@dataclass(frozen=True)
class Message:
    kind: str  # hello, pong, r, err, ev
    fields: dict[str, object] = field(default_factory=dict)


def _uint(data: bytes, pos: int, n: int) -> tuple[int, int]:
    if pos + n > len(data):
        raise LineError("parse", "compact record truncated")
    return int.from_bytes(data[pos:pos + n], "little"), pos + n


def _decode_compact(body: bytes) -> Sweep:
    try:
        data = binascii.a2b_base64(body)
    except (binascii.Error, ValueError) as exc:
        raise LineError("parse", f"compact record is not base64: {exc}") from None
    seq, p = _uint(data, 0, 4)
    t_us, p = _uint(data, p, 8)
    n, p = _uint(data, p, 1)
    chans = []
    for _ in range(n):
        ch, p = _uint(data, p, 1)
        counts, p = _uint(data, p, 6)
        if ch & FAILED:
            fail = NOT_READY if ch & NOT_READY_FLAG else "failed"
            chans.append(ChannelReading(ch & 0x3F, counts, fail=fail))
            continue
        status, p = _uint(data, p, 2)
        offset, p = _uint(data, p, 2)
        pmean, p = _uint(data, p, 2)
        lsb_hi, p = _uint(data, p, 1)
        urms, p = _uint(data, p, 2)
        irms, p = _uint(data, p, 2)
        pf, p = _uint(data, p, 2)
        freq, p = _uint(data, p, 2)
        chans.append(ChannelReading(
            ch, counts, offset, status,
            regs.extended_value(regs.BY_ADDRESS[0x4A], pmean, lsb_hi << 8),
            regs.BY_ADDRESS[0x49].decode(urms), regs.BY_ADDRESS[0x48].decode(irms),
            regs.BY_ADDRESS[0x4D].decode(pf), regs.BY_ADDRESS[0x4C].decode(freq)))
    if p != len(data):
        raise LineError("parse", f"compact record has {len(data) - p} trailing bytes")
    return Sweep(seq, t_us, tuple(chans), "compact")


MAX_FIELD_INT = 2**64 - 1  # the compact record's widest field (t_us, u64)


def _int(obj: dict, key: str) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_FIELD_INT:
        raise LineError("parse", f"field {key!r} is not an integer 0..2^64-1: {str(v)[:40]}")
    return v


def _num(obj: dict, key: str) -> float | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise LineError("parse", f"field {key!r} is not a number: {str(v)[:40]}")
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):  # JSON's NaN/Infinity, or an integer beyond a float
        raise LineError("parse", f"field {key!r} is not a finite number: {str(v)[:40]}")
    return x


def _decode_json_sweep(obj: dict) -> Sweep:
    chans = []
    raw = obj.get("c")
    if not isinstance(raw, list):
        raise LineError("parse", "sweep without a channel list 'c'")
    for c in raw:
        if not isinstance(c, dict):
            raise LineError("parse", "channel entry is not an object")
        if "fail" in c:
            chans.append(ChannelReading(_int(c, "n"), _int(c, "e"), fail=str(c["fail"])))
            continue
        chans.append(ChannelReading(
            _int(c, "n"), _int(c, "e"), _int(c, "o"), _int(c, "s"), _num(c, "p"),
            _num(c, "v"), _num(c, "i"), _num(c, "pf"), _num(c, "f")))
    return Sweep(_int(obj, "q"), _int(obj, "t"), tuple(chans), "json")


def decode_line(raw: bytes) -> Sweep | Message:
    """One received line (with or without its newline)."""
    payload = unseal(raw)
    if payload is None:
        raise LineError("crc", f"CRC missing or wrong: {raw[:60]!r}")
    if payload.startswith(b"S"):
        return _decode_compact(payload[1:])
    try:
        obj = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # nesting too deep too
        raise LineError("parse", f"not JSON ({str(exc)[:80]}): {payload[:60]!r}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("k"), str):
        raise LineError("parse", f"no kind 'k': {payload[:60]!r}")
    kind = obj.pop("k")
    if kind == "s":
        return _decode_json_sweep(obj)
    if kind in ("hello", "pong", "r", "err", "ev"):
        return Message(kind, obj)
    raise LineError("parse", f"unknown line kind {kind!r}")


def command(name: str, **fields: object) -> bytes:
    """A command line for the firmware, sealed with its CRC."""
    obj = {"cmd": name, **fields}
    return seal(json.dumps(obj, separators=(",", ":")).encode())
