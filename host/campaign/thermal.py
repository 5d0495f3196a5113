"""Thermal settle before each measured run: a fixed wait, or idle power stable on the meter.

The "stable" rule polls the meter's `/status` and keeps the readings (sum of all channels)
of the trailing `window_s`; the machine is settled when that window is full and every reading
lies within ±tolerance of the window's mean. After `timeout_s` the run goes ahead and the
record says it did not settle. Either way, what happened is returned for the journal. With
several meters every meter's own window must be stable (each in its own clock).
"""

from __future__ import annotations

import json
import math
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence

from host.campaign.journal import Settle
from host.campaign.study import ThermalRule, ThermalSpec


def _finite(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def total_power(status: object) -> tuple[int, float] | None:
    """(newest sample time ns, summed power W) of a /status snapshot, or None if no channel
    has a reading yet (or the snapshot is not the daemon's shape)."""
    chans = status.get("channels") if isinstance(status, dict) else None
    readings: list[tuple[int, float]] = []
    for c in chans if isinstance(chans, list) else []:
        last = c.get("last") if isinstance(c, dict) else None
        if not isinstance(last, dict):
            continue
        t, p = _finite(last.get("t_mono_ns")), _finite(last.get("power_w"))
        if t is not None and p is not None:
            readings.append((int(t), p))
    if not readings:
        return None
    return max(t for t, _ in readings), sum(p for _, p in readings)


def read_status(url: str) -> object:
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


def settle(spec: ThermalSpec, meter_url: str | Sequence[str] | None, *,
           status: Callable[[str], object] = read_status,
           sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.monotonic) -> Settle:
    """Wait by the rule; return {rule, waited_s, settled, ...} for the journal.

    Several meters (a URL list): each meter's readings form their own window in that meter's
    own clock, and the machine is settled when every window is stable at the same poll; the
    record gives the summed mean power and the largest deviation over the meters."""
    urls = ([meter_url] if isinstance(meter_url, str) else list(meter_url or []))
    t0 = clock()
    if spec.rule == ThermalRule.FIXED or not urls:
        sleep(spec.wait_s)
        return {"rule": ThermalRule.FIXED, "wait_s": spec.wait_s,
                "waited_s": round(clock() - t0, 3),
                "settled": True}
    windows: list[deque[tuple[int, float]]] = [deque() for _ in urls]
    last_t: list[int | None] = [None] * len(urls)
    devs = [float("nan")] * len(urls)
    while True:
        oks = []
        for k, url in enumerate(urls):
            try:
                reading = total_power(status(url))
            except OSError:
                reading = None
            window = windows[k]
            if reading is not None and reading[0] != last_t[k]:
                last_t[k] = reading[0]
                window.append(reading)
                while window and (reading[0] - window[0][0]) / 1e9 > spec.window_s:
                    window.popleft()
            ok, devs[k] = stable(list(window), spec)
            oks.append(ok)
        dev = max(devs) if all(d == d for d in devs) else float("nan")
        n = sum(len(w) for w in windows)
        if all(oks):
            mean = sum(sum(p for _, p in w) / len(w) for w in windows)
            return {"rule": ThermalRule.STABLE, "tolerance": spec.tolerance,
                    "window_s": spec.window_s, "waited_s": round(clock() - t0, 3),
                    "settled": True, "mean_power_w": round(mean, 4),
                    "max_deviation": round(dev, 5), "n_readings": n}
        if clock() - t0 >= spec.timeout_s:
            return {"rule": ThermalRule.STABLE, "tolerance": spec.tolerance,
                    "window_s": spec.window_s,
                    "waited_s": round(clock() - t0, 3), "settled": False,
                    "max_deviation": None if dev != dev else round(dev, 5),
                    "n_readings": n,
                    "reason": f"idle power not stable within ±{spec.tolerance:.1%} for "
                              f"{spec.window_s:g} s before the {spec.timeout_s:g} s timeout"
                              + (f" (meter {oks.index(False) + 1} of {len(urls)} not stable)"
                                 if len(urls) > 1 else "")}
        sleep(spec.poll_s)
