"""Synthetic sysfs trees and a fake NVML library for the software power source tests."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

PMIC_SAMPLE = """\
     3V7_WL_SW_A current(0)=0.10000000A
       3V3_SYS_A current(1)=0.20000000A
      VDD_CORE_A current(7)=2.00000000A
     3V7_WL_SW_V volt(8)=3.70000000V
       3V3_SYS_V volt(9)=3.30000000V
      VDD_CORE_V volt(15)=0.75000000V
       EXT5V_V volt(24)=5.10000000V
"""
PMIC_SAMPLE_W = 0.1 * 3.7 + 0.2 * 3.3 + 2.0 * 0.75  # EXT5V has no current: not a rail


def rapl_tree(root: Path, *, package_uj: int = 1_000_000, dram_uj: int = 500_000,
              max_range_uj: int = 262_143_328_850, psys: bool = False) -> Path:
    """/sys/class/powercap with package-0 (+ core, uncore, dram sub-zones)."""
    base = root / "sys/class/powercap"
    zones = {
        "intel-rapl:0": ("package-0", package_uj),
        "intel-rapl:0:0": ("core", 123),
        "intel-rapl:0:1": ("dram", dram_uj),
        "intel-rapl:0:2": ("uncore", 456),
        "intel-rapl-mmio:0": ("package-0", 789),  # the MMIO duplicate interface: not read
    }
    if psys:
        zones["intel-rapl:1"] = ("psys", 42)
    for zone, (name, uj) in zones.items():
        d = base / zone
        d.mkdir(parents=True)
        (d / "name").write_text(name + "\n")
        (d / "energy_uj").write_text(f"{uj}\n")
        (d / "max_energy_range_uj").write_text(f"{max_range_uj}\n")
        (d / "enabled").write_text("1\n")
    return base


def set_uj(root: Path, zone: str, uj: int) -> None:
    """Replace a zone's counter atomically (sysfs never shows a half-written value)."""
    path = root / "sys/class/powercap" / zone / "energy_uj"
    tmp = path.with_name(f".energy_uj.{threading.get_ident()}")
    tmp.write_text(f"{uj}\n")
    os.replace(tmp, path)


def hwmon_tree(root: Path) -> Path:
    base = root / "sys/class/hwmon"
    gpu = base / "hwmon0"
    gpu.mkdir(parents=True)
    (gpu / "name").write_text("amdgpu\n")
    (gpu / "power1_average").write_text("15000000\n")  # 15 W
    (gpu / "power1_input").write_text("16000000\n")  # preferred over _average
    (gpu / "power1_label").write_text("PPT\n")
    (gpu / "update_interval").write_text("250\n")
    cpu = base / "hwmon1"
    cpu.mkdir()
    (cpu / "name").write_text("amd_energy\n")
    (cpu / "energy1_input").write_text("7000000\n")
    (cpu / "energy1_label").write_text("Esocket0\n")
    (cpu / "power1_input").write_text("1\n")  # same index: the energy counter wins
    temp = base / "hwmon2"
    temp.mkdir()
    (temp / "name").write_text("k10temp\n")
    (temp / "temp1_input").write_text("40000\n")
    return base


class FakeNvmlLib:
    """The NVML C functions the binding calls, taking ctypes byref() arguments like the real
    library. ``energy_mj`` per GPU (None: not supported → power fallback)."""

    def __init__(self, energy_mj: list[int | None], power_mw: list[int],
                 names: list[str] | None = None, init_code: int = 0) -> None:
        self.energy_mj = energy_mj
        self.power_mw = power_mw
        self.names = names or [f"Fake GPU {i}" for i in range(len(power_mw))]
        self.init_code = init_code
        self.fail_code: dict[int, int] = {}  # GPU index → error code of its next reads
        self.calls = 0

        def error_string(code: int) -> bytes:
            return {3: b"Not Supported", 4: b"Insufficient Permissions",
                    15: b"GPU is lost"}.get(code, b"Unknown Error")
        self.nvmlErrorString = error_string

    def nvmlInit_v2(self) -> int:
        return self.init_code

    def nvmlShutdown(self) -> int:
        return 0

    def nvmlDeviceGetCount_v2(self, count: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        count._obj.value = len(self.power_mw)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index: ctypes.c_uint, handle) -> int:
        handle._obj.value = index.value + 1
        return 0

    def nvmlDeviceGetName(self, handle, buf, length) -> int:
        buf.value = self.names[handle.value - 1].encode()
        return 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, energy) -> int:
        self.calls += 1
        i = handle.value - 1
        if i in self.fail_code:
            return self.fail_code[i]
        if self.energy_mj[i] is None:
            return 3
        energy._obj.value = self.energy_mj[i]
        return 0

    def nvmlDeviceGetPowerUsage(self, handle, power) -> int:
        self.calls += 1
        i = handle.value - 1
        if i in self.fail_code:
            return self.fail_code[i]
        power._obj.value = self.power_mw[i]
        return 0


class StepClock:
    """A clock the test moves by hand (monotonic and realtime together)."""

    simulated = True

    def __init__(self, t_ns: int = 1_000_000_000) -> None:
        self.t = t_ns

    def monotonic_ns(self) -> int:
        return self.t

    def realtime_ns(self) -> int:
        return self.t + 1_700_000_000_000_000_000

    def advance(self, seconds: float) -> None:
        self.t += round(seconds * 1e9)


class ListWriter:
    """Collects what a TraceWriter would write."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.events: list[tuple] = []

    def write_samples(self, rows) -> int:
        self.rows.extend(rows)
        return len(rows)

    def write_event(self, t_mono_ns, t_real_ns, channel, kind, detail="") -> None:
        self.events.append((t_mono_ns, t_real_ns, channel, kind, detail))

    def kinds(self) -> list[str]:
        return [e[3] for e in self.events]


class AdvancingRapl:
    """A synthetic RAPL tree whose counters advance from known powers in real time.

    A thread rewrites each zone's ``energy_uj`` (atomically) every ``step_s`` as
    power × (t − t0), wrapping at ``max_range_uj`` like the hardware. A value read is stale by
    at most the longest interval between two rewrites, which the fake measures
    (``max_staleness_s``): on a loaded machine the thread is scheduled late, and tests derive
    their tolerance from this figure instead of hoping the machine is idle.
    """

    def __init__(self, root: Path, package_w: float, dram_w: float, *, step_s: float = 0.002,
                 max_range_uj: int = 262_143_328_850, start_uj: int = 0) -> None:
        import time

        rapl_tree(root, package_uj=start_uj, dram_uj=start_uj, max_range_uj=max_range_uj)
        self.root, self.step_s, self.range = root, step_s, max_range_uj
        self.powers = {"intel-rapl:0": package_w, "intel-rapl:0:1": dram_w}
        self.start_uj = start_uj
        self.max_staleness_s = 0.0
        self._time = time
        self.t0 = time.monotonic_ns()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        last = self._time.monotonic_ns()
        while not self._stop.wait(self.step_s):
            now = self._time.monotonic_ns()
            dt_s = (now - self.t0) / 1e9
            for zone, w in self.powers.items():
                set_uj(self.root, zone, (self.start_uj + round(w * dt_s * 1e6)) % self.range)
            done = self._time.monotonic_ns()
            # a reader may see the previous value until this write ended
            self.max_staleness_s = max(self.max_staleness_s, (done - last) / 1e9)
            last = now

    def rel_tolerance(self, n_windows: int, seconds: float, base: float = 0.01) -> float:
        """Relative error bound of an energy summed over `n_windows` windows lasting `seconds`
        in all: each window edge may be stale by up to max_staleness_s."""
        return base + 2 * n_windows * self.max_staleness_s / seconds

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
