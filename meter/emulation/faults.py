"""Fault injection for emulated runs: `--fault-injection KIND:CHANNEL@START[+DURATION][=VALUE]`.

Each fault acts on one emulated chip (``chip_emulator.EmulatedChip``) at a time given in
seconds after the daemon's schedule starts; the daemon must keep running through all of
them and the trace must show each one (events, gaps). Kinds:

=================  ======================================================  ===============
kind               what the chip does                                      VALUE
=================  ======================================================  ===============
``reset``          resets at START (registers back to defaults)            —
``checksum``       a calibration register flips a bit at START (CalErr)    —
``absent``         unplugged from START for DURATION (MISO floats high)     —
``stuck``          answers one word to everything for DURATION              —
``bit-errors``     MISO/MOSI bits flip with probability VALUE per bit       default 0.001
``partial-frames`` a fraction VALUE of frames is cut short                  default 0.01
=================  ======================================================  ===============

Without ``+DURATION`` a span fault lasts until the end of the run. Several faults are given
comma-separated or by repeating the option, e.g.
``--fault-injection reset:0@5,absent:ch2@10+3,bit-errors:1@15+2=0.002``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypedDict

from epi.core.errors import UserError
from epi.core.vocabulary import Word
from epi.formats.json_types import JSON

if TYPE_CHECKING:
    from meter.emulation.chip_emulator import EmulatedChip

class FaultKind(Word):
    """What an injected fault does to an emulated chip (the table above)."""

    RESET = "reset"
    CHECKSUM = "checksum"
    ABSENT = "absent"
    STUCK = "stuck"
    BIT_ERRORS = "bit-errors"
    PARTIAL_FRAMES = "partial-frames"


ONE_SHOT = frozenset({FaultKind.RESET, FaultKind.CHECKSUM})
SPANS = frozenset({FaultKind.ABSENT, FaultKind.STUCK, FaultKind.BIT_ERRORS,
                   FaultKind.PARTIAL_FRAMES})
DEFAULT_VALUE = {FaultKind.BIT_ERRORS: 0.001, FaultKind.PARTIAL_FRAMES: 0.01}
_SPEC_RE = re.compile(
    r"^(?P<kind>[a-z-]+):(?P<channel>[^@]+)@(?P<start>[0-9.]+)s?"
    r"(?:\+(?P<duration>[0-9.]+)s?)?(?:=(?P<value>[0-9.eE+-]+))?$"
)
_FORMAT_HINT = "expected KIND:CHANNEL@START[+DURATION][=VALUE], e.g. absent:1@10+3"


@dataclass(frozen=True)
class FaultSpec:
    """One requested fault."""

    kind: FaultKind
    channel: str  # index or name, resolved against the opened channels
    start_s: float
    duration_s: float | None
    value: float | None
    text: str

    def describe(self) -> dict[str, JSON]:
        return {
            "kind": self.kind,
            "channel": self.channel,
            "start_s": self.start_s,
            "duration_s": self.duration_s,
            "value": self.value,
            "spec": self.text,
            "modelled": True,
        }


def parse_fault_specs(texts: Iterable[str]) -> list[FaultSpec]:
    """Parse ``--fault-injection`` values (each may hold several, comma-separated)."""
    specs: list[FaultSpec] = []
    for text in texts:
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            m = _SPEC_RE.match(part)
            if not m:
                raise UserError(f"--fault-injection {part!r}: {_FORMAT_HINT}")
            kind = FaultKind.parse(m["kind"])
            if kind is None:
                known = ", ".join(sorted(ONE_SHOT | SPANS))
                raise UserError(f"--fault-injection {part!r}: unknown kind {m['kind']!r} ({known})")
            try:
                start = float(m["start"])
                duration = float(m["duration"]) if m["duration"] else None
                value = float(m["value"]) if m["value"] else None
            except ValueError:
                raise UserError(f"--fault-injection {part!r}: {_FORMAT_HINT}") from None
            if kind in ONE_SHOT and (duration is not None or value is not None):
                raise UserError(
                    f"--fault-injection {part!r}: {kind} happens once: no +DURATION or =VALUE"
                )
            if duration is not None and duration <= 0:
                raise UserError(f"--fault-injection {part!r}: DURATION must be > 0")
            if value is not None and kind not in DEFAULT_VALUE:
                raise UserError(f"--fault-injection {part!r}: {kind} takes no =VALUE")
            if value is not None and not 0 < value <= 1:
                raise UserError(f"--fault-injection {part!r}: VALUE must be in (0, 1]")
            if value is None and kind in DEFAULT_VALUE:
                value = DEFAULT_VALUE[kind]
            specs.append(FaultSpec(kind, m["channel"], start, duration, value, part))
    return specs


class FaultTarget(Protocol):
    """A channel faults can be injected into: its number, name and emulated chip (None for a
    real chip, which is refused)."""

    @property
    def index(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def emulator(self) -> EmulatedChip | None: ...


class AppliedFault(TypedDict):
    """One thing the injector did: which spec, when, and what (reset, on, off)."""

    spec: str
    t_mono_ns: int
    action: str


class FaultInjector:
    """Applies fault specs to emulated chips as the schedule's time passes.

    Call it with the current monotonic time before every sweep; actions whose time has come
    are applied once, in time order. ``applied`` lists what was done and when.
    """

    def __init__(self, specs: Sequence[FaultSpec], channels: Sequence[FaultTarget],
                 t0_mono_ns: int) -> None:
        self.specs = list(specs)
        self.applied: list[AppliedFault] = []
        actions: list[tuple[int, int, str, EmulatedChip, FaultSpec]] = []
        for order, spec in enumerate(self.specs):
            chip = self._chip(spec, channels)
            start = t0_mono_ns + round(spec.start_s * 1e9)
            if spec.kind == FaultKind.RESET:
                chip.schedule_reset(start)  # exact: the emulator resets at that instant
                self.applied.append({"spec": spec.text, "t_mono_ns": start, "action": "reset"})
                continue
            actions.append((start, order, "on", chip, spec))
            if spec.kind in SPANS and spec.duration_s is not None:
                end = start + round(spec.duration_s * 1e9)
                actions.append((end, order, "off", chip, spec))
        actions.sort(key=lambda a: (a[0], a[1]))
        self._actions = actions

    @staticmethod
    def _chip(spec: FaultSpec, channels: Sequence[FaultTarget]) -> EmulatedChip:
        for ch in channels:
            if spec.channel in (str(ch.index), ch.name):
                chip = ch.emulator
                if chip is None:
                    raise UserError(
                        f"--fault-injection {spec.text!r}: channel {ch.name} is a real chip; "
                        "faults are injected into emulated chips only (use --emulate)"
                    )
                return chip
        known = ", ".join(f"{c.index}={c.name}" for c in channels)
        raise UserError(
            f"--fault-injection {spec.text!r}: no channel {spec.channel!r} (channels: {known})"
        )

    def __call__(self, now_mono_ns: int) -> None:
        while self._actions and self._actions[0][0] <= now_mono_ns:
            _, _, what, chip, spec = self._actions.pop(0)
            self._apply(chip, spec, what)
            self.applied.append({"spec": spec.text, "t_mono_ns": now_mono_ns, "action": what})

    @staticmethod
    def _apply(chip: EmulatedChip, spec: FaultSpec, what: str) -> None:
        on = what == "on"
        if spec.kind == FaultKind.CHECKSUM:
            chip.corrupt_register("Lgain", 0x0001)
        elif spec.kind == FaultKind.ABSENT:
            chip.set_absent(on)
        elif spec.kind == FaultKind.STUCK:
            chip.set_stuck(0x1234 if on else None)
        elif spec.kind == FaultKind.BIT_ERRORS:
            rate = spec.value if on else 0.0
            chip.set_spi_faults(bit_error_rate=rate, mosi_bit_error_rate=rate)
        elif spec.kind == FaultKind.PARTIAL_FRAMES:
            chip.set_spi_faults(partial_frame_rate=spec.value if on else 0.0)

    def describe(self) -> list[JSON]:
        return [s.describe() for s in self.specs]
