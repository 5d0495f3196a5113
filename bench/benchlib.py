"""What every bench prints besides its own output: the machine, its load, and BENCH lines.

`machine_line()` states the machine and its load average at start (benchmarks on a shared
machine are only comparable with the load next to them); `emit()` prints one
`BENCH {json}` line per headline figure (the contract in bench/goals.py), with the number of
runs behind it and their spread; `summary()` gives median and spread of repeated runs.
`emit()` is the only BENCH printer of bench/; bench/run_all.py judges each line again with
`goals.met`, so the `met` in a line is informational.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import GOALS, met


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> dict[str, object]:
    """Machine facts stated with every figure."""
    load = os.getloadavg()
    return {"host": platform.node(), "machine": platform.machine(), "cpu": cpu_model(),
            "cores": os.cpu_count(), "load_avg_1m": round(load[0], 2),
            "load_avg_5m": round(load[1], 2)}


# The 1-minute load average when the bench printed its machine line (its start), stated on
# every BENCH line beside the load at the figure's end: a bench's own threads raise the latter.
_START_LOAD_1M: float | None = None


def machine_line(script: str) -> str:
    """`machine: ...` line a bench prints first; it also records the load at the start."""
    global _START_LOAD_1M
    m = machine()
    start = m["load_avg_1m"]
    _START_LOAD_1M = float(start) if isinstance(start, int | float) else None
    return (f"machine: {m['host']} {m['machine']}, {m['cpu']}, {m['cores']} cores; load average "
            f"at start {m['load_avg_1m']} (1 min), {m['load_avg_5m']} (5 min)  [{script}]")


def summary(values: Sequence[float]) -> tuple[float, list[float]]:
    """(median, [min, max]) of repeated measurements."""
    vals = [float(v) for v in values]
    return statistics.median(vals), [min(vals), max(vals)]


def emit(key: str, measured: float | None, runs: int, spread: Sequence[float] | None,
         note: str = "") -> dict[str, object]:
    """Print the BENCH line of figure `key` (goal and verdict from bench/goals.py)."""
    g = GOALS[key]
    line: dict[str, object] = {
        "figure": key, "goal": f"{g['op']} {g['goal']}", "measured": measured,
        "unit": g["unit"], "met": met(key, measured), "runs": runs,
        "spread": list(spread) if spread is not None else None,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if _START_LOAD_1M is not None:
        line["load_avg_1m_start"] = _START_LOAD_1M
    if note:
        line["note"] = note
    print("BENCH " + json.dumps(line), flush=True)
    return line
