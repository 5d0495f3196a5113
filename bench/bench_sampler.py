"""Benchmark the meter sampler: bus-limited rate, CPU per sample, memory, and an hour's soak.

Prints, measured side by side in one run:

1. Real time, 4 emulated chips on a bus with the real 160 kHz frame timing (24 bits =
   150 µs per register access), sampling at the bus-limited rate (every sweep back to back):
   the achieved sweep rate as a fraction of the bus-limited rate (goal ≥ 0.9). Two models of
   the wire are run one after the other:
     * ``wire-time`` — each frame ends 150 µs after it was started, the emulated chip working
       inside that time as a real chip does (a precise wait: sleep, then spin the last 0.3 ms);
       what remains is the host's own overhead (driver, sampler, trace writer) between frames;
     * ``per-frame-sleep`` — ``meter.emulation.emulated_bus.EmulatedSpiBus(frame_time_s=...)`` as
       the daemon uses it: ``clock.sleep_until`` after each frame, so the OS's wake-up latency
       (tens of µs per frame) is added to every frame.
2. Host CPU time per sample (process CPU ÷ samples) of the whole stack with a simulated clock
   (no waiting at all: sampler + driver + emulator + trace writer), and of the sampler with
   the trace writer alone (a source that returns a fixed reading), and its share of the stack.
3. Memory (RSS) over the long run of the soak.
4. Soak: a simulated hour (accelerated) at the maximum rate — frames advance the simulated
   clock by their wire time, so the schedule is as tight as the bus allows: scheduled sweeps
   vs sweeps done, rows written vs rows read back (zero lost), late/skipped sweeps, RSS at 10 %
   of the run and at the end (flat).

``--seconds`` sets the real-time part (default 20 s per wire model), ``--soak-seconds`` the
simulated soak (default 3600).
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from epi.formats.trace import read_trace
from meter.board import emulated_board, open_channels
from meter.clock import SimulatedClock, SystemClock
from meter.daemon.live_stream import LiveHub
from meter.daemon.metrics import ChannelInfo, MeterState
from meter.daemon.sampler import Sampler
from meter.daemon.service import bus_budget
from meter.daemon.trace import TraceWriter
from meter.emulation.emulated_bus import FRAME_TIME_160K_S, EmulatedSpiBus
from meter.emulation.power_models import ConstantPower

N_CHANNELS = 4
FRAME_NS = round(FRAME_TIME_160K_S * 1e9)


def rss_kib() -> int:
    """Resident set size now (KiB)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class WireTimeBus(EmulatedSpiBus):
    """A frame takes exactly its wire time from the moment it starts; the chip answers
    within it (as hardware does). The wait is precise: sleep, then spin the last 0.3 ms."""

    kind = "emulated-spi-wire-time"

    def __init__(self, chip: object, frame_ns: int) -> None:
        super().__init__(chip, frame_time_s=None)
        self.wire_ns = frame_ns

    def transfer(self, frame: bytes) -> bytes:
        end = time.monotonic_ns() + self.wire_ns
        out = super().transfer(frame)
        while True:
            left = end - time.monotonic_ns()
            if left <= 0:
                return out
            if left > 300_000:
                time.sleep((left - 250_000) / 1e9)


def open_board(clock: object, *, timing: bool) -> list:
    models = [ConstantPower(3.0 + i, power_factor=0.6) for i in range(N_CHANNELS)]
    board = emulated_board(N_CHANNELS, models, clock)
    return open_channels(board, emulate=True, clock=clock, model_bus_timing=timing), board


def run_sampler(channels: list, clock: object, out: Path, period_s: float,
                duration_s: float) -> tuple[Sampler, float, float, list[tuple[int, int]]]:
    state = MeterState([ChannelInfo(c.index, c.name, c.node) for c in channels], {})
    writer = TraceWriter(out, {"channels": [{"channel": c.index, "name": c.name}
                                            for c in channels]})
    rss: list[tuple[int, int]] = []

    def before(_now: int) -> None:
        if sampler.stats.sweeps % 5000 == 0:
            rss.append((sampler.stats.sweeps, rss_kib()))

    sampler = Sampler(channels, clock, writer, period_s=period_s, state=state, hub=LiveHub(),
                      before_sweep=before)
    gc.collect()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sampler.run(duration_s)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    writer.close()
    rss.append((sampler.stats.sweeps, rss_kib()))
    return sampler, cpu, wall, rss


def realtime_part(seconds: float, tmp: Path) -> None:
    print(f"== 1. real time, {N_CHANNELS} chips, 160 kHz frame timing, {seconds:g} s per model "
          "(wire-time spins: it needs a free CPU to keep time)")
    clock = SystemClock()
    for model in ("wire-time", "per-frame-sleep"):
        channels, board = open_board(clock, timing=model == "per-frame-sleep")
        if model == "wire-time":
            for ch in channels:
                ch.driver.bus = WireTimeBus(ch.emulator, FRAME_NS)
        budget = bus_budget(board, channels)
        limit_hz = budget.max_rate_hz
        sampler, cpu, wall, _ = run_sampler(channels, clock, tmp / model, 1.0 / limit_hz,
                                            seconds)
        st = sampler.stats
        achieved = st.sweeps / wall
        frames = sum(budget.frames_per_read.values())
        print(f"   {model:16s} bus-limited {limit_hz:6.2f} sweeps/s ({frames} frames x "
              f"{FRAME_NS / 1e3:.0f} us), achieved {achieved:6.2f} sweeps/s -> ratio "
              f"{achieved / limit_hz:.3f}; mean sweep {st.sweep_duration.mean_ns / 1e6:.2f} ms "
              f"vs wire {budget.sweep_time_s * 1e3:.2f} ms; process got {cpu / wall:.2f} CPU")
        for ch in channels:
            ch.close()


def cpu_part(tmp: Path, sweeps: int = 3000) -> tuple[float, float]:
    print(f"== 2. host CPU per sample ({sweeps} sweeps x {N_CHANNELS} chips, simulated clock)")
    clock = SimulatedClock()
    channels, _ = open_board(clock, timing=False)
    period = 0.05
    sampler, cpu_full, _, _ = run_sampler(channels, clock, tmp / "cpu-full", period,
                                          sweeps * period)
    per_full = cpu_full / sampler.stats.samples_written

    class Fixed:
        """A source with no bus or chip: what is left is the sampler and trace writer."""

        def __init__(self, sample: object) -> None:
            self.sample = sample

        def read_sample(self) -> object:
            return self.sample

    sample = channels[0].driver.read_sample()
    for ch in channels:
        ch.driver = Fixed(sample)
    sampler2, cpu_own, _, _ = run_sampler(channels, clock, tmp / "cpu-own", period,
                                          sweeps * period)
    per_own = cpu_own / sampler2.stats.samples_written
    print(f"   whole stack (sampler + driver + emulator + writer): {per_full * 1e6:8.1f} us/sample")
    print(f"   sampler + trace writer alone:                       {per_own * 1e6:8.1f} us/sample"
          f"  -> {per_own / per_full:.3f} of the stack")
    return per_full, per_own


def soak_part(seconds: float, tmp: Path) -> None:
    print(f"== 3/4. soak: {seconds:g} simulated s at the bus-limited rate, frames advance the "
          "simulated clock by their wire time")
    clock = SimulatedClock()
    channels, board = open_board(clock, timing=True)
    budget = bus_budget(board, channels)
    period = budget.sweep_time_s  # the maximum rate: sweeps back to back on the wire
    out = tmp / "soak"
    sampler, cpu, wall, rss = run_sampler(channels, clock, out, period, seconds)
    st = sampler.stats
    scheduled = -(-round(seconds * 1e9) // round(period * 1e9))  # slots in [0, seconds)
    trace = read_trace(out)
    read_back = sum(len(s.samples) for s in trace.segments)
    expected_rows = scheduled * N_CHANNELS
    size_mb = sum(p.stat().st_size for p in out.iterdir()) / 1e6
    print(f"   {1 / period:.2f} sweeps/s for {seconds:g} s simulated in {wall:.0f} s wall "
          f"({seconds / wall:.1f}x real time), {cpu / max(st.samples_written, 1) * 1e6:.1f} us "
          f"CPU/sample")
    print(f"   scheduled sweeps {scheduled}, done {st.sweeps}, late {st.late_sweeps}, skipped "
          f"{st.skipped_sweeps}, failed reads {st.failed_reads}")
    lost = expected_rows - st.samples_written - st.not_ready_reads
    print(f"   reads scheduled {expected_rows}: written {st.samples_written}, withheld as not "
          f"ready after start-up {st.not_ready_reads} (the emulated chip's first "
          f"{board.refresh_period_s:g} s), failed {st.failed_reads} -> lost {lost}")
    print(f"   rows read back {read_back} of {st.samples_written} written "
          f"({size_mb:.0f} MB of trace)")
    first = next((kib for n, kib in rss if n >= st.sweeps // 10), rss[0][1])
    peak = max(kib for _, kib in rss)
    print(f"   RSS at 10 % of the run {first / 1024:.1f} MiB, at the end {rss[-1][1] / 1024:.1f}"
          f" MiB, peak {peak / 1024:.1f} MiB -> end / 10 % = {rss[-1][1] / first:.3f}")
    for ch in channels:
        ch.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--soak-seconds", type=float, default=3600.0)
    parser.add_argument("--skip-realtime", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sampler-"))
    try:
        print(f"host: {os.uname().machine}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        if not args.skip_realtime:
            realtime_part(args.seconds, tmp)
        cpu_part(tmp)
        soak_part(args.soak_seconds, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
