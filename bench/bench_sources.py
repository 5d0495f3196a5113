"""Benchmark the software power sources (meter/sources): reading cost per sample of each source,
the achieved rate against the counter's own update rate, and whether a slow source delays the
wall meter's sweeps.

No RAPL, hwmon, NVML or vcgencmd exists on the machine this was written on, so every figure
here is measured on **synthetic sysfs trees, a fake NVML library and a fake vcgencmd** at the
same interfaces the real ones use (the sysfs files are real files on tmpfs/disk; NVML calls go
through the real ctypes binding into a Python fake). On real hardware the costs differ: a real
``energy_uj`` read is a kernel MSR read (µs), a real NVML energy call ~3.8 ms on an H100, a real
``vcgencmd`` a process start. The PMIC figure below times a real process start (``cat`` of the
captured output) as a stand-in for ``vcgencmd``.

Printed side by side in one run:

1. reading cost per sample (median and p90 of N reads) for RAPL, hwmon, the NVML binding, and
   the PMIC path (process start + parse);
2. achieved row rate of a 10 Hz counter (fake NVML whose energy steps every 100 ms) polled on
   its own thread, over the update rate; and a sensor updating every 1 s first polled at 10 Hz:
   the poll rate it settles to, over the update rate;
3. the emulated wall meter (4 channels, 20 Hz) alone and with a slow source (40 ms per read,
   sleeping like a ctypes call that releases the GIL) beside it: p99 sweep lateness of each.

``--seconds`` sets the length of each timed run (default 4 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import emit, machine_line

from meter.clock import SystemClock
from meter.daemon.service import DaemonOptions, MeterDaemon
from meter.sources.common import ChannelSpec, PowerSource, SourceError
from meter.sources.hwmon import HwmonSource
from meter.sources.nvml import NvmlBinding, NvmlSource
from meter.sources.pmic import PmicSource, run_command
from meter.sources.rapl import RaplSource
from meter.sources.recorder import SourcePoller
from tests.meter.sources_fakes import (
    PMIC_SAMPLE,
    FakeNvmlLib,
    ListWriter,
    hwmon_tree,
    rapl_tree,
)


def read_costs(src: PowerSource, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        src.read()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def quantiles(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[int(0.9 * (len(xs) - 1))]


def p10(xs: list[float]) -> float:
    return sorted(xs)[int(0.1 * (len(xs) - 1))]


class StepNvml(FakeNvmlLib):
    """Fake NVML whose energy counter steps every `update_s` (like the H100's 100 ms)."""

    def __init__(self, update_s: float, watts: float = 300.0) -> None:
        super().__init__([0], [int(watts * 1000)])
        self.update_s, self.watts, self.t0 = update_s, watts, time.monotonic()

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, energy) -> int:
        k = int((time.monotonic() - self.t0) / self.update_s)
        energy._obj.value = int(k * self.update_s * self.watts * 1000)
        return 0


class SlowSensor(PowerSource):
    """A power sensor whose value changes every `update_s`; each read sleeps `cost_s`."""

    kind = "bench"

    def __init__(self, update_s: float, cost_s: float = 0.0, min_interval_s: float = 0.1) -> None:
        self.update_s, self.cost_s, self.t0 = update_s, cost_s, time.monotonic()
        self.min_interval_s = min_interval_s

    def channels(self) -> list[ChannelSpec]:
        return [ChannelSpec("bench", "bench:sensor", "other", "power", None, 1.0, "bench")]

    def read(self) -> list[float | SourceError]:
        if self.cost_s:
            time.sleep(self.cost_s)
        return [10.0 + int((time.monotonic() - self.t0) / self.update_s) % 7]


def run_poller(src: PowerSource, seconds: float) -> tuple[SourcePoller, ListWriter, float]:
    poller, writer = SourcePoller(src, 0, SystemClock()), ListWriter()
    poller.start(writer)
    t0 = time.monotonic()
    time.sleep(seconds)
    poller.stop()
    return poller, writer, time.monotonic() - t0


def lateness_p99_ms(seconds: float, sources: list) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        d = MeterDaemon(DaemonOptions(out_dir=Path(tmp) / "t", emulate=True, rate_hz=20,
                                      duration_s=seconds, listen=None, sources=sources),
                        log=lambda _l: None)
        d.run()
        meta = json.loads((Path(tmp) / "t" / "seg-000001.meta.json").read_text())
    st = meta["stats"]
    return st["schedule_lateness_ns"]["p99_ns"] / 1e6, st["late_sweeps"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--reads", type=int, default=2000)
    args = ap.parse_args()
    n = args.reads
    print(machine_line("bench_sources.py"), flush=True)
    print("software power sources — all on synthetic trees / fakes (no real counters here)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rapl_tree(root)
        hwmon_tree(root)
        results = {
            "rapl": read_costs(RaplSource(root), n),
            "hwmon": read_costs(HwmonSource(root), n),
            "nvml-binding": read_costs(NvmlSource(NvmlBinding(FakeNvmlLib([1], [1]))), n),
        }
        out = root / "pmic.txt"
        out.write_text(PMIC_SAMPLE)
        pmic = PmicSource(lambda argv: run_command(["cat", str(out)]))
        results["pmic (cat as vcgencmd)"] = read_costs(pmic, max(20, n // 50))
    print("\n1. reading cost per sample (µs)")
    for name, xs in results.items():
        med, p90 = quantiles(xs)
        print(f"   {name:24s} median {med:9.1f}  p90 {p90:9.1f}  ({len(xs)} reads)")
    for key, name in (("sources-read-cost-rapl-us", "rapl"), ("sources-read-cost-hwmon-us",
                      "hwmon"), ("sources-read-cost-nvml-binding-us", "nvml-binding")):
        med, p90 = quantiles(results[name])
        emit(key, round(med, 4), len(results[name]), [round(p10(results[name]), 4),
                                                      round(p90, 4)],
             "median of the reads; spread = p10-p90")

    print(f"\n2. achieved rate vs the counter's update rate ({args.seconds:g} s each)")
    poller, writer, el = run_poller(NvmlSource(NvmlBinding(StepNvml(0.1))), args.seconds)
    rows_hz = len(writer.rows) / el
    reads_hz = poller.trackers[0].stats.reads / el
    print(f"   NVML fake, counter updates at 10 Hz: {reads_hz:.2f} reads/s, {rows_hz:.2f} rows/s "
          f"(a row per counter update), poll interval {poller.interval_s:.3f} s")
    emit("sources-achieved-over-update-rate-nvml", round(rows_hz / 10.0, 4), 1, None,
         f"one {args.seconds:g} s run")
    slow_s = max(args.seconds * 2, 8.0)
    poller, writer, el = run_poller(SlowSensor(update_s=1.0), slow_s)
    m = poller.measured()["0"]
    print(f"   sensor updating at 1 Hz, first polled at 10 Hz: settled to poll interval "
          f"{poller.interval_s:.3f} s after {m['reads']} reads ({m['unchanged_reads']} "
          f"unchanged); update interval measured {m['update_interval_s_measured']}")
    emit("sources-poll-over-update-rate-slow-hwmon", round(1.0 / poller.interval_s, 4), 1, None,
         f"one {slow_s:g} s run")

    print("\n3. wall meter (4 emulated channels, 20 Hz) alone vs with a 40 ms/read source")
    alone, late_a = lateness_p99_ms(args.seconds, [])
    beside, late_b = lateness_p99_ms(args.seconds, [SlowSensor(0.1, cost_s=0.04)])
    print(f"   p99 sweep lateness alone {alone:.3f} ms ({late_a} late sweeps), "
          f"with the slow source {beside:.3f} ms ({late_b} late sweeps)")
    emit("sources-wall-sweep-lateness-ratio", round(beside / max(alone, 1e-3), 4), 1, None,
         f"one {args.seconds:g} s run each, alone and with the slow source")


if __name__ == "__main__":
    main()
