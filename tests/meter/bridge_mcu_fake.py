"""A scripted MCU behind a fake link, for tests of the bridge recorder's host side.

It answers `hello` with a hello line and `ping` with a pong stamped with the simulated clock
(MCU µs = CLOCK_MONOTONIC µs), and delivers scripted lines at scripted times, so a test can
send any line (hostile ones included) once the recorder's clock mapping is fitted.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from epi.formats.trace import segment_paths
from meter.clock import SimulatedClock
from meter.firmware.crc import unseal
from meter.firmware.telemetry import message

METER_CONSTANT = 1e8  # imp/kWh: 0.036 J per count
HELLO_FIELDS = {"boot": "b1", "fw": "1.0.0", "proto": 2, "rate_hz": 10, "enc": "json",
                "streaming": True}


class ScriptedMCU:
    """A Link: `script` is [(t_us, raw line bytes)], delivered once the clock passes t_us."""

    def __init__(self, clock: SimulatedClock, script: list[tuple[int, bytes]],
                 channels: tuple[int, ...] = (0, 1), hello: bytes | None = None) -> None:
        self.clock = clock
        self.script = sorted(script, key=lambda item: item[0])
        self.out = bytearray()
        ch = [{"n": n, "meter_constant_imp_per_kwh": METER_CONSTANT, "cal": "flash"}
              for n in channels]
        self.hello = hello if hello is not None else bytes(
            message("hello", {**HELLO_FIELDS, "channels": ch}))

    def open(self) -> None:
        return None

    def read(self, timeout_s: float) -> bytes:
        now_us = self.clock.monotonic_ns() // 1000
        while self.script and self.script[0][0] <= now_us:
            self.out += self.script.pop(0)[1]
        if not self.out:
            self.clock.advance(round(timeout_s * 1e9))
            return b""
        data, self.out = bytes(self.out[:512]), self.out[512:]  # a UART delivers pieces
        return data

    def write(self, data: bytes) -> None:
        payload = unseal(data)
        cmd = json.loads(payload) if payload is not None else {}
        if cmd.get("cmd") == "hello":
            self.out += self.hello
        elif cmd.get("cmd") == "ping":  # answered 1 ms later, arriving 2 ms later
            now_us = self.clock.monotonic_ns() // 1000
            pong = bytes(message("pong", {"id": cmd["id"], "t": now_us + 1000}))
            self.script.append((now_us + 2000, pong))
            self.script.sort(key=lambda item: item[0])

    def close(self) -> None:
        return None

    def describe(self) -> dict[str, object]:
        return {"kind": "scripted"}


def rows(trace_dir: Path, part: int) -> list[dict[str, str]]:
    with segment_paths(trace_dir, 1)[part].open(newline="") as f:
        return list(csv.DictReader(f))
