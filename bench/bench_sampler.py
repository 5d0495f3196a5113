"""Benchmark the meter sampler: the daemon's real bus path, CPU per sample, memory, a soak.

Prints, measured side by side in one run:

1. Real time (system clock), 4 emulated chips at 160 kHz frame timing, sweeps back to back:
   the achieved sweep rate as a fraction of the wire-time limit. The headline is the bus as
   the daemon drives it: ``meter.emulation.emulated_bus.EmulatedSpiBus(frame_time_s=...)``
   (what ``epi meter run --emulate`` opens: frames queue on the emulated wire; the host waits
   once the wire is 2 ms behind, until 1 ms is left queued). For comparison,
   ``wire-time-spin`` ends every frame exactly 150 µs after it began by spinning — a model the
   daemon does not use, shown only to separate the host's own overhead from the waiting.
   Who is charged what: the emulated chips compute on the daemon's thread, but their time
   overlaps the wire's (as a real chip works during its frames), so it lowers the rate only
   where daemon + emulator CPU exceed the wire time; part 2 shows both against it. The bus's
   waits are the emulator's: they used to end when the wire was already free, and
   every wake-up's latency left the wire idle, charged to the sweep rate (0.83 at load 4-5).
   The default 40 s runs past the chain self-check's 30 s window, so its steady cost counts.
2. Host CPU time (simulated clock: no waiting): per sample, the whole stack and the sampler
   with the trace writer alone; per sweep, the daemon's part (sampler, driver, chip protocol,
   writer: the whole stack less the emulated chips) and the emulator's, against the wire
   time of a sweep.
3. Soak on the system clock at the daemon's default rate (20 Hz for 4 chips): scheduled reads
   vs rows written and read back; every scheduled read not written must be reported (late /
   skipped sweep, failed read, not ready after start-up); RSS at 10 % and at the end.

``--seconds`` sets part 1 (default 40 s per model), ``--soak-seconds`` part 3 (default 120 s,
real time: a short soak that can fail beats a long simulated one that cannot).
BENCH lines: ``sampler-daemon-bus-fraction``, ``sampler-soak-lost-fraction`` (bench/goals.py).
"""

from __future__ import annotations

import argparse
import gc
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import emit, machine_line

from epi.formats.trace import read_trace
from meter.board.channels import emulated_board, open_channels
from meter.clock import SimulatedClock, SystemClock
from meter.daemon.live_stream import LiveHub
from meter.daemon.metrics import ChannelInfo, MeterState
from meter.daemon.sampler import Sampler
from meter.daemon.service import bus_budget, default_rate_hz
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
    return open_channels(board, "emulated", clock=clock, model_bus_timing=timing), board


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


def realtime_part(seconds: float, tmp: Path) -> float:
    print(f"== 1. real time, {N_CHANNELS} chips, 160 kHz frame timing, {seconds:g} s per model")
    clock = SystemClock()
    ratios = {}
    for model in ("daemon-bus", "wire-time-spin"):
        channels, board = open_board(clock, timing=model == "daemon-bus")
        if model == "wire-time-spin":
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
              f"vs wire {budget.sweep_time_s * 1e3:.2f} ms; process got {cpu / wall:.2f} CPU; "
              f"{st.skipped_sweeps} skipped")
        ratios[model] = achieved / limit_hz
        for ch in channels:
            ch.close()
    print(f"   headline (daemon's bus path): {ratios['daemon-bus']:.3f} of the wire limit")
    return ratios["daemon-bus"]


def time_emulators(channels: list) -> list[int]:
    """Wrap every emulated chip's frame handler to add its thread CPU time (ns) to the one
    counter returned: what the emulator costs, apart from the daemon's own work."""
    spent = [0]
    tick = time.thread_time_ns
    for ch in channels:
        handle = ch.emulator.spi_transfer

        def timed(frame: bytes, handle: Callable[[bytes], bytes] = handle) -> bytes:
            t = tick()
            try:
                return handle(frame)
            finally:
                spent[0] += tick() - t

        ch.emulator.spi_transfer = timed
    return spent


def cpu_part(tmp: Path, sweeps: int = 3000) -> tuple[float, float]:
    print(f"== 2. host CPU per sample ({sweeps} sweeps x {N_CHANNELS} chips, simulated clock)")
    clock = SimulatedClock()
    channels, board = open_board(clock, timing=False)
    wire_s = bus_budget(board, channels).sweep_time_s
    emulator_ns = time_emulators(channels)
    period = 0.05
    sampler, cpu_full, _, _ = run_sampler(channels, clock, tmp / "cpu-full", period,
                                          sweeps * period)
    per_full = cpu_full / sampler.stats.samples_written
    n_sweeps = sampler.stats.sweeps
    emu_sweep = emulator_ns[0] / 1e9 / n_sweeps
    own_sweep = cpu_full / n_sweeps - emu_sweep
    print(f"   per sweep: daemon {own_sweep * 1e3:.2f} ms CPU (sampler, driver, chip protocol, "
          f"self-check, writer) = {own_sweep / wire_s:.3f} of the {wire_s * 1e3:.1f} ms wire "
          f"time; emulated chips {emu_sweep * 1e3:.2f} ms = {emu_sweep / wire_s:.3f}")

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


def soak_part(seconds: float, tmp: Path) -> float:
    print(f"== 3. soak: {seconds:g} s on the system clock at the daemon's default rate")
    clock = SystemClock()
    channels, board = open_board(clock, timing=True)
    budget = bus_budget(board, channels)
    rate = default_rate_hz(budget.wire_rate_hz)
    period = 1.0 / rate
    out = tmp / "soak"
    sampler, cpu, wall, rss = run_sampler(channels, clock, out, period, seconds)
    st = sampler.stats
    scheduled_sweeps = st.sweeps + st.skipped_sweeps
    scheduled = scheduled_sweeps * N_CHANNELS
    trace = read_trace(out)
    read_back = sum(len(s.samples) for s in trace.segments)
    accounted = st.samples_written + st.not_ready_reads + st.failed_reads + st.deferred_reads
    accounted += st.skipped_sweeps * N_CHANNELS
    lost = scheduled - accounted
    print(f"   {rate:g} sweeps/s for {seconds:g} s ({wall:.1f} s wall), "
          f"{cpu / max(st.samples_written, 1) * 1e6:.1f} us CPU/sample")
    print(f"   scheduled sweeps {scheduled_sweeps}: done {st.sweeps}, late {st.late_sweeps}, "
          f"skipped {st.skipped_sweeps} (reported as skipped events)")
    print(f"   reads scheduled {scheduled}: written {st.samples_written}, not ready after "
          f"start-up {st.not_ready_reads}, failed {st.failed_reads}, in skipped sweeps "
          f"{st.skipped_sweeps * N_CHANNELS} -> unreported {lost}")
    print(f"   rows read back {read_back} of {st.samples_written} written")
    first = next((kib for n, kib in rss if n >= st.sweeps // 10), rss[0][1])
    print(f"   RSS at 10 % of the run {first / 1024:.1f} MiB, at the end {rss[-1][1] / 1024:.1f}"
          f" MiB -> end / 10 % = {rss[-1][1] / first:.3f}")
    for ch in channels:
        ch.close()
    lost += st.samples_written - read_back
    return lost / max(scheduled, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--soak-seconds", type=float, default=120.0)
    parser.add_argument("--skip-realtime", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sampler-"))
    try:
        print(machine_line("bench_sampler.py"), flush=True)
        ratio = None if args.skip_realtime else realtime_part(args.seconds, tmp)
        cpu_part(tmp)
        lost = soak_part(args.soak_seconds, tmp)
        if ratio is not None:
            emit("sampler-daemon-bus-fraction", ratio, 1, None,
                 f"one {args.seconds:g} s run on the system clock")
        emit("sampler-soak-lost-fraction", lost, 1, None,
             f"one {args.soak_seconds:g} s soak on the system clock")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
