"""Load lag: how far the meter's power edges trail (or lead) the token stamps, from the trace.

The step edge model is exact only when power changes exactly at the token stamps. A lag L
between the stamps and the power (the meter's averaging, a slow supply, stamps taken late)
moves about |L| × step of energy across each edge: 30 ms at a 5 W step is 0.15 J, 2 % of a
0.8 s prefill at 9 W. Many requests give many edges, so L can be estimated from the trace
itself:

    y_i = P₀ + ΔP_prefill · f_prefill,i(L) + ΔP_decode · f_decode,i(L) + e_i

where y_i is the mean power of sample interval i from the energy counter (ΔE/Δt; the power
readings themselves, as points, when the trace has no counter) and f_·,i(L) the fraction of
that interval covered by the prefill / decode windows shifted by L. For each L the three powers
follow by least squares; L̂ minimises the residual sum of squares S(L), searched on a 5 ms grid
over ±`max_lag_ms` and refined on a 0.25 ms grid around the best point. Its interval is the
profile-likelihood one, {L : S(L) ≤ S(L̂)·(1 + t²(n − 3)/(n − 3))} (F-test with one parameter;
approximate: independent errors assumed). A lag is "resolved" when that interval excludes 0.

The grid's fits share their work (`_GridFit`): sample intervals far from every edge have the
same design row at every lag and are reduced once, so each lag refits only the rows near an
edge; S(L) is that of the per-lag least squares (tests/host/test_lag_speed_equivalence.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from host.analysis.align import ChannelSeries
from host.analysis.intervals import student_t_ppf

NS = 1_000_000_000
GRID_MS = 0.25
METHOD = ("profile least squares over sample intervals: mean power (energy counter) on "
          "prefill/decode coverage shifted by L; approximate 95 % profile interval")
POINT_METHOD = METHOD.replace("mean power (energy counter)", "power readings as points")


@dataclass(frozen=True)
class LagEstimate:
    channel: int
    lag_ms: float
    ci_lo_ms: float
    ci_hi_ms: float
    n_requests: int
    n_intervals: int
    idle_w: float
    step_prefill_w: float  # prefill power above the baseline
    step_decode_w: float  # decode power above the baseline
    method: str
    reason: str = ""

    @property
    def resolved(self) -> bool:
        """The interval excludes 0: the trace shows a lag."""
        return bool(np.isfinite(self.ci_lo_ms) and (self.ci_lo_ms > 0 or self.ci_hi_ms < 0))

    def phase_error_j(self, phase: str) -> float:
        """|L| × the steps at the phase's two edges: the energy a lag moves across them."""
        if not np.isfinite(self.lag_ms):
            return float("nan")
        pre, dec = self.step_prefill_w, self.step_decode_w
        steps = {"prefill": abs(pre) + abs(dec - pre), "decode": abs(dec - pre) + abs(dec),
                 "request": abs(pre) + abs(dec)}[phase]
        return abs(self.lag_ms) / 1e3 * steps


def _coverage(t: np.ndarray, w0: np.ndarray, w1: np.ndarray) -> np.ndarray:
    """Total length (ns, float) of the sorted disjoint windows [w0, w1) before each time t."""
    lengths = (w1 - w0).astype(np.float64)
    cum = np.concatenate([[0.0], np.cumsum(lengths)])
    k = np.searchsorted(w0, t, side="right")  # windows started by t
    last = np.maximum(k - 1, 0)
    partial = np.where(k > 0, np.minimum((t - w0[last]).astype(np.float64), lengths[last]), 0.0)
    return cum[np.maximum(k - 1, 0)] * (k > 0) + partial


def _disjoint(w0: np.ndarray, w1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(w0)
    return w0[order], w1[order]


def _design(t0: np.ndarray, t1: np.ndarray, lag_ns: float, windows: list[tuple], point: bool
            ) -> np.ndarray:
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


def _sse(y: np.ndarray, x: np.ndarray) -> tuple[float, np.ndarray]:
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    r = y - x @ beta
    return float(r @ r), beta


# Elements (lags × intervals) of one block of the vectorised grid: bounds its memory (~50 MB)
# whatever the run's length.
_BLOCK_ELEMENTS = 1 << 21


@dataclass(frozen=True)
class _Windows:
    """One phase's sorted windows and what does not depend on the lag, built once per channel:
    shifting the windows by L equals shifting the sample times by −L (exact for integer ns)."""

    w0: np.ndarray
    w1: np.ndarray
    lengths: np.ndarray  # w1 − w0 (ns, float)
    cum: np.ndarray  # total length of the windows before each one, then the total

    @classmethod
    def of(cls, w0: np.ndarray, w1: np.ndarray) -> _Windows:
        lengths = (w1 - w0).astype(np.float64)
        return cls(w0, w1, lengths, np.concatenate([[0.0], np.cumsum(lengths)]))

    def coverage(self, t: np.ndarray) -> np.ndarray:
        """`_coverage(t, w0, w1)` for an array of times of any shape."""
        k = np.searchsorted(self.w0, t, side="right")
        last = np.maximum(k - 1, 0)
        partial = np.where(k > 0, np.minimum(t - self.w0[last], self.lengths[last]), 0.0)
        return self.cum[last] * (k > 0) + partial

    def inside(self, t: np.ndarray) -> np.ndarray:
        """1.0 where t lies in a window, else 0.0 (the point design's column)."""
        k = np.searchsorted(self.w0, t, side="right") - 1
        return ((k >= 0) & (t < self.w1[np.maximum(k, 0)])).astype(np.float64)


def _columns(t0: np.ndarray, t1: np.ndarray, lag_ns: np.ndarray, windows: list[_Windows],
             point: bool) -> np.ndarray:
    """`_design`'s matrices for a column of lags (ns) at once: shape (lags, intervals, 3)."""
    x = np.empty((lag_ns.shape[0], len(t0), 1 + len(windows)))
    x[:, :, 0] = 1.0
    s0 = t0[None, :] - lag_ns
    if point:
        for c, w in enumerate(windows, 1):
            x[:, :, c] = w.inside(s0)
    else:
        s1 = t1[None, :] - lag_ns
        for c, w in enumerate(windows, 1):
            x[:, :, c] = (w.coverage(s1) - w.coverage(s0)) / (t1 - t0)
    return x


class _GridFit:
    """S(L) for lags of the grid, as `_sse(y, _design(...))[0]` gives them, without one full
    fit per lag.

    Rows (sample intervals) with no window edge within reach of them for any lag in
    [lo_ms, hi_ms] have the same design row at every lag: they are reduced once to a QR factor
    R and the residual r₀ outside its span, since ‖Cβ − y_c‖² = ‖Rβ − Qᵀy_c‖² + r₀ exactly.
    Only the rows near an edge are rebuilt per lag, for a block of lags at once, and each small
    stacked problem is solved by one batched SVD with `lstsq`'s default rank cut-off (so a
    degenerate design, e.g. windows outside the data, gives the same S). Lags whose designs are
    identical (common for point readings: S is a step function of L) get the very same S, as
    the per-lag fits gave them, so ties in the grid's argmin break the same way.
    """

    def __init__(self, y: np.ndarray, t0: np.ndarray, t1: np.ndarray,
                 windows: list[_Windows], point: bool, lo_ms: float, hi_ms: float) -> None:
        lo_ns, hi_ns = lo_ms * 1e6, hi_ms * 1e6
        edges = np.sort(np.concatenate([np.concatenate([w.w0, w.w1]) for w in windows]))
        # an edge e + L can fall in [t0, t1] for some L (1 ns spare: closed ends, rounding)
        near = (np.searchsorted(edges, t1 - lo_ns + 1.0, side="right")
                > np.searchsorted(edges, t0 - hi_ns - 1.0, side="left"))
        far = ~near
        self.k = 1 + len(windows)
        self.n = len(y)
        self.windows, self.point = windows, point
        if far.any():
            xc = _columns(t0[far], t1[far], np.array([[lo_ns]]), windows, point)[0]
            q, self.r_fac = np.linalg.qr(xc)
            qy = q.T @ y[far]
            res = y[far] - q @ qy
            self.r0 = float(res @ res)
        else:
            self.r_fac, qy, self.r0 = np.zeros((0, self.k)), np.zeros(0), 0.0
        self.t0n, self.t1n = t0[near], t1[near]
        self.b = np.concatenate([qy, y[near]])
        self.cache: dict[bytes, float] = {}  # digest of a near-edge design → S

    def sse(self, lags_ms: np.ndarray) -> np.ndarray:
        out = np.empty(len(lags_ms))
        block = max(1, _BLOCK_ELEMENTS // max(len(self.b), 1))
        rows = len(self.r_fac)
        for j in range(0, len(lags_ms), block):
            lag_ns = (lags_ms[j:j + block] * 1e6)[:, None]
            cols = _columns(self.t0n, self.t1n, lag_ns, self.windows, self.point)
            # a digest, not the bytes: a long run's near-edge design is megabytes per lag
            keys = [hashlib.blake2b(c.tobytes(), digest_size=20).digest() for c in cols]
            first: dict[bytes, int] = {}
            for i, key in enumerate(keys):
                if key not in self.cache:
                    first.setdefault(key, i)
            if first:
                pick = np.fromiter(first.values(), np.int64, len(first))
                x = np.concatenate([np.broadcast_to(self.r_fac, (len(pick), rows, self.k)),
                                    cols[pick]], axis=1)
                u, sv, _ = np.linalg.svd(x, full_matrices=False)
                rank_ok = sv > np.finfo(np.float64).eps * max(self.n, self.k) * sv[:, :1]
                coef = np.einsum("mnk,n->mk", u, self.b) * rank_ok
                r = self.b[None, :] - np.einsum("mnk,mk->mn", u, coef)
                s_new = self.r0 + np.einsum("mn,mn->m", r, r)
                self.cache.update(zip(first, map(float, s_new), strict=True))
            out[j:j + block] = [self.cache[key] for key in keys]
        return out


def estimate_lag(series: ChannelSeries, prefill: tuple[np.ndarray, np.ndarray],
                 decode: tuple[np.ndarray, np.ndarray], *, max_lag_ms: float = 300.0,
                 level: float = 0.95) -> LagEstimate:
    """Lag of one channel's power edges behind the prefill/decode stamps (meter clock, ns)."""
    nan = float("nan")
    n_req = len(prefill[0])

    def fail(reason: str, n: int = 0, method: str = METHOD) -> LagEstimate:
        return LagEstimate(series.channel, nan, nan, nan, n_req, n, nan, nan, nan, method,
                           reason)

    if n_req < 3:
        return fail(f"{n_req} requests: too few edges to estimate a lag (need ≥ 3)")
    windows = [_disjoint(np.asarray(prefill[0], np.float64), np.asarray(prefill[1], np.float64)),
               _disjoint(np.asarray(decode[0], np.float64), np.asarray(decode[1], np.float64))]
    margin = max_lag_ms * 1e6 + 2 * NS
    lo = min(float(w[0][0]) for w in windows) - margin
    hi = max(float(w[1][-1]) for w in windows) + margin
    # Only the samples around the requests (one more each side): a study's series holds days.
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
        assert e is not None  # not `point`: the counter has finite values
        t0, t1 = t[:-1].astype(np.float64), t[1:].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            y = (e[1:] - e[:-1]) / ((t1 - t0) / NS)
        keep = (t0 >= lo) & (t1 <= hi) & np.isfinite(y) & (t1 > t0)
        starts = series.seg_start_idx
        new_seg = np.zeros(len(t), bool)  # a segment starts at this sample
        new_seg[starts[(starts > i0) & (starts < i1)] - i0] = True
        keep &= ~new_seg[1:]  # both ends in the same segment
        for iv in (series.invalid, series.counter_invalid):
            if len(iv):
                keep &= iv.overlapping(t[:-1], t[1:]) < 0
    t0, t1, y = t0[keep], t1[keep], y[keep]
    method = POINT_METHOD if point else METHOD
    n = len(y)
    if n < 10:
        return fail(f"{n} usable sample intervals around the requests: too few", n, method)
    shifted = [_Windows.of(w0, w1) for w0, w1 in windows]  # once per run and channel
    fit = _GridFit(y, t0, t1, shifted, point, -max_lag_ms - 7.5, max_lag_ms + 7.5)
    coarse = np.arange(-max_lag_ms, max_lag_ms + 1e-9, 5.0)
    s_coarse = fit.sse(coarse)
    best = coarse[int(np.argmin(s_coarse))]
    fine = np.arange(best - 7.5, best + 7.5 + 1e-9, GRID_MS)
    s_fine = fit.sse(fine)
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
    # the grid's resolution (0.25 ms near the best point) bounds what the data can say
    ci_lo, ci_hi = float(inside.min()) - GRID_MS, float(inside.max()) + GRID_MS
    reason = ""
    if ci_lo <= -max_lag_ms or ci_hi >= max_lag_ms:
        reason = f"lag not identified within ±{max_lag_ms:.0f} ms (edges too weak or too noisy)"
    if abs(beta[1]) < 1e-9 and abs(beta[2]) < 1e-9:
        reason = "no power step at the request edges: lag cannot be estimated"
    return LagEstimate(series.channel, lag_ms, ci_lo, ci_hi, n_req, n, float(beta[0]),
                       float(beta[1]), float(beta[2]), method, reason)


def request_edges(run_requests: pd.DataFrame, to_meter: Callable[[np.ndarray], np.ndarray]
                  ) -> tuple[tuple[np.ndarray, np.ndarray],
                                                  tuple[np.ndarray, np.ndarray]]:
    """Prefill and decode windows (meter ns) of every request with tokens, warm-ups included
    (they draw power like any request, so leaving them out would bias the baseline)."""
    rq = run_requests.dropna(subset=["t_first_token_mono_ns", "t_end_mono_ns"])
    s = to_meter(rq["t_start_mono_ns"].to_numpy(np.int64))
    f = to_meter(rq["t_first_token_mono_ns"].to_numpy(np.int64))
    e = to_meter(rq["t_end_mono_ns"].to_numpy(np.int64))
    return (s, f), (f, e)


def lag_row(run_id: str, config: str, est: LagEstimate, applied_ms: float) -> dict:
    """One row of the lag table (lag.csv / results.json `load_lag`)."""
    return {"run_id": run_id, "config": config, "channel": est.channel, "lag_ms": est.lag_ms,
            "lag_ci_lo_ms": est.ci_lo_ms, "lag_ci_hi_ms": est.ci_hi_ms,
            "resolved": est.resolved, "n_requests": est.n_requests,
            "n_intervals": est.n_intervals, "baseline_w": est.idle_w,
            "step_prefill_w": est.step_prefill_w, "step_decode_w": est.step_decode_w,
            "correction_applied_ms": applied_ms, "method": est.method, "reason": est.reason}
