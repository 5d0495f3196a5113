"""Read `perf stat -x,` output (perf's CSV mode) into epi's counter names.

For a node where counts were taken with the `perf` tool instead of the runner (an RPC worker's
machine, or a check of the runner's own counters): `perf stat -x, -e EVENTS -p PID` prints one
line per event, `value,unit,event,run_time_ns,percent_running,metric,metric_unit`, with
`<not supported>` or `<not counted>` in place of a value the kernel could not give. Raw Arm
PMU events (`r13`) and their named forms (`armv8_pmuv3_0/mem_access/`, `mem_access`) map to the
runner's names (host/run/perf_counters.py CORTEX_A76_EVENTS).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from epi.core.errors import UserError
from host.run.perf_counters import CORTEX_A76_EVENTS, SOFTWARE_EVENTS

_RAW = {e.config: e.name for e in CORTEX_A76_EVENTS}  # raw event number → name
_RAW_TEXT = re.compile(r"^r([0-9a-f]+)$")
_KNOWN = {e.name for e in (*SOFTWARE_EVENTS, *CORTEX_A76_EVENTS)}
_PMU_NAME = re.compile(r"^[a-z0-9_]+/([a-z0-9_]+)/[a-z]*$")


@dataclass(frozen=True)
class PerfStatCount:
    event: str  # epi's name (the raw or PMU-qualified form mapped), else perf's as printed
    value: float | None  # None: not supported or not counted here
    unit: str
    running_pct: float | None  # the share of the time the counter ran (multiplexing)
    reason: str = ""  # "<not supported>" / "<not counted>"


def event_name(text: str) -> str:
    """perf's spelling of an event → the runner's name where it is one of its events."""
    text = text.strip().removesuffix(":u").removesuffix(":k")
    m = _PMU_NAME.match(text)
    if m:
        text = m.group(1)
    raw = _RAW_TEXT.match(text.lower())
    return _RAW.get(int(raw.group(1), 16), text) if raw else text


def parse_perf_stat(text: str, where: str = "perf stat output") -> list[PerfStatCount]:
    """Every counter line of `perf stat -x,` output (comments and blank lines skipped)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split(",")
        if len(cells) < 3:
            raise UserError(f"{where}: line {n}: expected 'value,unit,event,…' (perf stat -x,), "
                            f"got {line[:60]!r}")
        raw, unit, event = cells[0].strip(), cells[1].strip(), event_name(cells[2])
        pct = None
        if len(cells) > 4 and cells[4].strip():
            try:
                pct = float(cells[4])
            except ValueError:
                raise UserError(f"{where}: line {n}: percent running {cells[4][:20]!r} is not "
                                "a number") from None
        if raw.startswith("<"):
            out.append(PerfStatCount(event, None, unit, pct, raw))
            continue
        try:
            value = float(raw)
        except ValueError:
            raise UserError(f"{where}: line {n}: value {raw[:20]!r} is not a number") from None
        if unit == "msec":  # task-clock: perf prints milliseconds, the runner counts ns
            value, unit = value * 1e6, "ns"
        out.append(PerfStatCount(event, value, unit, pct))
    return out


def known_counts(counts: list[PerfStatCount]) -> dict[str, float]:
    """The counted values of the runner's own events, by its names."""
    return {c.event: c.value for c in counts if c.value is not None and c.event in _KNOWN}
