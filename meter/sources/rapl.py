"""RAPL through Linux powercap: ``energy_uj`` of the package, DRAM and platform (psys) zones.

Each zone directory (``/sys/class/powercap/intel-rapl:N`` and its sub-zones ``intel-rapl:N:M``;
AMD CPUs appear under the same driver) has ``name``, ``energy_uj`` (a µJ counter that wraps to
0 after ``max_energy_range_uj``) and ``enabled``. ``core`` and ``uncore`` sub-zones are parts of
their package and are left out so that channels never double count. Since Linux 5.10
(CVE-2020-8694) ``energy_uj`` is readable by root only: the error says how to open it.
"""

from __future__ import annotations

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

POWERCAP = "sys/class/powercap"
_ZONE_RE = re.compile(r"^intel-rapl(:\d+)+$")
_SCOPES = (("package", "package"), ("dram", "dram"), ("psys", "platform"))
MEASURES = {
    "package": "CPU package (cores, caches, uncore, integrated GPU) as the CPU's energy model "
               "estimates it; not DRAM, disks, fans, the board or the power supply",
    "dram": "DRAM as the memory controller estimates it; not the rest of the machine",
    "platform": "the platform (psys) domain where the firmware provides it: SoC and what the "
                "firmware attributes to it; not the power supply's losses",
}
#: RAPL energy updates about every 1 ms; 20 Hz polling resolves windows well and costs little.
RAPL_MIN_INTERVAL_S = 0.05


def find_zones(root: Path) -> list[tuple[Path, str, str]]:
    """(zone dir, zone name, scope) of every package/dram/psys zone under ``root``."""
    base = root / POWERCAP
    if not base.is_dir():
        return []
    out: list[tuple[Path, str, str]] = []
    for entry in sorted(os.listdir(base)):
        if not _ZONE_RE.match(entry):
            continue
        zone = base / entry
        try:
            name = (zone / "name").read_text().strip()
        except OSError:
            continue
        for prefix, scope in _SCOPES:
            if name.startswith(prefix):
                out.append((zone, name, scope))
                break
    return out


class RaplSource(PowerSource):
    """Every readable RAPL package, DRAM and psys zone, one energy channel each."""

    kind = "rapl"
    min_interval_s = RAPL_MIN_INTERVAL_S

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = sysfs_root(root)
        zones = find_zones(self.root)
        if not zones:
            raise SourceError(EventKind.READ_ERROR, f"{self.root / POWERCAP}: no RAPL zones",
                              "not an x86 CPU with RAPL, or the intel_rapl driver is not "
                              "loaded (`sudo modprobe intel_rapl_msr`)")
        self._specs: list[ChannelSpec] = []
        self._files: list[Path] = []
        for zone, name, scope in zones:
            energy = zone / "energy_uj"
            read_sysfs_number(energy)  # raises SourceError (permission denied) with the fix
            try:
                max_range_j: float | None = read_sysfs_number(zone / "max_energy_range_uj") / 1e6
            except SourceError:
                max_range_j = None  # unknown range: a decrease counts as backwards
            label = name if name[-1].isdigit() else f"{name}-{zone.name.split(':')[1]}"
            self._specs.append(ChannelSpec(
                source="rapl", name=f"rapl:{label}", scope=scope, counter="energy",
                resolution_j=1e-6, resolution_w=None, measures=MEASURES[scope],
                path=str(zone), max_range_j=max_range_j,
                extra={"zone": name},
            ))
            self._files.append(energy)

    def channels(self) -> list[ChannelSpec]:
        return list(self._specs)

    def read(self) -> list[float | SourceError]:
        out: list[float | SourceError] = []
        for f in self._files:
            try:
                out.append(read_sysfs_number(f) / 1e6)
            except SourceError as err:
                out.append(err)
        return out
