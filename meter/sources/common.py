"""The shape every software power source has: channels it describes, raw readings it returns.

A source reads one or more *channels* in one call. Each channel is either an ``energy``
counter (a cumulative figure in joules that can wrap or go backwards) or a ``power`` reading
(watts, integrated over the sample times by the recorder). ``counters.ChannelTracker`` turns
the raw values into trace rows and events; a source only reads.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from epi.formats.json_types import JSON
from epi.formats.trace import WALL_SCOPE, EventKind

COMPONENT_LABEL = "component power, not wall power"
SCOPES = frozenset({"wall", "package", "dram", "platform", "gpu", "board_rails", "other"})
SYSFS_ROOT_ENV = "EPI_SYSFS_ROOT"
#: what a channel's reading is: a cumulative energy counter (J) or a power reading (W)
Counter = Literal["energy", "power"]


def sysfs_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The directory that stands for ``/`` when reading /sys (tests point it at a tmp tree).

    Order: the argument, then ``$EPI_SYSFS_ROOT``, then ``/``.
    """
    if root is not None:
        return Path(root)
    return Path(os.environ.get(SYSFS_ROOT_ENV) or "/")


class SourceError(Exception):
    """A reading that failed, with the trace event kind and a one-line fix for the user."""

    def __init__(self, kind: EventKind, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.kind = kind  # PERMISSION_DENIED or READ_ERROR
        self.message = message
        self.fix = fix

    def line(self) -> str:
        """The one-line error: what failed, then the fix."""
        return self.message + (f"; fix: {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class ChannelSpec:
    """What one channel of a source measures (written into the trace's channel metadata)."""

    source: str  # "rapl", "hwmon", "nvml", "pmic"
    name: str  # unique in the trace, e.g. "rapl:package-0"
    scope: str  # one of SCOPES
    counter: Counter  # energy: cumulative J; power: W, integrated by the recorder
    resolution_j: float | None  # energy counter step, J (None: a power reading)
    resolution_w: float | None  # power reading step, W (None: an energy counter)
    measures: str  # one sentence: what it sees and what it misses
    path: str | None = None  # sysfs directory, device, or command it reads
    max_range_j: float | None = None  # an energy counter wraps to 0 after this (RAPL)
    extra: dict[str, JSON] = field(default_factory=dict)

    def describe(self) -> dict[str, JSON]:
        return {
            "source": self.source,
            "scope": self.scope,
            "wall": self.scope == WALL_SCOPE,
            "label": COMPONENT_LABEL if self.scope != WALL_SCOPE else "wall power",
            "counter": self.counter,
            "resolution_j": self.resolution_j,
            "resolution_w": self.resolution_w,
            "max_range_j": self.max_range_j,
            "measures": self.measures,
            "path": self.path,
            **self.extra,
        }


class PowerSource(ABC):
    """One family of counters on this machine, read in one call on the source's own thread."""

    kind: str = "abstract"
    #: shortest poll interval, s: never poll faster than the counter updates
    min_interval_s: float = 0.1

    @abstractmethod
    def channels(self) -> list[ChannelSpec]:
        """The channels, in the order ``read`` returns them."""

    @abstractmethod
    def read(self) -> list[float | SourceError]:
        """One raw value per channel (J for energy counters, W for power), or its error."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release the library or files (most sources hold nothing open)."""

    def describe(self) -> dict[str, JSON]:
        return {"kind": self.kind, "min_interval_s": self.min_interval_s}


class NullSource(PowerSource):
    """No meter here: a source with no channels (what the factory returns for nothing)."""

    kind = "none"

    def channels(self) -> list[ChannelSpec]:
        return []

    def read(self) -> list[float | SourceError]:
        return []


def read_sysfs_number(path: Path) -> int:
    """An integer sysfs attribute, or SourceError naming the file and the fix."""
    try:
        text = path.read_text().strip()
    except PermissionError:
        raise SourceError(EventKind.PERMISSION_DENIED, f"{path}: permission denied",
                          permission_fix(path)) from None
    except FileNotFoundError:
        raise SourceError(EventKind.READ_ERROR, f"{path}: missing (device gone or driver unloaded)",
                          "check the driver is loaded; run `epi doctor`") from None
    except OSError as exc:
        raise SourceError(EventKind.READ_ERROR, f"{path}: cannot read ({exc.strerror})",
                          "check the driver; run `epi doctor`") from None
    except UnicodeDecodeError:
        text = "<not text>"
    try:
        value = int(text)
    except ValueError:
        raise SourceError(EventKind.READ_ERROR, f"{path}: not an integer ({text[:40]!r})",
                          "a driver bug; report the kernel and driver version") from None
    if abs(value) >= 1 << 64:  # no kernel counter is wider; as a float it would overflow
        raise SourceError(EventKind.READ_ERROR, f"{path}: {text[:24]}… overflows a 64-bit counter",
                          "a driver bug; report the kernel and driver version")
    return value


def permission_fix(path: Path) -> str:
    """How to make a root-only sysfs counter readable."""
    if "powercap" in str(path):
        return (f"RAPL energy is root-only since Linux 5.10 (CVE-2020-8694): run as root, or "
                f"`sudo chmod o+r {path.parent.parent}/*/energy_uj` (again after each boot)")
    return f"run as root, or `sudo chmod o+r {path}`"
