"""The MCU's `ticks_us` wraps (every 2**30 µs ≈ 17.9 min on the rp2 port): the firmware's 64-bit
clock and the whole bridge must not notice. Here the emulated MCU's ticks wrap every 2**21 µs
(2.1 s), so one simulated minute holds 28 wraps (8 hours of a real rp2), and runs in seconds;
the mapped sample times are compared with the true times the MCU read its energy registers
(the emulated clock's own)."""

from __future__ import annotations

import itertools
from pathlib import Path

from epi.formats.trace import read_trace
from meter.bridge.emulate import EmulatedBoard
from meter.bridge.emulated_port import serve_board
from meter.bridge.link import SerialLink
from meter.bridge.protocol import Sweep
from meter.bridge.recorder import BridgeRecorder
from meter.clock import SimulatedClock
from meter.daemon.trace import TraceLock, TraceWriter
from meter.emulation.power_models import ConstantPower


class _Recorder(BridgeRecorder):
    def _sweep(self, sw: Sweep, t_recv: int) -> None:
        before = self.stats.sweeps
        super()._sweep(sw, t_recv)
        if self.stats.sweeps > before:
            self.seen.append(sw.t_us + sw.channels[0].offset_us)


def test_hours_of_tick_wraps_leave_time_and_energy_intact(tmp_path: Path) -> None:
    clock = SimulatedClock(7 * 10**9)
    board = EmulatedBoard(clock, [ConstantPower(5.0)], rate_hz=10.0, drift_ppm=-40.0,
                          tick_bits=21)
    port = serve_board(board, 115200)  # the firmware behind an emumcu:// port
    writer = TraceWriter(tmp_path, {"test": True}, lock=TraceLock(tmp_path))
    rec = _Recorder(SerialLink(port.url, 115200), clock, writer, baud=115200,
                    idle_until=port.idle_until)
    rec.seen = []
    rec.run(60.0)
    writer.close()
    mc = board.hw.mcu_clock
    wraps = (mc.start_us + 60e6) // (1 << 21) - mc.start_us // (1 << 21)
    assert wraps >= 25
    # the firmware's clock counted straight through every wrap: 10 sweeps a second, no jumps
    steps = [b - a for a, b in zip(rec.seen, rec.seen[1:], strict=False)]
    assert min(steps) > 90_000 and max(steps) < 110_000, (min(steps), max(steps))
    assert rec.seen[-1] > 55e6
    rows = [r for r in read_trace(tmp_path).samples()]
    t = [r["t_mono_ns"] for r in rows]
    assert all(b > a for a, b in itertools.pairwise(t))
    assert not [e for e in read_trace(tmp_path).events() if e["kind"] == "gap"
                and "lost" in e["detail"]]
    # after the drift is fitted the mapping is within 1 ms of the truth
    boot_ns = mc.origin_ns
    mp = rec.mapping
    assert mp is not None and abs(mp.drift_ppm + 40.0) < 1.0
    worst = max(abs(mp.to_mono_ns(u) - (boot_ns + u * 1000.0 / mc.rate)) for u in rec.seen[-300:])
    assert worst < 1_000_000
    # energy over the run equals P·Δt between the first and last rows (to two counts)
    e = rows[-1]["energy_j"] - rows[0]["energy_j"]
    assert abs(e - 5.0 * (t[-1] - t[0]) / 1e9) < 2 * 0.0036 + 5.0 * 0.001
