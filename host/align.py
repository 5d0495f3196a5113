"""The aligner: token-log times into the meter clock, and exact energy over many windows at once.

Two jobs, both pure numpy so notebooks and the benchmark can call them without pandas:

* `ClockMap` maps inference-host monotonic times to meter monotonic times with the offsets the
  token log recorded (`offset_ns = meter − local`), interpolating drift linearly between sync
  points. Runs without a usable offset are flagged (`basis == "none"`), never assumed zero; the
  one exception is a run whose host shares the meter's boot id (same machine, one monotonic
  clock), which is labelled `basis == "same_host"`.
* `window_energy` integrates a channel's power over any number of windows in one pass:
  trapezoid of the piecewise-linear power with the window edges interpolated (no extrapolation
  beyond the trace), plus the counter-based energy from the cumulative `energy_j` column where the
  window lies within one segment, and the difference between the two. Windows crossing an
  invalid interval (fault, gap, bad status) or holding fewer than 2 samples get NaN with a reason.

Why chunked: the running integral is built chunk by chunk (a Python loop over ~64 K-sample chunks,
never over samples or windows) so the temporaries stay in cache and no full-length cumulative
array is allocated; the value of the running integral is only gathered at the window edges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

NS_PER_S = 1_000_000_000
INT64_MIN = np.iinfo(np.int64).min
INT64_MAX = np.iinfo(np.int64).max
DEFAULT_CHUNK = 1 << 16


# --------------------------------------------------------------------------- invalid intervals
@dataclass(frozen=True)
class Intervals:
    """Open time intervals (start_ns, end_ns) with no valid data, each with a reason.

    A window [t0, t1] is invalid when it overlaps any interval: t0 < end and t1 > start.
    """

    start_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    end_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    reason: np.ndarray = field(default_factory=lambda: np.empty(0, object))

    def __len__(self) -> int:
        return len(self.start_ns)

    @staticmethod
    def build(
        start_ns: Sequence[int] | np.ndarray,
        end_ns: Sequence[int] | np.ndarray,
        reason: Sequence[str] | np.ndarray,
    ) -> Intervals:
        """Sort and merge overlapping intervals (vectorised); merged reasons are joined."""
        start = np.asarray(start_ns, dtype=np.int64)
        end = np.asarray(end_ns, dtype=np.int64)
        why = np.asarray(reason, dtype=object)
        if len(start) == 0:
            return Intervals()
        order = np.argsort(start, kind="stable")
        start, end, why = start[order], end[order], why[order]
        run_end = np.maximum.accumulate(end)
        new_group = np.ones(len(start), dtype=bool)
        new_group[1:] = start[1:] >= run_end[:-1]
        first = np.flatnonzero(new_group)
        last = np.append(first[1:], len(start)) - 1
        reasons = np.empty(len(first), dtype=object)
        for g, (lo, hi) in enumerate(zip(first, last + 1, strict=True)):  # per merged interval
            uniq = list(dict.fromkeys(why[lo:hi]))
            reasons[g] = "; ".join(uniq[:3]) + (f"; +{len(uniq) - 3} more" if len(uniq) > 3 else "")
        return Intervals(start[first], run_end[last], reasons)

    def union(self, other: Intervals) -> Intervals:
        return Intervals.build(
            np.concatenate([self.start_ns, other.start_ns]),
            np.concatenate([self.end_ns, other.end_ns]),
            np.concatenate([self.reason, other.reason]),
        )

    def overlapping(self, t0_ns: np.ndarray, t1_ns: np.ndarray) -> np.ndarray:
        """Index of an interval each window overlaps, or −1 (intervals must be merged)."""
        out = np.full(len(t0_ns), -1, dtype=np.int64)
        if len(self) == 0:
            return out
        # First interval whose end is after t0; overlap iff it also starts before t1.
        idx = np.searchsorted(self.end_ns, t0_ns, side="right")
        inside = idx < len(self)
        hit = inside.copy()
        hit[inside] = self.start_ns[idx[inside]] < t1_ns[inside]
        out[hit] = idx[hit]
        return out


# --------------------------------------------------------------------------- channel series
@dataclass(frozen=True)
class ChannelSeries:
    """One channel's readings in one meter clock domain, joined over segments.

    `t_mono_ns` strictly increasing; `energy_j` cumulative since its segment's start;
    `seg_start_idx[i]` is the first sample index of the i-th segment present; `invalid` holds
    intervals where power (and counter) data are not valid, `counter_invalid` those where only the
    counter is not (e.g. the chip's energy metering was frozen by a CalErr status).
    """

    channel: int
    t_mono_ns: np.ndarray
    power_w: np.ndarray
    energy_j: np.ndarray | None = None
    seg_start_idx: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    invalid: Intervals = field(default_factory=Intervals)
    counter_invalid: Intervals = field(default_factory=Intervals)
    counter_resolution_j: float = float("nan")


# --------------------------------------------------------------------------- energy
def _running_integral_at(
    t_ns: np.ndarray, power_w: np.ndarray, idx: np.ndarray, chunk: int
) -> np.ndarray:
    """2·∫P dt (W·ns) from t[0] to t[idx] for each index, built chunk by chunk.

    The factor 0.5e-9 (trapezoid ½, ns → s) is applied by the caller to the few gathered values.
    """
    n = len(t_ns)
    out = np.zeros(len(idx), dtype=np.float64)
    if n < 2 or len(idx) == 0:
        return out
    order = np.argsort(idx, kind="stable")
    ks = idx[order]
    vals = np.empty(len(ks), dtype=np.float64)
    starts = np.arange(0, n - 1, chunk, dtype=np.int64)
    bounds = np.searchsorted(ks, starts, side="left")
    bounds = np.append(bounds, np.searchsorted(ks, n - 1, side="left"))
    buf = np.empty(chunk + 1, dtype=np.float64)
    dbuf = np.empty(chunk, dtype=np.int64)
    running = 0.0
    for ci, s in enumerate(starts):  # loop over chunks of samples, not samples or windows
        e = min(int(s) + chunk, n - 1)
        m = e - int(s)
        lo, hi = bounds[ci], bounds[ci + 1]
        seg = buf[1 : m + 1]
        np.add(power_w[s + 1 : e + 1], power_w[s:e], out=seg)
        np.subtract(t_ns[s + 1 : e + 1], t_ns[s:e], out=dbuf[:m])
        np.multiply(seg, dbuf[:m], out=seg)
        np.cumsum(seg, out=seg)
        if hi > lo:
            buf[0] = 0.0
            vals[lo:hi] = running + buf[ks[lo:hi] - s]
        running += float(seg[-1])
    vals[bounds[-1] :] = running  # indices n−1 (the last sample)
    out[order] = vals
    return out


def _edge_index(t_ns: np.ndarray, x_ns: np.ndarray) -> np.ndarray:
    """Index of the last sample at or before each x (−1 when x precedes the trace)."""
    return np.searchsorted(t_ns, x_ns, side="right") - 1


def _interp_at(
    t_ns: np.ndarray, y: np.ndarray, k: np.ndarray, x_ns: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Linear interpolation of y at x given k = last index ≤ x (k valid); also returns x−t[k]."""
    n = len(t_ns)
    k1 = np.minimum(k + 1, n - 1)
    tk = t_ns[k]
    dx = x_ns - tk
    span = t_ns[k1] - tk
    frac = np.divide(dx, span, out=np.zeros(len(k), dtype=np.float64), where=span > 0)
    yk = y[k]
    return yk + (y[k1] - yk) * frac, dx


def trapezoid_energy_j(
    t_ns: np.ndarray,
    power_w: np.ndarray,
    t0_ns: np.ndarray,
    t1_ns: np.ndarray,
    *,
    chunk: int = DEFAULT_CHUNK,
) -> np.ndarray:
    """Exact integral (J) of the piecewise-linear power over each window [t0, t1].

    Edges are interpolated between the bracketing samples; windows reaching outside
    [t[0], t[-1]] get NaN (no extrapolation). Vectorised: one chunked pass over the samples plus
    searchsorted/gathers over the window edges.
    """
    t0 = np.asarray(t0_ns, dtype=np.int64)
    t1 = np.asarray(t1_ns, dtype=np.int64)
    n = len(t_ns)
    out = np.full(len(t0), np.nan)
    if n == 0 or len(t0) == 0:
        return out
    ok = (t0 >= t_ns[0]) & (t1 <= t_ns[-1]) & (t1 >= t0)
    edges = np.concatenate([t0[ok], t1[ok]])
    k = _edge_index(t_ns, edges)
    cum = _running_integral_at(t_ns, power_w, k, chunk)
    p_x, dx = _interp_at(t_ns, power_w, k, edges)
    f = cum + (power_w[k] + p_x) * dx  # 2·∫ from t[0] to x, W·ns
    m = int(ok.sum())
    out[ok] = (f[m:] - f[:m]) * (0.5 / NS_PER_S)
    return out


def counter_energy_j(
    t_ns: np.ndarray, energy_j: np.ndarray, t0_ns: np.ndarray, t1_ns: np.ndarray
) -> np.ndarray:
    """Energy from the cumulative counter, linearly interpolated at the edges (NaN outside)."""
    t0 = np.asarray(t0_ns, dtype=np.int64)
    t1 = np.asarray(t1_ns, dtype=np.int64)
    out = np.full(len(t0), np.nan)
    if len(t_ns) == 0 or len(t0) == 0:
        return out
    ok = (t0 >= t_ns[0]) & (t1 <= t_ns[-1]) & (t1 >= t0)
    e0, _ = _interp_at(t_ns, energy_j, _edge_index(t_ns, t0[ok]), t0[ok])
    e1, _ = _interp_at(t_ns, energy_j, _edge_index(t_ns, t1[ok]), t1[ok])
    out[ok] = e1 - e0
    return out


@dataclass(frozen=True)
class WindowEnergy:
    """Per-window results of one channel (arrays aligned with the windows given).

    `energy_j` is the trapezoid figure (the primary one); `energy_counter_j` the counter-based one
    (NaN where the counter does not cover the window); `reason` / `counter_reason` say why a value
    is NaN ("" when it is not).
    """

    energy_j: np.ndarray
    energy_counter_j: np.ndarray
    n_samples: np.ndarray
    reason: np.ndarray
    counter_reason: np.ndarray

    @property
    def counter_minus_trapezoid_j(self) -> np.ndarray:
        return self.energy_counter_j - self.energy_j


def _set_reason(reason: np.ndarray, mask: np.ndarray, text: str | np.ndarray) -> None:
    """Fill `reason` where mask is set and no earlier reason was given."""
    free = mask & (reason == "")
    if isinstance(text, np.ndarray):
        reason[free] = text[free]
    else:
        reason[free] = text


def window_energy(
    series: ChannelSeries,
    t0_ns: np.ndarray,
    t1_ns: np.ndarray,
    *,
    min_samples: int = 2,
    chunk: int = DEFAULT_CHUNK,
) -> WindowEnergy:
    """Energy of one channel over every window [t0, t1] (meter clock), with reasons for NaNs."""
    t0 = np.asarray(t0_ns, dtype=np.int64)
    t1 = np.asarray(t1_ns, dtype=np.int64)
    t = series.t_mono_ns
    n_win = len(t0)
    reason = np.full(n_win, "", dtype=object)
    if len(t) == 0:
        reason[:] = f"channel {series.channel}: no samples"
        nan = np.full(n_win, np.nan)
        return WindowEnergy(nan, nan.copy(), np.zeros(n_win, np.int64), reason, reason.copy())
    n_samples = np.searchsorted(t, t1, side="right") - np.searchsorted(t, t0, side="left")
    _set_reason(reason, t1 < t0, "window ends before it starts")
    outside = (t0 < t[0]) | (t1 > t[-1])
    _set_reason(reason, outside, "window reaches outside the trace (no extrapolation)")
    hit = series.invalid.overlapping(t0, t1)
    if len(series.invalid):
        texts = np.where(hit >= 0, series.invalid.reason[np.maximum(hit, 0)], "")
        _set_reason(reason, hit >= 0, np.asarray(texts, dtype=object))
    _set_reason(reason, n_samples < min_samples,
                f"fewer than {min_samples} samples in window (see n_samples)")
    energy = trapezoid_energy_j(t, series.power_w, t0, t1, chunk=chunk)
    energy[reason != ""] = np.nan

    counter_reason = reason.copy()
    if series.energy_j is None:
        counter = np.full(n_win, np.nan)
        _set_reason(counter_reason, np.ones(n_win, bool), "no energy_j counter")
    else:
        seg_a = np.searchsorted(series.seg_start_idx, np.maximum(_edge_index(t, t0), 0), "right")
        seg_b = np.searchsorted(
            series.seg_start_idx, np.minimum(np.searchsorted(t, t1, "left"), len(t) - 1), "right"
        )
        _set_reason(counter_reason, seg_a != seg_b, "window spans more than one segment")
        chit = series.counter_invalid.overlapping(t0, t1)
        if len(series.counter_invalid):
            texts = np.where(chit >= 0, series.counter_invalid.reason[np.maximum(chit, 0)], "")
            _set_reason(counter_reason, chit >= 0, np.asarray(texts, dtype=object))
        counter = counter_energy_j(t, series.energy_j, t0, t1)
        _set_reason(counter_reason, np.isnan(counter), "energy_j missing")
        counter[counter_reason != ""] = np.nan
    return WindowEnergy(energy, counter, n_samples.astype(np.int64), reason, counter_reason)


# --------------------------------------------------------------------------- clock mapping
@dataclass(frozen=True)
class ClockMap:
    """Local (inference host) monotonic ns → meter monotonic ns.

    basis: "clock_sync" (offsets measured by the run, drift interpolated linearly between sync
    points and held constant outside them), "same_host" (equal boot ids: one monotonic clock,
    offset exactly 0) or "none" (no usable offset: the run is flagged and not measured).
    """

    basis: str
    sync_local_ns: np.ndarray
    sync_offset_ns: np.ndarray
    uncertainty_ns: float
    note: str

    @property
    def usable(self) -> bool:
        return self.basis != "none"

    @property
    def drift_ppm(self) -> float:
        """Slope of the offset between the first and last sync points, ppm (NaN if < 2)."""
        if len(self.sync_local_ns) < 2:
            return float("nan")
        span = float(self.sync_local_ns[-1] - self.sync_local_ns[0])
        return float(self.sync_offset_ns[-1] - self.sync_offset_ns[0]) / span * 1e6

    def to_meter(self, t_local_ns: np.ndarray) -> np.ndarray:
        """Map local times to the meter clock (int64 ns); refuses when no offset is known."""
        t = np.asarray(t_local_ns, dtype=np.int64)
        if self.basis == "none":
            raise ValueError(f"no usable clock offset: {self.note}")
        if self.basis == "same_host":
            return t.copy()
        xs, os_ = self.sync_local_ns, self.sync_offset_ns
        if len(xs) == 1:
            return t + os_[0]
        k = np.clip(np.searchsorted(xs, t, side="right") - 1, 0, len(xs) - 2)
        span = (xs[k + 1] - xs[k]).astype(np.float64)
        frac = np.clip((t - xs[k]).astype(np.float64) / span, 0.0, 1.0)
        step = np.rint((os_[k + 1] - os_[k]).astype(np.float64) * frac).astype(np.int64)
        return t + os_[k] + step

    @staticmethod
    def from_run(
        clock_sync: Sequence[dict], run_boot_id: str | None, trace_boot_id: str | None
    ) -> ClockMap:
        """Build the map from run.json's `clock_sync` list and the two machines' boot ids.

        Measured offsets win when present; equal boot ids give the same-host exception;
        otherwise the map is flagged unusable (never silently zero).
        """
        rows = []
        for entry in clock_sync:
            off, unc, t_loc = (entry.get(k) for k in ("offset_ns", "uncertainty_ns",
                                                       "t_local_mono_ns"))
            if off is None or t_loc is None:
                continue
            rows.append((int(t_loc), int(off), float(unc) if unc is not None else float("nan")))
        if rows:
            rows.sort()
            xs = np.array([r[0] for r in rows], dtype=np.int64)
            os_ = np.array([r[1] for r in rows], dtype=np.int64)
            unc = np.array([r[2] for r in rows])
            # Several syncs at one local time: keep their mean offset.
            ux, inv = np.unique(xs, return_inverse=True)
            if len(ux) < len(xs):
                sums = np.bincount(inv, weights=os_.astype(np.float64))
                os_ = np.rint(sums / np.bincount(inv)).astype(np.int64)
                xs = ux
            u = float(np.nanmax(unc)) if np.isfinite(unc).any() else float("nan")
            whens = ", ".join(str(e.get("when", "?")) for e in clock_sync
                              if e.get("offset_ns") is not None)
            note = f"measured offsets at {len(xs)} point(s) ({whens})"
            if len(xs) == 1:
                note += "; single sync point: drift not corrected"
            return ClockMap("clock_sync", xs, os_, u, note)
        if run_boot_id and trace_boot_id and run_boot_id == trace_boot_id:
            return ClockMap(
                "same_host", np.zeros(0, np.int64), np.zeros(0, np.int64), 0.0,
                "same host (equal boot_id): token log and meter share one monotonic clock",
            )
        return ClockMap(
            "none", np.zeros(0, np.int64), np.zeros(0, np.int64), float("nan"),
            "run.json clock_sync has no usable offset and the boot ids differ",
        )
