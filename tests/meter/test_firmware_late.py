"""`late` is reported from the MCU's boot on: a freeze within 10 s of boot used to
leave a hole in the telemetry with no event, because the first report waited until 10 s after
an imaginary report at t = 0. Skips held back by the 10 s limit are reported later, never
dropped."""

from __future__ import annotations

from meter.bridge.emulate import EmulatedBoard
from meter.bridge.protocol import Message, decode_line
from meter.clock import SimulatedClock
from meter.emulation.power_models import ConstantPower


def _late_events(lines: list[bytes]) -> list[str]:
    out = []
    for raw in b"".join(lines).splitlines(keepends=True):
        msg = decode_line(raw)
        if isinstance(msg, Message) and msg.kind == "ev" and msg.fields.get("kind") == "late":
            out.append(str(msg.fields.get("d")))
    return out


def _run(board: EmulatedBoard, clock: SimulatedClock, seconds: float,
         freeze_s: list[tuple[float, float]]) -> None:
    """Poll the firmware every 10 ms; at each (at_s, length_s) it does not run for length_s."""
    t = 0.0
    pending = sorted(freeze_s)
    while t < seconds:
        if pending and t >= pending[0][0]:
            clock.advance(round(pending.pop(0)[1] * 1e9))
        board.firmware.poll()
        clock.advance(10_000_000)
        t += 0.01


def test_a_freeze_right_after_boot_is_reported() -> None:
    clock = SimulatedClock()
    board = EmulatedBoard(clock, [ConstantPower(50.0)], model_spi_time=False)
    lines: list[bytes] = []
    board.sink = lines.append
    _run(board, clock, 4.0, [(2.0, 1.5)])  # 1.5 s without a poll, 2 s after boot
    late = _late_events(lines)
    assert len(late) == 1 and late[0].startswith("14 sweep slot(s) skipped"), late


def test_skips_held_back_by_the_limit_are_reported_later() -> None:
    clock = SimulatedClock()
    board = EmulatedBoard(clock, [ConstantPower(50.0)], model_spi_time=False)
    lines: list[bytes] = []
    board.sink = lines.append
    _run(board, clock, 14.0, [(1.0, 0.5), (3.0, 0.5)])  # the second within 10 s of the first
    late = _late_events(lines)
    # 10 Hz: 0.5 s without a poll skips 3 to 5 slots (the freeze's phase against the slots)
    assert len(late) == 2 and all(3 <= int(x.split()[0]) <= 5 for x in late), late
