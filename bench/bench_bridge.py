"""Bridge benchmarks: sustained sweep rate vs the bus limits, and clock-mapping error.

Both run the real firmware (meter/firmware on CPython with the machine stand-in) and the real
bridge code on a SimulatedClock with an emulated timing model: each SPI frame takes its 24
bits at 160 kHz, each UART byte its 10 bits at the baud rate, the MCU's UART transmit buffer
is 4096 bytes (a full buffer blocks the firmware's write, as on the RP2350). MCU CPU time is
not modelled (MicroPython's own speed on the RP2350 needs the board); the figures say how
well the firmware's schedule overlaps SPI reads with UART transmission, and how well the
ping filter recovers the MCU clock.

1. Sweep rate: the firmware asked for 1000 sweeps/s (more than either bus allows) for 30 s,
   per baud (115200, 921600) and encoding (json, compact). SPI-limited rate = 1 / (frames
   per sweep × 24 / 160 kHz), frames counted on the bus; UART-limited = baud / 10 / mean
   sweep-line bytes. Measured = sweep lines decoded on the Pi per second.
2. Clock mapping: an MCU crystal 50 ppm fast, host-side latency jittered (exponential, mean
   2 ms, both directions), 10 minutes at 10 sweeps/s through the recorder; error = mapped
   t_mono_ns of every sweep minus the true host time of the MCU stamp; the headline maximum
   covers the whole run, its first minute included (the recorder pings 10× as often for the
   first 30 s of a boot so the drift is fitted within seconds).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import emit, machine_line

from meter.bridge.emulate import EmulatedBoard, SimLink
from meter.bridge.protocol import Sweep, command, decode_line
from meter.bridge.recorder import BridgeRecorder
from meter.clock import SimulatedClock
from meter.daemon.trace import TraceLock, TraceWriter
from meter.emulation.power_models import ConstantPower

SPI_HZ = 160_000


def sweep_rate(baud: int, encoding: str, seconds: float = 30.0) -> dict:
    clock = SimulatedClock(5 * 10**9)
    models = [ConstantPower(3.0 + i, power_factor=0.6) for i in range(4)]
    board = EmulatedBoard(clock, models, baud=baud, rate_hz=1000.0, encoding=encoding)
    link = SimLink(board, baud)
    link.open()
    buf = b""
    sweeps = 0
    line_bytes = 0
    t_first = None
    frames0 = board.hw.spi.frames
    seq0 = board.firmware.seq
    t_end = clock.monotonic_ns() + round(seconds * 1e9)
    while clock.monotonic_ns() < t_end:
        buf += link.read(0.05)
        *lines, buf = buf.split(b"\n")
        for ln in lines:
            msg = decode_line(ln + b"\n")
            if isinstance(msg, Sweep):
                if t_first is None:
                    t_first = clock.monotonic_ns()
                    frames0, seq0 = board.hw.spi.frames, board.firmware.seq
                    continue
                sweeps += 1
                line_bytes += len(ln) + 1
    span_s = (clock.monotonic_ns() - t_first) / 1e9
    frames_per_sweep = (board.hw.spi.frames - frames0) / (board.firmware.seq - seq0)
    spi_limit = SPI_HZ / (24 * frames_per_sweep)
    uart_limit = baud / 10 / (line_bytes / sweeps)
    measured = sweeps / span_s
    return {"baud": baud, "encoding": encoding, "measured_hz": measured,
            "spi_limit_hz": spi_limit, "uart_limit_hz": uart_limit,
            "fraction": measured / min(spi_limit, uart_limit),
            "bytes_per_line": line_bytes / sweeps, "frames_per_sweep": frames_per_sweep}


class _TracingRecorder(BridgeRecorder):
    """Records (MCU µs, mapped ns) of channel 0 of every sweep as written."""

    pairs: list[tuple[int, int]]

    def _sweep(self, sw: Sweep, t_recv: int) -> None:
        before = self.stats.sweeps
        super()._sweep(sw, t_recv)
        if self.stats.sweeps > before and self.mapping is not None and sw.channels:
            t_us = sw.t_us + sw.channels[0].offset_us
            self.pairs.append((t_us, self.mapping.to_mono_ns(t_us)))


def clock_mapping(minutes: float = 10.0, seed: int = 1) -> dict:
    clock = SimulatedClock(5 * 10**9)
    board = EmulatedBoard(clock, [ConstantPower(4.0)], baud=115200, rate_hz=10.0,
                          encoding="json", drift_ppm=50.0)
    link = SimLink(board, 115200, jitter_mean_ns=2_000_000, seed=seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-bridge-"))
    writer = TraceWriter(tmp, {"bench": "bridge"}, lock=TraceLock(tmp))
    rec = _TracingRecorder(link, clock, writer, baud=115200)
    rec.pairs = []
    rec.run(minutes * 60)
    writer.close()
    mc = board.hw.mcu_clock
    boot_ns = mc.origin_ns
    errors = []
    early = []
    for t_us, mapped in rec.pairs:
        truth = boot_ns + t_us * 1000.0 / mc.rate
        if truth - boot_ns > 60e9:  # after the first minute of pings
            errors.append(abs(mapped - truth))
        else:
            early.append(abs(mapped - truth))
    whole = errors + early  # the headline: the whole run, its first minute included
    return {"max_ms": max(whole) / 1e6, "p99_ms": sorted(whole)[int(0.99 * len(whole))] / 1e6,
            "first_minute_max_ms": max(early) / 1e6,
            "after_first_minute_max_ms": max(errors) / 1e6,
            "mean_ms": statistics.fmean(errors) / 1e6, "n": len(errors),
            "clock": rec.mapping.describe() if rec.mapping else None,
            "pings": rec.stats.pings}


def main() -> None:
    assert command("ping")  # the bench uses the real protocol module
    print(machine_line("bench_bridge.py"), flush=True)
    print("1. sustained sweep rate (emulated wire timing; MCU CPU time not modelled)")
    rows = []
    for baud in (115200, 921600):
        for enc in ("json", "compact"):
            r = sweep_rate(baud, enc)
            rows.append(r)
            print(f"   {baud:>7} baud {enc:>7}: {r['measured_hz']:7.1f} sweeps/s; SPI limit "
                  f"{r['spi_limit_hz']:6.1f} ({r['frames_per_sweep']:.0f} frames), UART limit "
                  f"{r['uart_limit_hz']:7.1f} ({r['bytes_per_line']:.0f} B/line) -> "
                  f"{r['fraction']:.3f} of the lesser")
    fr = [r["fraction"] for r in rows]
    worst = min(fr)
    emit("bridge-sweep-rate-fraction", round(worst, 4), len(rows),
         [round(min(fr), 4), round(max(fr), 4)], "worst of the 4 baud/encoding cases")
    j115 = next(r for r in rows if r["baud"] == 115200 and r["encoding"] == "json")
    print(f"   JSON at 115200 baud reaches {j115['measured_hz']:.1f} of the "
          f"{j115['spi_limit_hz']:.1f} sweeps/s the SPI bus allows: "
          + ("compact is needed there" if j115["uart_limit_hz"] < j115["spi_limit_hz"]
             else "JSON suffices"))
    print("2. MCU -> Pi clock mapping (50 ppm drift, 2 ms mean jitter each way, 10 min)")
    runs = [clock_mapping(seed=s) for s in (1, 2, 3)]
    for c in runs:
        print(f"   max {c['max_ms']:.3f} ms, p99 {c['p99_ms']:.3f} ms, mean {c['mean_ms']:.3f} ms"
              f" over {c['n']} sweeps; fitted drift {c['clock']['drift_ppm']:.2f} ppm, stated "
              f"uncertainty {c['clock']['uncertainty_ns'] / 1e6:.3f} ms, {c['pings']} pings; "
              f"first minute (drift not yet fitted) max {c['first_minute_max_ms']:.3f} ms")
    worst_ms = max(c["max_ms"] for c in runs)
    emit("bridge-clock-map-error-ms", round(worst_ms, 4), len(runs),
         [round(min(c["max_ms"] for c in runs), 4), round(worst_ms, 4)],
         "max error, worst of the seeded runs")


if __name__ == "__main__":
    main()
