"""A channel's measurement chain checking itself while it runs, pure.

Two independent paths of the ATM90E26 must agree: the energy **counter** (metering block: PL
constant, Lgain) and the **integral of Pmean** (measurement block: Ugain, Igain, offsets); and
each reading's P must equal U·I·PF. A wrong PL constant or Lgain moves the counter alone, a
wrong Ugain or Igain the integral alone, so comparing them over a sliding window shows either
within one window. The allowance is exactly what the register steps and the averaging allow:

* two energy counts (one at each end of the window);
* half a Pmean step (1/256 W with the LSB extension) for every second of the window;
* the power's change within the window times (metering cycle + sweep): Pmean is the mean of
  the last cycle, read once a sweep, so a load step is integrated late by up to that long;
* `rel_tol` of the energy: the two blocks' own calibration mismatch (0.5 % by default, the
  chip's measurement accuracy class [DS §3.5.1]; a qualified board can tighten it).

`ChainSelfCheck.add(...)` takes each accepted reading and returns a `Disagreement` on the
reading that starts one (once per episode, so an event stream stays small); `ratio` is the
gauge (|gap| / allowance: above 1 is a disagreement).

Where it runs: meter/daemon/sampler.py keeps one `ChainSelfCheck` per channel (afresh after a
gap or an unmetered interval) and feeds it each accepted reading; a returned `Disagreement`
becomes a `chain_disagreement` event, and the verdict and `ratio` the `/metrics` gauges
`epi_meter_chain_disagreement` and `epi_meter_chain_disagreement_ratio`; the analysis flags
windows whose event falls in them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

PMEAN_STEP_W = 1.0 / 256  # Pmean with the LSB extension [DS p.26]
DEFAULT_REL_TOL = 0.005  # measurement accuracy class of the chip [DS §3.5.1]
PUI_REL_TOL = 0.01  # P vs U·I·PF: the plausibility rule's tolerance (docs/atm90e26.md §7)
PUI_ABS_TOL_W = 0.05


@dataclass(frozen=True)
class SelfCheckConfig:
    joules_per_count: float
    window_s: float = 30.0
    refresh_s: float = 0.2  # the metering cycle (Pmean's averaging)
    sweep_s: float = 0.05
    rel_tol: float = DEFAULT_REL_TOL


@dataclass(frozen=True)
class Disagreement:
    kind: str  # "counter_vs_integral" or "p_vs_uipf"
    t_mono_ns: int
    counter_j: float
    integral_j: float
    allowance_j: float
    ratio: float
    detail: str


@dataclass(frozen=True)
class _Point:
    t_ns: int
    energy_j: float
    power_w: float
    uipf_w: float | None
    pui_bad: bool  # P differs from U·I·PF beyond the tolerance (False without U·I·PF)


class ChainSelfCheck:
    """The sliding-window check of one channel (module docstring).

    `add` costs O(1) amortised whatever the window holds (at 50 sweeps/s a 30 s window is
    1 500 readings a channel, on the daemon's sweep path): the integral, the count of P vs
    U·I·PF failures and the window's lowest and highest power (monotonic queues) are kept up
    to date as readings enter and leave, instead of recomputed over the window.
    """

    def __init__(self, cfg: SelfCheckConfig) -> None:
        self.cfg = cfg
        self.points: deque[_Point] = deque()
        self.integral_j = 0.0  # of the points in the window (rectangles, as read)
        self.ratio = 0.0
        self.active: set[str] = set()
        self._window_ns = int(cfg.window_s * 1e9)
        self._first = 0  # serial number of points[0]
        self._next = 0  # serial number of the next point
        self._n_uipf = 0  # points in the window with U·I·PF
        self._n_bad = 0  # of those, P beyond the tolerance
        self._lows: deque[tuple[int, float]] = deque()  # (serial, power), powers rising
        self._highs: deque[tuple[int, float]] = deque()  # (serial, power), powers falling

    def allowance_j(self, seconds: float, energy_j: float, p_min: float, p_max: float
                    ) -> float:
        c = self.cfg
        return (2 * c.joules_per_count + PMEAN_STEP_W / 2 * seconds
                + (p_max - p_min) * (c.refresh_s + c.sweep_s) + c.rel_tol * abs(energy_j))

    def _push(self, point: _Point) -> None:
        serial = self._next
        self._next += 1
        self.points.append(point)
        if point.uipf_w is not None:
            self._n_uipf += 1
            self._n_bad += point.pui_bad
        p = point.power_w
        while self._lows and self._lows[-1][1] >= p:
            self._lows.pop()
        self._lows.append((serial, p))
        while self._highs and self._highs[-1][1] <= p:
            self._highs.pop()
        self._highs.append((serial, p))

    def _pop(self) -> _Point:
        point = self.points.popleft()
        if point.uipf_w is not None:
            self._n_uipf -= 1
            self._n_bad -= point.pui_bad
        self._first += 1
        for extreme in (self._lows, self._highs):
            if extreme[0][0] < self._first:
                extreme.popleft()
        return point

    def add(self, t_mono_ns: int, energy_j: float, power_w: float,
            voltage_v: float | None = None, current_a: float | None = None,
            power_factor: float | None = None) -> Disagreement | None:
        uipf = None
        bad = False
        if voltage_v is not None and current_a is not None and power_factor is not None:
            uipf = voltage_v * current_a * power_factor
            bad = abs(power_w - uipf) - (PUI_REL_TOL * abs(uipf) + PUI_ABS_TOL_W) > 0
        if self.points:
            prev = self.points[-1]
            self.integral_j += power_w * (t_mono_ns - prev.t_ns) / 1e9
        self._push(_Point(t_mono_ns, energy_j, power_w, uipf, bad))
        window_ns = self._window_ns
        while len(self.points) > 2 and t_mono_ns - self.points[1].t_ns >= window_ns:
            first = self._pop()
            second = self.points[0]
            self.integral_j -= second.power_w * (second.t_ns - first.t_ns) / 1e9
        first = self.points[0]
        seconds = (t_mono_ns - first.t_ns) / 1e9
        if seconds < self.cfg.window_s * 0.999:
            return None
        counter = energy_j - first.energy_j
        allow = self.allowance_j(seconds, counter, self._lows[0][1], self._highs[0][1])
        gap = counter - self.integral_j
        self.ratio = abs(gap) / allow
        out = None
        if self._edge("counter_vs_integral", self.ratio > 1.0):
            out = Disagreement(
                "counter_vs_integral", t_mono_ns, counter, self.integral_j, allow, self.ratio,
                f"energy counter {counter:.3f} J vs integral of Pmean {self.integral_j:.3f} J "
                f"over {seconds:.0f} s: {gap:+.3f} J, allowed ±{allow:.3f} J (register steps, "
                f"averaging, {self.cfg.rel_tol:.1%}): check the PL constant, Lgain, Ugain, "
                f"Igain")
        n, n_bad = self._n_uipf, self._n_bad
        if self._edge("p_vs_uipf", n > 0 and n_bad > n // 2) and out is None:
            out = Disagreement(
                "p_vs_uipf", t_mono_ns, counter, self.integral_j, allow, self.ratio,
                f"P differs from U·I·PF beyond {PUI_REL_TOL:.0%} + {PUI_ABS_TOL_W} W in {n_bad} "
                f"of {n} readings: a power or current offset, or Igain")
        return out

    def _edge(self, kind: str, now_bad: bool) -> bool:
        """True when `kind` turns bad now (once per episode)."""
        if now_bad and kind not in self.active:
            self.active.add(kind)
            return True
        if not now_bad:
            self.active.discard(kind)
        return False
