"""Thermal settle before each measured run: a fixed wait, or idle power stable on the meter.

The "stable" rule polls the meter's `/status` and keeps the readings (sum of all channels)
of the trailing `window_s`; the machine is settled when that window is full and every reading
lies within ±tolerance of the window's mean. After `timeout_s` the run goes ahead and the
record says it did not settle. Either way, what happened is returned for the journal.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from typing import Any

from host.campaign.journal import Settle
from host.campaign.study import ThermalSpec


def total_power(status: dict[str, Any]) -> tuple[int, float] | None:
    """(newest sample time ns, summed power W) of a /status snapshot, or None if no channel
    has a reading yet."""
    lasts = [c.get("last") for c in status.get("channels", [])]
    lasts = [x for x in lasts if x and x.get("power_w") is not None]
    if not lasts:
        return None
    return max(int(x["t_mono_ns"]) for x in lasts), float(sum(x["power_w"] for x in lasts))


def read_status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=5) as resp:
        return json.loads(resp.read())


def stable(readings: list[tuple[int, float]], spec: ThermalSpec) -> tuple[bool, float]:
    """Whether the readings span the window and all lie within ±tolerance of their mean;
    also the largest relative deviation (NaN when there is nothing to judge)."""
    if len(readings) < 2:
        return False, float("nan")
    span_s = (readings[-1][0] - readings[0][0]) / 1e9
    powers = [p for _, p in readings]
    mean = sum(powers) / len(powers)
    if mean <= 0:
        return False, float("nan")
    dev = max(abs(p - mean) for p in powers) / mean
    return span_s >= spec.window_s * 0.95 and dev <= spec.tolerance, dev


def settle(spec: ThermalSpec, meter_url: str | None, *,
           status: Callable[[str], dict[str, Any]] = read_status,
           sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.monotonic) -> Settle:
    """Wait by the rule; return {rule, waited_s, settled, ...} for the journal."""
    t0 = clock()
    if spec.rule == "fixed" or meter_url is None:
        sleep(spec.wait_s)
        return {"rule": "fixed", "wait_s": spec.wait_s, "waited_s": round(clock() - t0, 3),
                "settled": True}
    window: deque[tuple[int, float]] = deque()
    last_t = None
    dev = float("nan")
    while True:
        try:
            reading = total_power(status(meter_url))
        except OSError:
            reading = None
        if reading is not None and reading[0] != last_t:
            last_t = reading[0]
            window.append(reading)
            while window and (reading[0] - window[0][0]) / 1e9 > spec.window_s:
                window.popleft()
            ok, dev = stable(list(window), spec)
            if ok:
                mean = sum(p for _, p in window) / len(window)
                return {"rule": "stable", "tolerance": spec.tolerance,
                        "window_s": spec.window_s, "waited_s": round(clock() - t0, 3),
                        "settled": True, "mean_power_w": round(mean, 4),
                        "max_deviation": round(dev, 5), "n_readings": len(window)}
        if clock() - t0 >= spec.timeout_s:
            return {"rule": "stable", "tolerance": spec.tolerance, "window_s": spec.window_s,
                    "waited_s": round(clock() - t0, 3), "settled": False,
                    "max_deviation": None if dev != dev else round(dev, 5),
                    "n_readings": len(window),
                    "reason": f"idle power not stable within ±{spec.tolerance:.1%} for "
                              f"{spec.window_s:g} s before the {spec.timeout_s:g} s timeout"}
        sleep(spec.poll_s)
