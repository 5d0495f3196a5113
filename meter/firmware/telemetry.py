"""Telemetry lines of protocol version 1 (docs/formats.md §8 "Bridge telemetry").

Every line is `PAYLOAD*CCCC\\n` with CCCC the CRC-16/CCITT-FALSE of PAYLOAD in hex.

* JSON (the readable default): PAYLOAD is one JSON object with `"k"` saying what it is:
  `s` sweep, `ev` event, `hello`, `pong`, `r` (reply), `err`.
* compact (sweeps only; events and replies stay JSON): PAYLOAD is `S` + base64 of a
  little-endian record: seq u32, t_us u64, n_channels u8, then per channel
  ch u8 (bit 7 set: no reading, only the counts follow; bit 6 too: not ready, i.e. before
  the chip's first complete measurement after a (re)start), counts u48,
  and for a good reading: status u16, energy offset u16 (µs after t_us), Pmean u16,
  LSB high byte u8, Urms u16, Irms u16, PowerF u16, Freq u16 (register words, decoded on
  the Pi with meter.chip.registers).

A sweep carries per channel its cumulative ATenergy count (never wraps), so a lost line loses
time resolution, never energy. A failed reading is never sent as 0: JSON gives
`"fail": kind` (`not_ready` before a chip's first complete measurement after a (re)start,
`implausible` for a reading that failed the plausibility checks twice, or the fault kind),
compact sets bit 7 (and bit 6 for not ready). Protocol version 2 (1 had no not-ready state:
the Pi guessed it from the values). MicroPython subset.
"""

import json

try:
    import binascii
except ImportError:  # pragma: no cover - very old MicroPython ports
    import ubinascii as binascii  # type: ignore[import-not-found, no-redef]  # MicroPython only

from meter.firmware.chip import decode_raw
from meter.firmware.crc import seal

PROTOCOL_VERSION = 2
ENCODINGS = ("json", "compact")
FAILED = 0x80
NOT_READY_FLAG = 0x40  # with FAILED: the chip's first measurement is still to come
NOT_READY = "not_ready"


def _put(buf, value, n):
    for _ in range(n):
        buf.append(value & 0xFF)
        value >>= 8


def _round(x, digits):
    return round(x * (10 ** digits)) / (10 ** digits)


def sweep_json(seq, t_us, channels):
    """A JSON sweep line. channels: [(ch, counts, None/kind or (status, offset_us, raw))],
    raw = (Pmean, LSB, Urms, Irms, PowerF, Freq) words, sent decoded (W, V, A, -, Hz)."""
    parts = []
    for ch, counts, reading in channels:
        if reading is None or isinstance(reading, str):
            parts.append('{"n":%d,"e":%d,"fail":%s}' % (ch, counts, json.dumps(reading or "?")))
            continue
        status, offset, raw = reading
        v = decode_raw(raw)
        parts.append(
            '{"n":%d,"e":%d,"o":%d,"s":%d,"p":%s,"v":%s,"i":%s,"pf":%s,"f":%s}'
            % (ch, counts, offset, status, repr(_round(v[0], 4)), repr(_round(v[1], 2)),
               repr(_round(v[2], 3)), repr(_round(v[3], 3)), repr(_round(v[4], 2)))
        )
    payload = '{"k":"s","q":%d,"t":%d,"c":[%s]}' % (seq, t_us, ",".join(parts))
    return seal(payload.encode())


def sweep_compact(seq, t_us, channels):
    """A compact sweep line. channels: [(ch, counts, None/kind or (status, offset, raw))],
    raw = (Pmean, LSB, Urms, Irms, PowerF, Freq) register words."""
    buf = bytearray()
    _put(buf, seq, 4)
    _put(buf, t_us, 8)
    buf.append(len(channels))
    for ch, counts, reading in channels:
        if reading is None or isinstance(reading, str):
            buf.append(ch | FAILED | (NOT_READY_FLAG if reading == NOT_READY else 0))
            _put(buf, counts, 6)
            continue
        status, offset, raw = reading
        buf.append(ch)
        _put(buf, counts, 6)
        _put(buf, status, 2)
        _put(buf, min(offset, 0xFFFF), 2)
        _put(buf, raw[0], 2)
        buf.append((raw[1] >> 8) & 0xFF)
        for w in raw[2:]:
            _put(buf, w, 2)
    b64 = binascii.b2a_base64(bytes(buf))
    if b64.endswith(b"\n"):
        b64 = b64[:-1]
    return seal(b"S" + b64)


def message(kind, fields):
    """A JSON line {"k": kind, **fields} (events, hello, pong, replies, errors)."""
    obj = {"k": kind}
    for key in fields:
        obj[key] = fields[key]
    return seal(json.dumps(obj).encode())


def event(seq, t_us, channel, kind, detail):
    """An event line: a chip fault or a firmware notice (`kind` as in the epi trace)."""
    return message("ev", {"q": seq, "t": t_us, "n": channel, "kind": kind, "d": detail})
