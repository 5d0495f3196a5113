"""Faults injected into an emulated bridge: at the UART layer between the emulated MCU and the
bridge recorder, and at the chips behind the MCU.

UART spec: `KIND@START[+DURATION]` (seconds from the start of the recording), comma-separated:

* `drop-bytes@S+D` — while active, every chunk read loses one byte;
* `flip-bits@S+D` — while active, one bit of every chunk read is flipped;
* `lose-lines@S+D` — while active, everything read is discarded (whole lines lost);
* `unplug@S+D` — the port disappears: reads, writes and re-opening fail until S+D;
* `mcu-reset@S` — the MCU reboots (new boot id, seq and counts from 0).

Chip spec: `KIND:CHANNEL@START[+DURATION][=VALUE]`, the direct path's emulator faults
(meter.emulation.faults: `reset`, `checksum`, `absent`, `stuck`, `bit-errors`,
`partial-frames`) applied to the emulated chips the firmware reads (CHANNEL: the firmware's
channel index). The firmware must report each as an event, never send a wrong value.

Every one of them must show up in the trace as an event or a gap
(tests/meter/test_bridge_faults.py, tests/meter/test_bridge_chip_faults.py).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epi.core.errors import UserError
from meter.bridge.emulate import EmulatedBoard
from meter.bridge.link import Link
from meter.clock import Clock
from meter.emulation.faults import FaultInjector, FaultSpec, parse_fault_specs
from meter.errors import LinkLost

if TYPE_CHECKING:
    from meter.emulation.chip_emulator import EmulatedChip

KINDS = ("drop-bytes", "flip-bits", "lose-lines", "unplug", "mcu-reset")
_SPEC = re.compile(r"^([a-z-]+)@(\d+(?:\.\d+)?)(?:\+(\d+(?:\.\d+)?))?$")


@dataclass(frozen=True)
class UartFault:
    kind: str
    start_s: float
    duration_s: float = 0.0

    def active(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.start_s + self.duration_s

    def describe(self) -> dict:
        return {"kind": self.kind, "start_s": self.start_s, "duration_s": self.duration_s,
                "modelled": True}


def parse_uart_faults(specs: Iterable[str]) -> list[UartFault]:
    out = []
    for spec in specs:
        for part in str(spec).split(","):
            part = part.strip()
            if not part:
                continue
            m = _SPEC.match(part)
            if not m or m.group(1) not in KINDS:
                raise UserError(f"--fault-injection {part!r}: expected KIND@START[+DURATION] "
                                f"with KIND one of {', '.join(KINDS)} (bridge faults), or "
                                "KIND:CHANNEL@START[+DURATION][=VALUE] (a chip fault)")
            dur = float(m.group(3) or 0.0)
            if m.group(1) != "mcu-reset" and dur <= 0:
                raise UserError(f"--fault-injection {part!r}: {m.group(1)} needs +DURATION")
            out.append(UartFault(m.group(1), float(m.group(2)), dur))
    return out


def parse_bridge_faults(specs: Iterable[str]) -> tuple[list[UartFault], list[FaultSpec]]:
    """(UART faults, chip faults) of `--fault-injection` values for an emulated bridge."""
    uart: list[UartFault] = []
    chip: list[FaultSpec] = []
    for spec in specs:
        for part in str(spec).split(","):
            part = part.strip()
            if ":" in part.split("@")[0]:
                chip += parse_fault_specs([part])
            elif part:
                uart += parse_uart_faults([part])
    return uart, chip


class _ChipChannel:
    """What meter.emulation.faults.FaultInjector needs to know of a channel."""

    def __init__(self, index: int, emulator: EmulatedChip) -> None:
        self.index = index
        self.name = f"ch{index}"
        self.emulator = emulator


class FaultyLink:
    """Wraps a link; corrupts or cuts it on schedule (the far end of an emumcu:// port).
    `board` (the EmulatedBoard) receives `mcu-reset`, its chips the `chip_faults`."""

    def __init__(self, inner: Link, clock: Clock, faults: list[UartFault], *,
                 board: EmulatedBoard | None = None,
                 seed: int = 0, chip_faults: list[FaultSpec] | None = None) -> None:
        self.inner = inner
        self.clock = clock
        self.faults = faults
        self.board = board
        self.t0 = clock.monotonic_ns()
        self.rng = random.Random(seed)
        self.resets_done: set[int] = set()
        self.injected: dict[str, int] = {}
        self.chip_faults = list(chip_faults or [])
        self.chip_injector: FaultInjector | None = None
        if self.chip_faults:
            if board is None:
                raise ValueError("chip faults need the emulated board")
            chips = [_ChipChannel(i, c) for i, c in enumerate(board.chips.values())]
            self.chip_injector = FaultInjector(self.chip_faults, chips, self.t0)

    def _t(self) -> float:
        return (self.clock.monotonic_ns() - self.t0) / 1e9

    def _active(self, kind: str) -> bool:
        t = self._t()
        return any(f.kind == kind and f.active(t) for f in self.faults)

    def _count(self, kind: str) -> None:
        self.injected[kind] = self.injected.get(kind, 0) + 1

    def _resets(self) -> None:
        if self.chip_injector is not None:
            self.chip_injector(self.clock.monotonic_ns())
        t = self._t()
        for i, f in enumerate(self.faults):
            if f.kind == "mcu-reset" and t >= f.start_s and i not in self.resets_done:
                self.resets_done.add(i)
                self._count("mcu-reset")
                if self.board is not None:
                    self.board.reset_mcu()

    def open(self) -> None:
        if self._active("unplug"):
            raise LinkLost("emulated port unplugged")
        self.inner.open()

    def close(self) -> None:
        self.inner.close()

    def idle_until(self, t_mono_ns: int) -> None:
        self._resets()
        idle = getattr(self.inner, "idle_until", None)
        if idle is not None:
            idle(t_mono_ns)
        else:
            self.clock.sleep_until(t_mono_ns)

    def write(self, data: bytes) -> None:
        if self._active("unplug"):
            raise LinkLost("emulated port unplugged")
        self.inner.write(data)

    def read(self, timeout_s: float) -> bytes:
        self._resets()
        if self._active("unplug"):
            self._count("unplug")
            self.inner.read(timeout_s)  # the MCU goes on sending into the void
            raise LinkLost("emulated port unplugged")
        data = self.inner.read(timeout_s)
        if not data:
            return data
        if self._active("lose-lines"):
            self._count("lose-lines")
            return b""
        buf = bytearray(data)
        if self._active("drop-bytes") and buf:
            self._count("drop-bytes")
            del buf[self.rng.randrange(len(buf))]
        if self._active("flip-bits") and buf:
            self._count("flip-bits")
            i = self.rng.randrange(len(buf))
            buf[i] ^= 1 << self.rng.randrange(8)
            if buf[i] == 10:  # a new line end would only split a line; keep it a corruption
                buf[i] ^= 0x20
        return bytes(buf)

    def describe(self) -> dict:
        return {**self.inner.describe(), "faults": [f.describe() for f in self.faults],
                "chip_faults": [f.describe() for f in self.chip_faults]}
