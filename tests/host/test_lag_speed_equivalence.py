"""estimate_lag's fast grid gives the results of the per-lag fits it replaced.

The independent reference is `_reference_estimate_lag` below: a verbatim copy of
host/analysis/lag.py's estimate_lag (and its helpers `_coverage`, `_design`, `_sse`) as it was
before the optimisation (commit 26594f1), which rebuilt the full design matrix and ran one
`np.linalg.lstsq` per lag of the grid. The cases cover the energy-counter and the point
(power readings) designs, fractional-ns windows, an invalid interval, a lag outside the
search range, a trace with no power step, segment starts, and too few samples / requests.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from host.analysis.align import ChannelSeries, Intervals
from host.analysis.intervals import student_t_ppf
from host.analysis.lag import METHOD, NS, POINT_METHOD, LagEstimate, estimate_lag

REL = 1e-9
GRID_MS = 0.25


# ----------------------------------------------------------------- reference (pre-issue-33 code)
def _coverage(t: np.ndarray, w0: np.ndarray, w1: np.ndarray) -> np.ndarray:
    lengths = (w1 - w0).astype(np.float64)
    cum = np.concatenate([[0.0], np.cumsum(lengths)])
    k = np.searchsorted(w0, t, side="right")
    last = np.maximum(k - 1, 0)
    partial = np.where(k > 0, np.minimum((t - w0[last]).astype(np.float64), lengths[last]), 0.0)
    return cum[np.maximum(k - 1, 0)] * (k > 0) + partial


def _disjoint(w0: np.ndarray, w1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(w0)
    return w0[order], w1[order]


def _design(t0, t1, lag_ns, windows, point):
    cols = [np.ones(len(t0))]
    for w0, w1 in windows:
        a, b = w0 + lag_ns, w1 + lag_ns
        if point:
            k = np.searchsorted(a, t0, side="right") - 1
            inside = (k >= 0) & (t0 < b[np.maximum(k, 0)])
            cols.append(inside.astype(np.float64))
        else:
            cov = _coverage(t1, a, b) - _coverage(t0, a, b)
            cols.append(cov / (t1 - t0))
    return np.column_stack(cols)


def _sse(y, x):
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    r = y - x @ beta
    return float(r @ r), beta


def _reference_estimate_lag(series, prefill, decode, *, max_lag_ms=300.0, level=0.95):
    nan = float("nan")
    n_req = len(prefill[0])

    def fail(reason, n=0, method=METHOD):
        return LagEstimate(series.channel, nan, nan, nan, n_req, n, nan, nan, nan, method,
                           reason)

    if n_req < 3:
        return fail(f"{n_req} requests: too few edges to estimate a lag (need ≥ 3)")
    windows = [_disjoint(np.asarray(prefill[0], np.float64), np.asarray(prefill[1], np.float64)),
               _disjoint(np.asarray(decode[0], np.float64), np.asarray(decode[1], np.float64))]
    margin = max_lag_ms * 1e6 + 2 * NS
    lo = min(float(w[0][0]) for w in windows) - margin
    hi = max(float(w[1][-1]) for w in windows) + margin
    i0 = max(int(np.searchsorted(series.t_mono_ns, lo, side="left")) - 1, 0)
    i1 = int(np.searchsorted(series.t_mono_ns, hi, side="right")) + 1
    t = series.t_mono_ns[i0:i1]
    e = None if series.energy_j is None else series.energy_j[i0:i1]
    point = e is None or not np.isfinite(e).any()
    if point:
        sel = (t >= lo) & (t <= hi)
        t0 = t[sel].astype(np.float64)
        t1 = t0
        y = series.power_w[i0:i1][sel]
        keep = np.isfinite(y)
        if len(series.invalid):
            keep &= series.invalid.overlapping(t[sel], t[sel]) < 0
    else:
        t0, t1 = t[:-1].astype(np.float64), t[1:].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            y = (e[1:] - e[:-1]) / ((t1 - t0) / NS)
        keep = (t0 >= lo) & (t1 <= hi) & np.isfinite(y) & (t1 > t0)
        starts = series.seg_start_idx
        new_seg = np.zeros(len(t), bool)
        new_seg[starts[(starts > i0) & (starts < i1)] - i0] = True
        keep &= ~new_seg[1:]
        for iv in (series.invalid, series.counter_invalid):
            if len(iv):
                keep &= iv.overlapping(t[:-1], t[1:]) < 0
    t0, t1, y = t0[keep], t1[keep], y[keep]
    method = POINT_METHOD if point else METHOD
    n = len(y)
    if n < 10:
        return fail(f"{n} usable sample intervals around the requests: too few", n, method)
    coarse = np.arange(-max_lag_ms, max_lag_ms + 1e-9, 5.0)
    s_coarse = np.array([_sse(y, _design(t0, t1, lag * 1e6, windows, point))[0]
                         for lag in coarse])
    best = coarse[int(np.argmin(s_coarse))]
    fine = np.arange(best - 7.5, best + 7.5 + 1e-9, GRID_MS)
    s_fine = np.array([_sse(y, _design(t0, t1, lag * 1e6, windows, point))[0] for lag in fine])
    grid = np.concatenate([coarse, fine])
    sse = np.concatenate([s_coarse, s_fine])
    order = np.argsort(grid)
    grid, sse = grid[order], sse[order]
    i_best = int(np.argmin(sse))
    lag_ms = float(grid[i_best])
    s_min, beta = _sse(y, _design(t0, t1, lag_ms * 1e6, windows, point))
    tq = student_t_ppf(0.5 + level / 2.0, n - 3)
    thr = s_min * (1.0 + tq * tq / (n - 3)) + 1e-18 * n
    inside = grid[sse <= thr]
    ci_lo, ci_hi = float(inside.min()) - GRID_MS, float(inside.max()) + GRID_MS
    reason = ""
    if ci_lo <= -max_lag_ms or ci_hi >= max_lag_ms:
        reason = f"lag not identified within ±{max_lag_ms:.0f} ms (edges too weak or too noisy)"
    if abs(beta[1]) < 1e-9 and abs(beta[2]) < 1e-9:
        reason = "no power step at the request edges: lag cannot be estimated"
    return LagEstimate(series.channel, lag_ms, ci_lo, ci_hi, n_req, n, float(beta[0]),
                       float(beta[1]), float(beta[2]), method, reason)


# ----------------------------------------------------------------- generated traces
def _case(seed: int, *, n_req: int = 12, dur_s: float = 240.0, hz: float = 20.0,
          lag_ms: float = 30.0, noise_w: float = 0.3, step: float = 1.0, counter: bool = True,
          fractional: bool = False, invalid: bool = False, segments: bool = False):
    """A trace whose power steps +9 W (prefill) and +5 W (decode, × `step`) `lag_ms` after the
    stamps, integrated exactly on a 1 ms grid; jittered sample times, counter/reading noise."""
    rng = np.random.default_rng(seed)
    n = int(dur_s * hz)
    base = 5_000 * NS + int(rng.integers(0, NS))
    t = np.sort(base + np.round(np.arange(n) * (NS / hz) + rng.normal(0, 2e6, n))
                .astype(np.int64))
    slots = np.arange(10, int(dur_s) - 30, 18)
    s = base + np.sort(rng.choice(slots, n_req, replace=False)).astype(np.int64) * NS
    s = s + rng.integers(0, NS // 2, n_req)
    f = s + rng.integers(NS // 2, 2 * NS, n_req)
    e = f + rng.integers(3 * NS, 12 * NS, n_req)
    sh = round(lag_ms * 1e6)
    grid = np.arange(t[0], t[-1] + 2_000_000, 1_000_000, dtype=np.int64)
    p = np.full(len(grid), 20.0)
    for a, b, c in zip(s + sh, f + sh, e + sh, strict=True):
        p[(grid >= a) & (grid < b)] += 9.0 * step
        p[(grid >= b) & (grid < c)] += 5.0 * step
    energy = np.interp(t, grid, np.concatenate([[0.0], np.cumsum(p[:-1] * 1e-3)]))
    energy = energy + rng.normal(0, 0.002, n)
    power = np.interp(t, grid, p) + rng.normal(0, noise_w, n)
    kw: dict = {}
    if invalid:
        mid = t[n // 2]
        kw["invalid"] = Intervals.build([mid], [mid + 3 * NS], ["dropout"])
    if segments:
        kw["seg_start_idx"] = np.array([0, n // 3], np.int64)
    series = ChannelSeries(0, t, power, energy if counter else None, **kw)
    if fractional:  # a clock conversion gives non-integer meter ns
        s, f, e = (x + rng.uniform(0, 1, n_req) for x in (s, f, e))
    return series, (s, f), (f, e)


CASES = {
    "counter": {"seed": 1},
    "counter-negative-lag": {"seed": 2, "lag_ms": -45.0},
    "counter-fractional-ns": {"seed": 3, "fractional": True, "lag_ms": 12.0},
    "counter-invalid-and-segments": {"seed": 4, "invalid": True, "segments": True},
    "counter-noisy": {"seed": 5, "noise_w": 3.0, "step": 0.05},
    "counter-lag-outside-range": {"seed": 6, "lag_ms": 420.0},
    "no-power-step": {"seed": 7, "step": 0.0},
    "points": {"seed": 8, "counter": False, "lag_ms": 60.0},
    "points-invalid": {"seed": 9, "counter": False, "invalid": True, "fractional": True},
    "two-requests": {"seed": 10, "n_req": 2},
}


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-9)


@pytest.mark.parametrize("name", list(CASES))
def test_estimate_lag_matches_the_per_lag_reference(name):
    series, pre, dec = _case(**CASES[name])
    want = _reference_estimate_lag(series, pre, dec)
    got = estimate_lag(series, pre, dec)
    assert got.reason == want.reason and got.method == want.method
    assert got.resolved == want.resolved
    assert (got.n_requests, got.n_intervals) == (want.n_requests, want.n_intervals)
    for field in ("lag_ms", "ci_lo_ms", "ci_hi_ms", "idle_w", "step_prefill_w",
                  "step_decode_w"):
        assert _close(getattr(got, field), getattr(want, field)), (
            field, getattr(got, field), getattr(want, field))


def test_short_window_of_data_matches_the_reference():
    """Few samples around the requests (the max_lag search range is as wide as the data)."""
    series, pre, dec = _case(11, n_req=4, dur_s=110.0, hz=2.0)
    want = _reference_estimate_lag(series, pre, dec, max_lag_ms=100.0)
    got = estimate_lag(series, pre, dec, max_lag_ms=100.0)
    assert (got.reason, got.resolved) == (want.reason, want.resolved)
    for field in ("lag_ms", "ci_lo_ms", "ci_hi_ms", "step_decode_w"):
        assert _close(getattr(got, field), getattr(want, field)), field
