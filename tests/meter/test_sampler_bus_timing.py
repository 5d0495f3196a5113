"""The daemon's emulated bus path on the system clock keeps the wire time: frames
queue on the emulated wire and the host may run at most `BATCH_NS` ahead of it, so N frames
never take less than N × 150 µs − BATCH_NS of real time, however the wait is scheduled (a
lower bound: it holds on a loaded machine). The expected time is 24 bits at 160 kHz."""

from __future__ import annotations

import time

from meter.chip import registers as regs
from meter.clock import SystemClock
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import BATCH_NS, EmulatedSpiBus
from meter.emulation.power_models import ConstantPower


def test_frames_on_the_system_clock_never_beat_the_wire() -> None:
    clock = SystemClock()
    bus = EmulatedSpiBus(EmulatedChip(ConstantPower(5.0), clock), frame_time_s=24 / 160e3)
    frames = 400  # 60 ms of wire
    t0 = time.monotonic_ns()
    for _ in range(frames):
        bus.read_register(regs.LAST_DATA)
    elapsed_ns = time.monotonic_ns() - t0
    assert elapsed_ns >= frames * 150_000 - BATCH_NS
    assert bus.frames == frames
