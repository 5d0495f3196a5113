"""hwmon power and energy attributes, wherever a driver exposes them.

``/sys/class/hwmon/hwmonN/`` with ``name`` (the driver), ``energyK_input`` (cumulative µJ) and
``powerK_input`` or ``powerK_average`` (µW), ``powerK_label``/``energyK_label`` and, for some
drivers, ``update_interval`` (ms). An index with both an energy and a power attribute gives
one channel, from the energy counter (no integration error). What a channel sees depends on the
driver: a GPU (amdgpu, nouveau), a CPU socket (amd_energy, zenpower), a power monitor chip
(ina2xx, ina3221: the rail it is wired to). The driver name and label are written with it.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from epi.formats.trace import EventKind
from meter.sources.common import (
    ChannelSpec,
    PowerSource,
    SourceError,
    read_sysfs_number,
    sysfs_root,
)

HWMON = "sys/class/hwmon"
_ATTR_RE = re.compile(r"^(power|energy)(\d+)_(input|average)$")
_GPU_DRIVERS = frozenset({"amdgpu", "radeon", "nouveau", "i915", "xe"})
_CPU_DRIVERS = frozenset({"amd_energy", "zenpower", "fam15h_power"})
DEFAULT_INTERVAL_S = 0.1


def _scope(driver: str, label: str) -> str:
    if driver in _GPU_DRIVERS:
        return "gpu"
    if driver in _CPU_DRIVERS:
        return "package" if "socket" in label.lower() or not label else "other"
    return "other"


def find_attributes(root: Path) -> list[tuple[Path, str, str, str, Path]]:
    """(hwmon dir, driver, index key, kind, attribute file) of each channel, energy first."""
    base = root / HWMON
    if not base.is_dir():
        return []
    out: list[tuple[Path, str, str, str, Path]] = []
    for entry in sorted(os.listdir(base)):
        dev = base / entry
        try:
            driver = (dev / "name").read_text().strip()
            names = sorted(os.listdir(dev))
        except OSError:
            continue
        found: dict[str, tuple[str, Path]] = {}
        for attr in names:
            m = _ATTR_RE.match(attr)
            if not m:
                continue
            kind, idx, which = m.groups()
            key = idx
            have = found.get(key)
            # energy beats power; power*_input beats power*_average
            if have is None or (kind == "energy" and have[0] != "energy") or (
                    have[0] == "power" and kind == "power" and which == "input"):
                found[key] = (kind, dev / attr)
        for idx in sorted(found, key=int):
            kind, path = found[idx]
            out.append((dev, driver, idx, kind, path))
    return out


class HwmonSource(PowerSource):
    """Every readable hwmon energy/power attribute, one channel per sensor index."""

    kind = "hwmon"
    min_interval_s = DEFAULT_INTERVAL_S

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = sysfs_root(root)
        attrs = find_attributes(self.root)
        if not attrs:
            raise SourceError(EventKind.READ_ERROR, f"{self.root / HWMON}: no power*_input or "
                              "energy*_input attribute", "no driver here exposes power; see "
                              "`sensors` (lm-sensors) for what this machine has")
        self._specs: list[ChannelSpec] = []
        self._files: list[tuple[Path, float]] = []
        intervals: list[float] = []
        for dev, driver, idx, kind, path in attrs:
            read_sysfs_number(path)  # permission denied → SourceError with the fix
            label = ""
            with contextlib.suppress(OSError):
                label = (dev / f"{kind}{idx}_label").read_text().strip()
            with contextlib.suppress(SourceError):
                intervals.append(read_sysfs_number(dev / "update_interval") / 1e3)
            scope = _scope(driver, label)
            energy = kind == "energy"
            self._specs.append(ChannelSpec(
                source="hwmon", name=f"hwmon:{dev.name}:{driver}:{label or kind + idx}",
                scope=scope, counter="energy" if energy else "power",
                resolution_j=1e-6 if energy else None, resolution_w=None if energy else 1e-6,
                measures=f"what the {driver} driver reports for {label or kind + idx} "
                         f"({scope}); not wall power",
                path=str(path), extra={"driver": driver, "label": label or None},
            ))
            self._files.append((path, 1e-6))
        if intervals:
            self.min_interval_s = max(min(intervals), 0.01)

    def channels(self) -> list[ChannelSpec]:
        return list(self._specs)

    def read(self) -> list[float | SourceError]:
        out: list[float | SourceError] = []
        for path, scale in self._files:
            try:
                out.append(read_sysfs_number(path) * scale)
            except SourceError as err:
                out.append(err)
        return out
