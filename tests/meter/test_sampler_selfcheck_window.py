"""The chain self-check's running window: `ChainSelfCheck.add` keeps the window's
integral, lowest and highest power and P vs U·I·PF failures up to date as readings come and go
(O(1) a reading on the daemon's sweep path). Its verdicts must be exactly those of a
reference that recomputes everything from the window's readings at every step (the plain
definition in meter/driver/selfcheck.py's docstring), on generated load histories that step,
ramp, go negative, lose U·I·PF and drift off the counter."""

from __future__ import annotations

from collections import deque

from hypothesis import event, given, settings
from hypothesis import strategies as st

from meter.driver.selfcheck import (
    PUI_ABS_TOL_W,
    PUI_REL_TOL,
    ChainSelfCheck,
    SelfCheckConfig,
)

S = 1_000_000_000


class Reference:
    """Every figure recomputed over the window's readings at each step."""

    def __init__(self, cfg: SelfCheckConfig) -> None:
        self.cfg = cfg
        self.window: deque[tuple[int, float, float, float | None]] = deque()
        self.active: set[str] = set()

    def add(self, t: int, energy_j: float, power_w: float, uipf: float | None
            ) -> tuple[float | None, list[str], tuple[float, float, int, int] | None]:
        self.window.append((t, energy_j, power_w, uipf))
        w = self.window
        while len(w) > 2 and t - w[1][0] >= int(self.cfg.window_s * 1e9):
            w.popleft()
        seconds = (t - w[0][0]) / 1e9
        if seconds < self.cfg.window_s * 0.999:
            return None, [], None
        # the integral of Pmean as read: each reading's power over the time since the one before
        integral = sum(w[i][2] * (w[i][0] - w[i - 1][0]) / 1e9 for i in range(1, len(w)))
        counter = energy_j - w[0][1]
        powers = [p for _, _, p, _ in w]
        c = self.cfg
        allow = (2 * c.joules_per_count + 1 / 256 / 2 * seconds
                 + (max(powers) - min(powers)) * (c.refresh_s + c.sweep_s)
                 + c.rel_tol * abs(counter))
        ratio = abs(counter - integral) / allow
        with_uipf = [(p, u) for _, _, p, u in w if u is not None]
        bad = sum(abs(p - u) > PUI_REL_TOL * abs(u) + PUI_ABS_TOL_W for p, u in with_uipf)
        fired = []
        for kind, now_bad in (("counter_vs_integral", ratio > 1.0),
                              ("p_vs_uipf", bool(with_uipf) and bad > len(with_uipf) // 2)):
            if now_bad and kind not in self.active:
                fired.append(kind)
                self.active.add(kind)
            elif not now_bad:
                self.active.discard(kind)
        return ratio, fired, (min(powers), max(powers), bad, len(with_uipf))


step = st.tuples(
    st.integers(5, 120),  # ms since the last reading
    st.floats(-20.0, 60.0, allow_nan=False),  # Pmean
    st.floats(0.9, 1.1),  # counter's energy over the step / the power's
    st.one_of(st.none(), st.floats(0.95, 1.05)),  # U·I·PF / P (None: not read)
)


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=60, max_size=400), st.sampled_from([0.3, 1.0, 2.5]))
def test_running_window_gives_the_verdicts_of_a_full_recomputation(
    steps: list[tuple[int, float, float, float | None]], window_s: float
) -> None:
    cfg = SelfCheckConfig(joules_per_count=0.01, window_s=window_s, sweep_s=0.05)
    check, ref = ChainSelfCheck(cfg), Reference(cfg)
    t, energy = 5 * S, 0.0
    judged = 0
    for dt_ms, power, gain, uipf_ratio in steps:
        t += dt_ms * 1_000_000
        energy += abs(power) * gain * dt_ms / 1000
        uipf = None if uipf_ratio is None else power * uipf_ratio
        if uipf is None:
            d = check.add(t, energy, power)
        else:  # U·I·PF as the chip's three registers give it
            d = check.add(t, energy, power, 230.0, uipf / 230.0, 1.0)
            uipf = 230.0 * (uipf / 230.0) * 1.0
        ratio, fired, extremes = ref.add(t, energy, power, uipf)
        if ratio is None:
            assert d is None
            continue
        assert check.ratio == ratio or abs(check.ratio - ratio) <= 1e-9 * max(1.0, ratio)
        assert (d.kind if d else None) == (fired[0] if fired else None)
        assert check.active == ref.active
        assert extremes is not None
        judged += 1
        lo, hi, bad, n = extremes
        assert (check._lows[0][1], check._highs[0][1]) == (lo, hi)
        assert (check._n_bad, check._n_uipf) == (bad, n)
    event("full windows judged: " + ("none" if not judged else "some"))
    event("readings dropped from the window: " + ("none" if len(check.points) == len(steps)
                                                  else "some"))
