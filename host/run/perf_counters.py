"""Kernel performance counters per request and phase, read through perf_event_open(2).

The runner reads them beside the token log so that the study's fifth question (bandwidth or
compute?) can lean on what the CPU counted, where the kernel offers it:

- **software events**, on every Linux: `task-clock` (ns of CPU time), `context-switches`,
  `cpu-migrations`, `page-faults`;
- **hardware events** where the CPU has a PMU the kernel exposes: on the Raspberry Pi 5's
  Cortex-A76 the Arm PMUv3 common events `inst_retired` (0x08), `cpu_cycles` (0x11),
  `mem_access` (0x13), `l2d_cache_refill` (0x17) and `bus_access` (0x19), opened as raw events
  (Arm, *Cortex-A76 Technical Reference Manual*, PMU events table). Elsewhere (this project's
  x86 VMs have no PMU) each is recorded as unavailable with the kernel's reason.

Scope: one counter per event for every thread of the inference process that exists when a
request starts (llama.cpp's worker threads exist after the warm-up); the counts are summed over
threads. Threads created during a request are not counted, and an RPC worker's work on another
machine is not either: both are stated in run.json. Reading happens right after the first
token's and the end's clock stamps, so the stamps are never delayed by it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from epi.formats.json_types import JSON

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_RAW = 4

SYSCALL_NR = {"x86_64": 298, "aarch64": 241, "armv7l": 364, "armv6l": 364}
ATTR_SIZE = 64  # PERF_ATTR_SIZE_VER0: type .. bp_addr/config1
FLAG_EXCLUDE_HV = 1 << 6


@dataclass(frozen=True)
class Event:
    """One counter: its perf name, kernel type and config, and its unit."""

    name: str
    type_id: int
    config: int
    unit: str
    hardware: bool


SOFTWARE_EVENTS: tuple[Event, ...] = (
    Event("task-clock", PERF_TYPE_SOFTWARE, 1, "ns", False),
    Event("context-switches", PERF_TYPE_SOFTWARE, 3, "count", False),
    Event("cpu-migrations", PERF_TYPE_SOFTWARE, 4, "count", False),
    Event("page-faults", PERF_TYPE_SOFTWARE, 2, "count", False),
)
# Arm PMUv3 common event numbers, as the Cortex-A76 implements them
CORTEX_A76_EVENTS: tuple[Event, ...] = (
    Event("inst_retired", PERF_TYPE_RAW, 0x08, "count", True),
    Event("cpu_cycles", PERF_TYPE_RAW, 0x11, "count", True),
    Event("mem_access", PERF_TYPE_RAW, 0x13, "count", True),
    Event("l2d_cache_refill", PERF_TYPE_RAW, 0x17, "count", True),
    Event("bus_access", PERF_TYPE_RAW, 0x19, "count", True),
)
# the generic hardware pair elsewhere (x86 with a PMU)
GENERIC_HW_EVENTS: tuple[Event, ...] = (
    Event("cycles", PERF_TYPE_HARDWARE, 0, "count", True),
    Event("instructions", PERF_TYPE_HARDWARE, 1, "count", True),
)


def default_events(machine: str | None = None) -> tuple[Event, ...]:
    """Software events everywhere, plus the machine's hardware events."""
    machine = machine or platform.machine()
    hw = CORTEX_A76_EVENTS if machine == "aarch64" else GENERIC_HW_EVENTS
    return SOFTWARE_EVENTS + hw


def _attr(event: Event) -> bytes:
    # type, size, config, sample_period, sample_type, read_format, flags, wakeup_events,
    # bp_type, config1: counting mode (no sampling), enabled at open, user and kernel counted
    return struct.pack("=IIQQQQQIIQ", event.type_id, ATTR_SIZE, event.config, 0, 0, 0,
                       FLAG_EXCLUDE_HV, 0, 0, 0)


class _Syscall:
    def __init__(self) -> None:
        nr = SYSCALL_NR.get(platform.machine())
        if nr is None or os.name != "posix":
            raise OSError(errno.ENOSYS, f"perf_event_open: not known on {platform.machine()}")
        libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._nr = nr

    def open(self, event: Event, tid: int) -> int:
        buf = ctypes.create_string_buffer(_attr(event), ATTR_SIZE)
        fd = self._syscall(ctypes.c_long(self._nr), buf, ctypes.c_int(tid), ctypes.c_int(-1),
                           ctypes.c_int(-1), ctypes.c_ulong(0))
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return int(fd)


def _read(fd: int) -> int:
    return int.from_bytes(os.read(fd, 8), "little")  # a counter fd reads its value each time


def threads(pid: int | None = None) -> list[int]:
    """The thread ids of a process (this one by default)."""
    base = Path("/proc") / (str(pid) if pid else "self") / "task"
    return sorted(int(p.name) for p in base.iterdir() if p.name.isdigit())


@dataclass
class Availability:
    """Which events can be counted here, and why not the others (the kernel's words)."""

    events: list[Event] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, JSON]:
        return {"events": [e.name for e in self.events], "units": {e.name: e.unit
                                                                   for e in self.events},
                "unavailable": dict(self.unavailable),
                "scope": "summed over the inference process's threads that exist when a "
                         "request starts; not threads created during it, not RPC workers"}


def probe(events: Iterable[Event] | None = None) -> Availability:
    """Open each event once on this thread to learn whether the kernel counts it here."""
    av = Availability()
    try:
        sc = _Syscall()
    except OSError as exc:
        av.unavailable = {e.name: exc.strerror or str(exc) for e in (events or default_events())}
        return av
    for e in events or default_events():
        try:
            fd = sc.open(e, 0)
        except OSError as exc:
            av.unavailable[e.name] = exc.strerror or str(exc)
            continue
        os.close(fd)
        av.events.append(e)
    return av


class RequestCounters:
    """Counters over one request: `start()` before the prompt, `first_token()` right after the
    first token's stamp, `end()` after the last; `phases()` gives prefill and decode counts."""

    def __init__(self, events: list[Event], tids: list[int] | None = None) -> None:
        self._events = events
        self._tids = tids  # None: every thread of this process at each start
        self._sc = _Syscall() if events else None
        self._fds: dict[str, list[int]] = {}
        self._marks: list[dict[str, int]] = []

    def start(self) -> None:
        self._fds = {e.name: [] for e in self._events}
        assert self._sc is not None or not self._events
        for tid in (self._tids if self._tids is not None else threads()) if self._events else []:
            for e in self._events:
                try:
                    self._fds[e.name].append(self._sc.open(e, tid))  # type: ignore[union-attr]
                except OSError:
                    continue  # the thread ended between listing and opening
        self._marks = [self._sample()]

    def _sample(self) -> dict[str, int]:
        return {name: sum(_read(fd) for fd in fds) for name, fds in self._fds.items()}

    def first_token(self) -> None:
        self._marks.append(self._sample())

    def end(self) -> None:
        self._marks.append(self._sample())
        for fds in self._fds.values():
            for fd in fds:
                os.close(fd)
        self._fds = {}

    def phases(self) -> dict[str, dict[str, int]]:
        """{"prefill": {event: count}, "decode": {...}} from the three marks."""
        if len(self._marks) != 3:
            return {}
        s, f, e = self._marks
        return {"prefill": {k: f[k] - s[k] for k in s}, "decode": {k: e[k] - f[k] for k in s}}
