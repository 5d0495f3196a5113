"""Raspberry Pi 5 PMIC rails through ``vcgencmd pmic_read_adc``, summed into one channel.

The Pi 5's PMIC (DA9091) measures the current and voltage of its own output rails (core,
DDR, 3V3, 1V8, ...). ``vcgencmd pmic_read_adc`` prints lines such as
``VDD_CORE_A current(7)=2.06000000A`` and ``VDD_CORE_V volt(15)=0.72000000V``; every rail
with both a current and a voltage adds V × I to the board-rails power.

What it does **not** see: the PMIC rails are not the wall. The USB-C supply's losses, the
5 V input path, USB peripherals, the fan and the PMIC's own conversion losses are missing, so
board-rails power reads well below the wall meter. It is component power.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence

from epi.formats.trace import EventKind
from meter.sources.common import ChannelSpec, PowerSource, SourceError

COMMAND: tuple[str, ...] = ("vcgencmd", "pmic_read_adc")
_LINE_RE = re.compile(r"^\s*(\S+)_([AV])\s+(?:current|volt)\(\d+\)=([-+0-9.eE]+)[AV]\s*$")
PMIC_MIN_INTERVAL_S = 0.5  # vcgencmd is a process start (~10–30 ms) per reading
MEASURES = ("sum of V×I over the Raspberry Pi 5 PMIC's output rails (core, DDR, 3V3, 1V8, ...); "
            "NOT the wall: USB-C supply losses, the 5 V input path, USB devices, the fan and "
            "the PMIC's own losses are missing")

Runner = Callable[[Sequence[str]], str]


def run_command(argv: Sequence[str]) -> str:
    """Run argv (a list, never a shell string); stdout, or SourceError."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=5, check=False)
    except FileNotFoundError:
        raise SourceError(EventKind.READ_ERROR, f"{argv[0]}: not found",
                          "not a Raspberry Pi, or install raspi-utils (vcgencmd)") from None
    except subprocess.TimeoutExpired:
        raise SourceError(EventKind.READ_ERROR, f"{' '.join(argv)}: no answer in 5 s",
                          "the firmware mailbox is busy; check `vcgencmd version`") from None
    if done.returncode != 0:
        err = (done.stderr or done.stdout).strip().splitlines()
        msg = err[0] if err else f"exit status {done.returncode}"
        kind = EventKind.PERMISSION_DENIED if "denied" in msg.lower() else EventKind.READ_ERROR
        raise SourceError(kind, f"{' '.join(argv)}: {msg}",
                          "add the user to the video group (`sudo adduser $USER video`)"
                          if kind == EventKind.PERMISSION_DENIED else "check `vcgencmd version`")
    return done.stdout


def parse_rails(text: str) -> dict[str, float]:
    """Rail name → power W (V × I) for every rail with both readings in the output."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE_RE.match(line)
        if m:
            rail, unit, value = m.groups()
            (amps if unit == "A" else volts)[rail] = float(value)
    return {r: volts[r] * amps[r] for r in sorted(set(amps) & set(volts))}


class PmicSource(PowerSource):
    """One board-rails power channel: the sum over the PMIC rails."""

    kind = "pmic"
    min_interval_s = PMIC_MIN_INTERVAL_S

    def __init__(self, runner: Runner | None = None) -> None:
        if runner is None:
            if shutil.which(COMMAND[0]) is None:
                raise SourceError(EventKind.READ_ERROR, f"{COMMAND[0]}: not found",
                                  "not a Raspberry Pi 5, or install raspi-utils (vcgencmd)")
            runner = run_command
        self.runner = runner
        rails = parse_rails(self.runner(COMMAND))
        if not rails:
            raise SourceError(EventKind.READ_ERROR,
                              f"{' '.join(COMMAND)}: no rail with both a current and a voltage",
                              "pmic_read_adc needs a Raspberry Pi 5 firmware")
        self.rails = sorted(rails)
        self._spec = ChannelSpec(
            source="pmic", name="pmic:board-rails", scope="board_rails", counter="power",
            resolution_j=None, resolution_w=None, measures=MEASURES, path=" ".join(COMMAND),
            extra={"rails": list(self.rails)},
        )

    def channels(self) -> list[ChannelSpec]:
        return [self._spec]

    def read(self) -> list[float | SourceError]:
        try:
            rails = parse_rails(self.runner(COMMAND))
        except SourceError as err:
            return [err]
        missing = [r for r in self.rails if r not in rails]
        if missing:
            return [SourceError(EventKind.READ_ERROR,
                                f"{' '.join(COMMAND)}: rail(s) {', '.join(missing)} "
                                "missing from this reading", "check `vcgencmd pmic_read_adc`")]
        return [sum(rails[r] for r in self.rails)]
