"""The firmware's `hello` line, checked: the one MCU line whose numbers set how counts become
joules, so nothing in it is trusted until it is read here (docs/bridge.md).

`parse_hello(fields)` returns a `Hello` or raises `LineError("hello", ...)` naming the field:
a boot id that is not a non-empty string, a channel list that is not a list of objects, a
channel number outside 0..MAX_CHANNEL or given twice, a meter constant that is not a finite
number > 0 (and within the trace reader's bound). The recorder then stops with that line (a
`bus_error` event in the trace, exit status 2) instead of converting counts with a wrong (or
crashing) constant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from epi.formats.trace import MAX_METER_CONSTANT
from meter.bridge.protocol import LineError

MAX_CHANNEL = 63


@dataclass(frozen=True)
class HelloChannel:
    channel: int
    meter_constant_imp_per_kwh: float
    calibration: str  # where the MCU's calibration came from, as it says


@dataclass(frozen=True)
class Hello:
    boot: str
    channels: tuple[HelloChannel, ...]
    rate_hz: float | None
    encoding: str | None
    streaming: bool
    fields: dict[str, object]  # the whole line, for meta.json's `bridge.firmware`

    def channel(self, index: object) -> HelloChannel | None:
        return next((c for c in self.channels if c.channel == index), None)


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def parse_hello(fields: Mapping[str, object]) -> Hello:
    """The checked hello; LineError naming the first bad field."""
    boot = fields.get("boot")
    if not isinstance(boot, (str, int)) or isinstance(boot, bool) or str(boot) == "":
        raise LineError("hello", f"hello: boot {boot!r:.40} is not a boot id")
    raw = fields.get("channels")
    if not isinstance(raw, list) or not raw:
        raise LineError("hello", f"hello: channels {raw!r:.40} is not a list of channels")
    channels: list[HelloChannel] = []
    for i, c in enumerate(raw):
        if not isinstance(c, dict):
            raise LineError("hello", f"hello: channels[{i}] is not an object")
        n = c.get("n")
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_CHANNEL:
            raise LineError("hello", f"hello: channels[{i}].n {n!r:.40} is not a channel 0.."
                            f"{MAX_CHANNEL}")
        if any(h.channel == n for h in channels):
            raise LineError("hello", f"hello: channel {n} given twice")
        mc = _number(c.get("meter_constant_imp_per_kwh"))
        # the trace reader's own bound: a constant it would refuse never reaches meta.json
        if mc is None or not 0 < mc <= MAX_METER_CONSTANT:
            raise LineError("hello", f"hello: channels[{i}].meter_constant_imp_per_kwh "
                            f"{c.get('meter_constant_imp_per_kwh')!r:.40} is not a number > 0 "
                            f"and <= {MAX_METER_CONSTANT:g}")
        channels.append(HelloChannel(n, mc, str(c.get("cal"))))
    rate = _number(fields.get("rate_hz"))
    enc = fields.get("enc")
    return Hello(boot=str(boot), channels=tuple(channels),
                 rate_hz=rate if rate is not None and rate > 0 else None,
                 encoding=enc if isinstance(enc, str) else None,
                 streaming=fields.get("streaming", True) is not False,
                 fields=dict(fields))
