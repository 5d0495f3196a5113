"""The firmware's hello is untrusted input (issue 30): a hello whose channel numbers or meter
constants are not what the protocol says is dropped with a `bus_error` event; it never crashes
the recorder and never sets how counts become joules."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from epi.formats.trace import segment_paths
from meter.bridge.recorder import BridgeRecorder
from meter.clock import SimulatedClock
from meter.daemon.trace import TraceWriter
from meter.firmware.telemetry import message


class OneShotLink:
    """A link that delivers `data` on its first read, then nothing (time passes)."""

    def __init__(self, clock: SimulatedClock, data: bytes) -> None:
        self.clock = clock
        self.data = data

    def open(self) -> None:
        return None

    def read(self, timeout_s: float) -> bytes:
        data, self.data = self.data, b""
        if not data:
            self.clock.advance(round(timeout_s * 1e9))
        return data

    def write(self, data: bytes) -> None:
        return None

    def close(self) -> None:
        return None

    def describe(self) -> dict[str, object]:
        return {"kind": "test"}


def _hello(channels: object) -> bytes:
    return bytes(message("hello", {"boot": "b1", "fw": "1.0.0", "proto": 2, "rate_hz": 10,
                                   "enc": "json", "channels": channels}))


def _events(trace_dir: Path) -> list[dict[str, str]]:
    import csv

    with segment_paths(trace_dir, 1)[2].open(newline="") as f:
        return list(csv.DictReader(f))


GOOD = {"n": 0, "meter_constant_imp_per_kwh": 1e8, "cal": "flash"}


@pytest.mark.parametrize(("channels", "why"), [
    ([{**GOOD, "meter_constant_imp_per_kwh": -1e8}], "not a number > 0"),
    ([{**GOOD, "meter_constant_imp_per_kwh": 0}], "not a number > 0"),
    ([{**GOOD, "meter_constant_imp_per_kwh": math.nan}], ""),
    ([{**GOOD, "meter_constant_imp_per_kwh": "1e8"}], "not a number > 0"),
    ([{"meter_constant_imp_per_kwh": 1e8}], "is not a channel"),
    ([{**GOOD, "n": "0"}], "is not a channel"),
    ([GOOD, GOOD], "given twice"),
    ("all", "is not a list"),
    ([7], "is not an object"),
])
def test_a_bad_hello_is_an_event_not_a_constant(tmp_path: Path, channels: object,
                                                 why: str) -> None:
    clock = SimulatedClock()
    writer = TraceWriter(tmp_path, {"channels": [{"channel": 0, "name": "ch0"}]})
    rec = BridgeRecorder(OneShotLink(clock, _hello(channels)), clock, writer, baud=115200)
    stats = rec.run(duration_s=0.3)
    writer.close()
    assert rec.hello is None and all(ch.jpc is None for ch in rec.channels.values())
    assert stats.samples_written == 0
    errors = [row["detail"] for row in _events(tmp_path) if row["kind"] == "bus_error"]
    assert len(errors) == 1 and ("hello dropped" in errors[0] or "unparsable" in errors[0])
    assert why in errors[0]


def test_a_good_hello_sets_the_joules_per_count(tmp_path: Path) -> None:
    clock = SimulatedClock()
    writer = TraceWriter(tmp_path, {"channels": [{"channel": 0, "name": "ch0"}]})
    rec = BridgeRecorder(OneShotLink(clock, _hello([GOOD])), clock, writer, baud=115200)
    rec.run(duration_s=0.3)
    writer.close()
    assert rec.hello is not None and rec.boot == "b1"
    # 1e8 imp/kWh, a count being 0.1 pulse (datasheet): 0.1 × 3.6e6 J / 1e8 = 3.6 mJ
    assert rec.channels[0].jpc == pytest.approx(0.0036)
