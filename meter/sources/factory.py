"""Pick the sources: ``--source auto`` (every one this machine can read) or a list by name.

An explicitly named source that cannot be read stops the command with one line and the fix
(``UserError``); ``auto`` leaves it out and says why. ``probe_sources`` tells ``epi doctor``
which counters are present and which of them are readable.
"""

from __future__ import annotations

import ctypes.util
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from epi.core.errors import UserError
from meter.sources.common import NullSource, PowerSource, SourceError, sysfs_root
from meter.sources.hwmon import HwmonSource, find_attributes
from meter.sources.nvml import NvmlBinding, NvmlSource
from meter.sources.pmic import COMMAND, PmicSource, Runner
from meter.sources.rapl import RaplSource, find_zones

SOURCE_KINDS: tuple[str, ...] = ("rapl", "hwmon", "nvml", "pmic")


@dataclass
class SourceEnv:
    """Where the sources read from (tests replace each piece)."""

    sysfs_root: str | os.PathLike[str] | None = None
    nvml: Callable[[], NvmlBinding] | None = None  # default: load libnvidia-ml
    pmic_runner: Runner | None = None  # default: run vcgencmd


def parse_spec(spec: str) -> tuple[list[str], bool]:
    """``"auto"`` → (all kinds, True); ``"rapl,nvml"`` → (those, False); bad names refused."""
    items = [s.strip().lower() for s in spec.split(",") if s.strip()]
    if not items:
        raise UserError("--source: empty; give auto or a list of " + ", ".join(SOURCE_KINDS))
    if items == ["auto"]:
        return list(SOURCE_KINDS), True
    bad = [s for s in items if s not in SOURCE_KINDS]
    if bad:
        raise UserError(f"--source: unknown source {bad[0]!r}; choose auto or from "
                        + ", ".join(SOURCE_KINDS))
    return list(dict.fromkeys(items)), False


def open_source(kind: str, env: SourceEnv) -> PowerSource:
    """Open one source; SourceError when it is absent or unreadable."""
    if kind == "rapl":
        return RaplSource(env.sysfs_root)
    if kind == "hwmon":
        return HwmonSource(env.sysfs_root)
    if kind == "nvml":
        return NvmlSource(env.nvml() if env.nvml else None)
    if kind == "pmic":
        return PmicSource(env.pmic_runner)
    raise ValueError(kind)


def open_sources(spec: str, env: SourceEnv | None = None,
                 log: Callable[[str], None] = lambda _line: None) -> list[PowerSource]:
    """The opened sources for a ``--source`` value (``auto`` may give none: ``[NullSource]``)."""
    env = env or SourceEnv()
    kinds, auto = parse_spec(spec)
    opened: list[PowerSource] = []
    for kind in kinds:
        try:
            opened.append(open_source(kind, env))
        except SourceError as err:
            if not auto:
                raise UserError(f"--source {kind}: {err.line()}") from None
            log(f"epi meter: source {kind} left out: {err.line()}")
    if not opened:
        return [NullSource()]
    return opened


@dataclass(frozen=True)
class SourceProbe:
    """One source as ``epi doctor`` reports it: are its counters here, can this user read them."""

    source: str
    present: bool  # the counters exist on this machine
    readable: bool
    detail: str  # the channel names when readable, else what failed and the fix


def probe_sources(env: SourceEnv | None = None) -> list[SourceProbe]:
    """Per source: ``present`` (the counters exist), ``readable`` and a one-line detail."""
    env = env or SourceEnv()
    root = sysfs_root(env.sysfs_root)
    present = {
        "rapl": bool(find_zones(root)),
        "hwmon": bool(find_attributes(root)),
        "nvml": env.nvml is not None or ctypes.util.find_library("nvidia-ml") is not None,
        "pmic": env.pmic_runner is not None or shutil.which(COMMAND[0]) is not None,
    }
    out: list[SourceProbe] = []
    for kind in SOURCE_KINDS:
        if not present[kind]:
            out.append(SourceProbe(kind, present=False, readable=False,
                                   detail="not on this machine"))
            continue
        try:
            src = open_source(kind, env)
        except SourceError as err:
            out.append(SourceProbe(kind, present=True, readable=False, detail=err.line()))
            continue
        names = ", ".join(c.name for c in src.channels())
        src.close()
        out.append(SourceProbe(kind, present=True, readable=True, detail=names))
    return out
