"""A clock pong from the MCU is untrusted input: one pong whose time is impossible (negative,
2**63, an hour away from its neighbours) is dropped with a `bus_error` event; it never moves the
clock mapping, so it never makes later sweeps "in the future" (all dropped) nor gives a row a
`t_mono_ns` the trace reader refuses. The expected times come from the scripted MCU, whose clock
is the simulated CLOCK_MONOTONIC itself (MCU µs = monotonic µs), not from the recorder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epi.formats.fields import INT64_MAX
from meter.bridge.recorder import BridgeRecorder
from meter.clock import SimulatedClock
from meter.daemon.trace import TraceWriter
from meter.firmware.crc import unseal
from meter.firmware.telemetry import message
from tests.meter.bridge_mcu_fake import ScriptedMCU, rows
from tests.meter.test_bridge_untrusted import N_SWEEPS, PERIOD_US, START_US, honest


class BadPongMCU(ScriptedMCU):
    """Answers the pings numbered in `bad` with time `t_us` instead of its clock."""

    def __init__(self, clock: SimulatedClock, script: list[tuple[int, bytes]],
                 bad: dict[int, object]) -> None:
        super().__init__(clock, script)
        self.bad = bad

    def write(self, data: bytes) -> None:
        payload = unseal(data)
        cmd = json.loads(payload) if payload is not None else {}
        if cmd.get("cmd") == "ping" and cmd["id"] in self.bad:
            now_us = self.clock.monotonic_ns() // 1000
            pong = bytes(message("pong", {"id": cmd["id"], "t": self.bad[cmd["id"]]}))
            self.script.append((now_us + 2000, pong))
            self.script.sort(key=lambda item: item[0])
            return
        super().write(data)


def _record(tmp_path: Path, bad: dict[int, object]) -> tuple[list[dict[str, str]],
                                                             list[dict[str, str]]]:
    clock = SimulatedClock()
    writer = TraceWriter(tmp_path, {"channels": [{"channel": 0, "name": "ch0"},
                                                 {"channel": 1, "name": "ch1"}]})
    rec = BridgeRecorder(BadPongMCU(clock, honest(), bad), clock, writer, baud=115200,
                         wire_time=False)
    rec.run(duration_s=(START_US + (N_SWEEPS + 5) * PERIOD_US) / 1e6)
    writer.close()
    return rows(tmp_path, 1), rows(tmp_path, 2)


# ping 3 is within the initial burst (the mapping is being fitted), ping 12 after it
@pytest.mark.parametrize("ping", [3, 12])
@pytest.mark.parametrize("t_us", [-5_000_000, -1, 2**63, 2**64 - 1, 3_600 * 10**6 + START_US])
def test_one_impossible_pong_is_dropped_not_trusted(tmp_path: Path, ping: int,
                                                   t_us: int) -> None:
    samples, events = _record(tmp_path, {ping: t_us})
    dropped = [e for e in events if e["kind"] == "bus_error" and "pong" in e["detail"]]
    assert len(dropped) == 1, [(e["kind"], e["detail"]) for e in events]
    assert not any("sweep" in e["detail"] for e in events)  # no sweep dropped for it
    assert len(samples) == 2 * N_SWEEPS  # every sweep recorded
    for r in samples:
        t = int(r["t_mono_ns"])
        assert 0 <= t <= INT64_MAX
        # the scripted MCU reads its clock as CLOCK_MONOTONIC µs: the row is at that time,
        # within the pings' round trip (the fake link answers on its next 50 ms read)
        q = int(r["seq"])
        assert abs(t - (START_US + q * PERIOD_US) * 1000) <= 60_000_000


def test_a_clock_that_really_moved_is_followed_after_three_pongs(tmp_path: Path) -> None:
    """Not a single bad pong but the MCU's clock itself jumping (no reset announced): after
    three pongs in a row that agree with each other, the mapping starts again from them."""
    jump_us = 50_000_000
    clock = SimulatedClock()

    class JumpMCU(ScriptedMCU):
        def write(self, data: bytes) -> None:
            payload = unseal(data)
            cmd = json.loads(payload) if payload is not None else {}
            if cmd.get("cmd") == "ping" and cmd["id"] >= 20:
                now_us = self.clock.monotonic_ns() // 1000
                pong = bytes(message("pong", {"id": cmd["id"], "t": now_us + 1000 + jump_us}))
                self.script.append((now_us + 2000, pong))
                self.script.sort(key=lambda item: item[0])
                return
            super().write(data)

    writer = TraceWriter(tmp_path, {"channels": [{"channel": 0, "name": "ch0"}]})
    rec = BridgeRecorder(JumpMCU(clock, []), clock, writer, baud=115200, wire_time=False,
                         ping_interval_s=0.1)
    rec.run(duration_s=6.0)
    writer.close()
    dropped = [e for e in rows(tmp_path, 2) if "pong" in e["detail"]]
    assert len(dropped) == 3
    assert "refitted from them" in dropped[-1]["detail"]
    assert rec.mapping is not None
    # the new mapping follows the jumped clock
    t_us = clock.monotonic_ns() // 1000 + jump_us
    assert abs(rec.mapping.to_mono_ns(t_us) - clock.monotonic_ns()) < 60_000_000


@pytest.mark.parametrize("t_line_ns", [-1, -(10**12), INT64_MAX + 1, 2**64])
def test_a_sweep_time_outside_64_bit_monotonic_is_never_a_row(t_line_ns: int) -> None:
    """Whatever the mapping says, a time the trace reader refuses is never written (here with
    the receipt at the same time, so only the range can refuse it)."""
    from meter.bridge.trust import time_problem

    problem = time_problem(t_line_ns, t_line_ns, 0.0, None)
    assert problem is not None and "outside CLOCK_MONOTONIC" in problem
    assert time_problem(INT64_MAX, INT64_MAX, 0.0, None) is None
